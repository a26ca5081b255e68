"""The exercises never rot: every exercise listed in exercises/README.md has a check that fails on the untouched
tree, for the reason the handout gives (the feature is missing), and passes once its reference solution
(exercises/solutions/N.patch) is applied with `git apply` to a copy of the tree. The checks themselves are not
part of the suite (on the untouched tree they are meant to fail): this test runs them as a reader would."""
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import HANG_TIMEOUT, ROOT

pytestmark = pytest.mark.slow  # each check applies a patch and runs the changed code: the end-to-end tier

FOLDER = os.path.join(ROOT, "exercises")
SKIP = ("results", "docs", ".git", "__pycache__", ".pytest_cache")  # what no check reads


def listed():
    """The exercise numbers of the index's table, in order: rows `| N | ...`."""
    text = open(os.path.join(FOLDER, "README.md"), encoding="utf-8").read()
    return [int(n) for n in re.findall(r"^\| *([0-9]+) *\|", text, flags=re.M)]


def copy_of_the_tree(destination):
    """The project as a reader's fork has it, without results and docs (no check reads them) or run outputs."""
    def ignored(folder, names):
        top = os.path.relpath(folder, ROOT) == "."
        return [n for n in names if n in SKIP or (top and n.startswith("out")) or n.endswith((".bin", ".pkl"))]
    shutil.copytree(ROOT, destination, ignore=ignored)


def check(tree, number):
    result = subprocess.run([sys.executable, os.path.join(tree, "exercises", "check.py"), str(number)],
                            capture_output=True, text=True, cwd=tree, timeout=HANG_TIMEOUT)
    return result.returncode, (result.stdout + result.stderr).strip()


def solve(number, base):
    """Apply solution N to a fresh copy of the tree and run its check there: (status, output, patch output)."""
    tree = os.path.join(base, f"tree-{number}")
    copy_of_the_tree(tree)
    patch = os.path.join(FOLDER, "solutions", f"{number}.patch")
    applied = subprocess.run(["git", "apply", patch], capture_output=True, text=True, cwd=tree)
    if applied.returncode:
        return None, "", applied.stderr.strip()
    return (*check(tree, number), "")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every check on the untouched tree (one process), then each solved in its own copy (two at a time)."""
    numbers = listed()
    untouched = subprocess.run([sys.executable, os.path.join(FOLDER, "check.py"), *map(str, numbers)],
                               capture_output=True, text=True, cwd=ROOT, timeout=HANG_TIMEOUT)
    base = str(tmp_path_factory.mktemp("exercises"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        solved = dict(zip(numbers, pool.map(lambda n: solve(n, base), numbers)))
    return untouched, solved


def test_the_index_lists_every_check_a_handout_and_a_solution_each():
    sys.path.insert(0, FOLDER)
    try:
        import check as checks
    finally:
        sys.path.remove(FOLDER)
    numbers = listed()
    assert numbers == sorted(checks.CHECKS) and len(numbers) >= 12
    handouts = sorted(name for name in os.listdir(FOLDER) if re.match(r"[0-9]{2}-.*\.md$", name))
    assert [int(name[:2]) for name in handouts] == numbers
    for name in handouts:
        text = open(os.path.join(FOLDER, name), encoding="utf-8").read()
        number = int(name[:2])
        for needle in (f"python exercises/check.py {number}", f"exercises/solutions/{number}.patch", "Claim",
                       "## What we measured"):
            assert needle in text, (name, needle)
        assert os.path.isfile(os.path.join(FOLDER, "solutions", f"{number}.patch")), number


def test_every_check_fails_on_the_untouched_tree_in_one_line_each(outcomes):
    untouched, _ = outcomes
    lines = untouched.stdout.strip().splitlines()
    assert untouched.returncode == 1 and "Traceback" not in untouched.stderr, untouched.stderr[-2000:]
    assert len(lines) == len(listed()) and all(": not solved: " in line for line in lines), lines


@pytest.mark.parametrize("number", listed())
def test_the_reference_solution_solves_it(outcomes, number):
    status, output, patch_error = outcomes[1][number]
    assert not patch_error, f"exercises/solutions/{number}.patch no longer applies: {patch_error}"
    assert status == 0 and output.endswith("solved"), output[-2000:]


def test_half_of_a_solution_is_not_solved(tmp_path):
    """Exercise 10 asks for the switch in train.py and its refusals in infra/train_config.py: train.py's half alone
    (the refusals missing: a bad --switch_to would be a traceback later) is not solved."""
    tree = str(tmp_path / "tree")
    copy_of_the_tree(tree)
    with open(os.path.join(FOLDER, "solutions", "10.patch"), encoding="utf-8") as f:
        halves = re.split(r"(?=^diff --git )", f.read(), flags=re.M)
    half = tmp_path / "train-half.patch"
    half.write_text("".join(h for h in halves if h.startswith("diff --git a/train.py")), encoding="utf-8")
    assert subprocess.run(["git", "apply", str(half)], cwd=tree).returncode == 0
    status, output = check(tree, 10)
    assert status == 1 and "not solved: train.py accepts --switch_to=bert:mlm" in output, output


def test_a_half_done_exercise_is_told_in_words(monkeypatch):
    """Exercise 5 with rclm registered as an objective of gpt but no function making its batch: the check says
    what is missing, not a bare KeyError."""
    sys.path.insert(0, FOLDER)
    try:
        import check as checks
    finally:
        sys.path.remove(FOLDER)
    import objectives
    monkeypatch.setitem(objectives.OBJECTIVES_FOR_ARCH, "gpt", ("clm", "rclm"))
    with pytest.raises(checks.Unsolved, match="BATCH_MAKERS has no function that makes its batch"):
        checks.check_5()
