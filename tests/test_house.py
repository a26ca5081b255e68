"""The house: what a reader finds at the top, which way the imports point, and the docs every claim id leads to."""
import ast
import os
import re
import subprocess

import pytest

from conftest import ROOT, run_script

CHAPTER = ["masks.py", "model.py", "objectives.py", "train.py", "kvcache.py", "sample.py", "bench.py"]
TOP_LEVEL = set(CHAPTER) | {"README.md", "README_en.md", "requirements.txt", "config", "data", "tests", "infra", "experiments",
                            "results", "docs", "exercises"}
COMMANDS = ("train", "sample", "bench")  # scripts: only experiments (and tests) may import them


def tracked_files():
    """The files a clone holds: git's list where there is a repository, else every file under the root."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return [f for f in listed.splitlines() if os.path.exists(os.path.join(ROOT, f))]
    except (OSError, subprocess.CalledProcessError):
        return [os.path.relpath(os.path.join(d, f), ROOT) for d, _, files in os.walk(ROOT) for f in files
                if ".git" not in d and "__pycache__" not in d]


def project_modules():
    """{module name: path} of every Python file of the project outside tests/ (e.g. infra.checkpoint)."""
    found = {}
    for path in tracked_files():
        if path.endswith(".py") and not path.startswith(("tests/", "exercises/solutions/")):
            found[path[:-3].replace("/", ".")] = path
    return found


def imports_of(path, modules):
    """Project modules imported anywhere in a file, function bodies (lazy imports) included."""
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read())
    found = set()
    package = path.rsplit("/", 1)[0].replace("/", ".") if "/" in path else ""
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            for candidate in (name, f"{package}.{name}" if package else name):
                if candidate in modules:
                    found.add(candidate)
    return found


def import_graph():
    modules = project_modules()
    return {module: imports_of(path, modules) - {module} for module, path in modules.items()}


def test_the_top_level_is_the_chapter_and_a_few_folders():
    entries = {name for name in os.listdir(ROOT) if not name.startswith(".") and name not in ("__pycache__",)}
    tracked_top = {path.split("/")[0] for path in tracked_files()}
    assert tracked_top - {".ci", ".gitignore"} <= TOP_LEVEL, sorted(tracked_top - TOP_LEVEL)
    assert set(CHAPTER) <= entries and len(tracked_top - {".ci", ".gitignore"}) <= len(TOP_LEVEL)


def test_no_import_circle_anywhere_lazy_imports_included():
    graph = import_graph()
    state = {}

    def visit(module, path):
        state[module] = "open"
        for other in sorted(graph[module]):
            if state.get(other) == "open":
                cycle = path[path.index(other):] + [other]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if other not in state:
                visit(other, path + [other])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_arrows_point_down():
    """Experiments use the chapter and the infrastructure; the commands (train, sample, bench) are imported by
    experiments (and the exercises' checks) only, except that bench, the last chapter file, measures sample's
    samplers; the infrastructure imports no command and no experiment; nothing imports an experiment but another
    experiment or an exercise's check; nothing imports the checks. The measurement scripts of results/logs sit on
    top, as the experiments do (compiled_rows.py times sample.generate itself)."""
    for module, imported in import_graph().items():
        experiments = {m for m in imported if m.startswith("experiments.")}
        commands = {m for m in imported if m in COMMANDS} - ({"sample"} if module == "bench" else set())
        assert not {m for m in imported if m.startswith("exercises.")}, module
        if not module.startswith(("experiments.", "exercises.", "results.")):  # the checks sit on top, as the tests do
            assert not experiments, (module, experiments)
            assert not commands, (module, commands)


READMES = {"README.md": ("## 快速上手", "## 代码阅读顺序", "## 结果一览"),  # the same page in both languages
           "README_en.md": ("## Quick start", "## Read the code in this order", "## Results at a glance")}


def readme(name):
    return open(os.path.join(ROOT, name), encoding="utf-8").read()


def prose(text):
    """A page without its code blocks: what a reader reads as text."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


@pytest.mark.parametrize("name", READMES)
def test_the_readme_reads_in_three_minutes(name):
    """The front door: its sections in order, at most about 900 English words (1,800 Chinese characters) outside
    code, no paragraph over 120 words (240 characters), no table cell over 25 words (50 characters)."""
    text = readme(name)
    places = [text.index(heading) for heading in READMES[name]]
    assert places == sorted(places)
    words = lambda t: len(re.findall(r"[\u4e00-\u9fff]", t)) / 2 + len(re.findall(r"[A-Za-z0-9][\w.+-]*", t))  # noqa
    assert words(prose(text)) <= 900, words(prose(text))
    paragraphs = [p for p in prose(text).split("\n\n") if p.strip() and not p.lstrip().startswith("|")]
    assert max(words(p) for p in paragraphs) <= 120, max(paragraphs, key=words)[:200]
    cells = [c for line in text.splitlines() if line.startswith("|") for c in line.strip("|").split("|")]
    assert max(words(c) for c in cells) <= 25, max(cells, key=words)


def test_both_readmes_give_the_same_commands_links_and_pictures_and_each_link_resolves():
    """README.md (Chinese) and README_en.md are one page in two languages: the same code blocks' commands, the same
    relative links and images, in the same order; every one of them names a file of the tree."""
    pages = {name: readme(name) for name in READMES}
    commands = {name: [line.split("  #")[0].strip() for block in re.findall(r"```\n(.*?)```", text, flags=re.S)
                       for line in block.splitlines() if line.startswith(("python", "pip"))]
                for name, text in pages.items()}
    links = {name: [link for link in re.findall(r"\]\(([^)#]+)\)", text) if "://" not in link]
             for name, text in pages.items()}
    assert commands["README.md"] == commands["README_en.md"] and len(commands["README.md"]) >= 8
    assert [link for link in links["README.md"] if link != "README_en.md"] == \
        [link for link in links["README_en.md"] if link != "README.md"]
    for name, found in links.items():
        missing = [link for link in found if not os.path.exists(os.path.join(ROOT, link))]
        assert not missing, (name, missing)
    assert "![" in pages["README.md"] and pages["README.md"].count("![") == pages["README_en.md"].count("![")


def test_every_cited_claim_id_is_in_the_claims_file():
    claims = open(os.path.join(ROOT, "docs", "claims.md"), encoding="utf-8").read()
    documented = set(re.findall(r"^\| \*\*([A-GX][0-9])\*\* \|", claims, flags=re.M))
    cited = set()
    for path in tracked_files():
        if path.endswith((".py", ".md")) and not path.startswith("results/"):
            text = open(os.path.join(ROOT, path), encoding="utf-8").read()
            cited |= set(re.findall(r"\b(?:claims?|ids?) ([A-GX][0-9])\b", text))
            cited |= {m for group in re.findall(r"\(([A-GX][0-9](?:, [A-GX][0-9])*)\)", text)
                      for m in group.split(", ")}
    assert cited and cited <= documented, sorted(cited - documented)


def test_every_experiment_says_its_question_command_and_result_file():
    folder = os.path.join(ROOT, "experiments")
    listed = open(os.path.join(folder, "README.md"), encoding="utf-8").read()
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        doc = ast.get_docstring(ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())) or ""
        assert f"`experiments/{name}`" in listed, name  # the index names every file, helpers too
        if "python experiments/" in doc:  # an experiment, not a helper of one (its tasks, its report)
            assert doc.startswith("Question:"), name
            assert f"python experiments/{name}" in doc and "results/" in doc and "minutes" in doc.lower(), name


def test_the_tree_speaks_of_the_project_only():
    """No words about how it was made (who worked on it, when, under which ticket), outside the tests."""
    pattern = re.compile(r"\bsessions?\b|\blent\b|\bissue [0-9]+|\(issue", re.IGNORECASE)
    found = []
    for path in tracked_files():
        if path.startswith("tests/") or path.endswith((".png", ".pt", ".bin", ".pkl")):
            continue
        try:
            text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        found += [f"{path}: {line.strip()[:80]}" for line in text.splitlines() if pattern.search(line)]
    assert not found, found[:5]


@pytest.mark.parametrize("name", CHAPTER)
def test_a_chapter_file_fits_a_reader_s_screen(name):
    """Read beside the chapter, in half a laptop screen: no line of a chapter file over 100 characters."""
    with open(os.path.join(ROOT, name)) as f:
        long = [f"{name}:{n}" for n, line in enumerate(f.read().split("\n"), 1) if len(line) > 100]
    assert not long, long[:5]


@pytest.mark.parametrize("module", ["masks", "model", "objectives", "kvcache"])
def test_the_chapter_core_imports_no_infrastructure(module):
    """masks, model, objectives and kvcache are the chapter's ideas: plain torch, readable without the rest."""
    graph = import_graph()
    assert not {m for m in graph[module] if m.startswith(("infra.", "experiments.", "data."))}, graph[module]


def numbers_missing(line, links, folder):
    """The numbers a line quotes (e.g. 6.72x, 2.559 +- 0.021, 49.1 +- 0.5%) that none of its linked result files
    holds whole and to its own digits; small whole numbers are counts and sizes of the setting, not results."""
    files = "".join(open(os.path.join(folder, link), encoding="utf-8").read() for link in links
                    if not link.endswith(".png"))  # (a row's plot beside its table)
    files = files.replace(" ± ", " +- ").replace("%", "")  # "49.1% +- 0.5" and "49.1 +- 0.5%" alike
    missing = []
    for number in re.findall(r"\d+(?:\.\d+)?(?: \+- \d+(?:\.\d+)?)?(?:%|x)?", line):
        if re.fullmatch(r"\d{1,3}", number) and "." not in number:
            continue  # counts and sizes of the setting (16 requests, context 255, 3 TFLOP), not results
        value = number.replace("%", "").rstrip("x")  # whole: "2.2" is not in "12.2", "2.25" nor "2.2e-3"
        if not re.search(r"(?<![\d.])" + re.escape(value) + r"(?![\d]|\.\d|e[-+]?\d)", files):
            missing.append(number)
    return missing


def test_every_headline_number_is_in_its_result_file():
    """The measured table of docs/results.md and the README's results at a glance quote committed results: each
    number of a row or line must appear, whole and to the file's own digits, in the result file it links to."""
    table = readme("docs/results.md").split("## What was measured, at a glance", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "](" in line]
    assert len(rows) >= 8
    missing = []
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        links = re.findall(r"\]\(([^)]+)\)", cells[-1])
        missing += [f"{cells[0]}: {n}" for n in numbers_missing(cells[1], links, os.path.join(ROOT, "docs"))]
    for name, headings in READMES.items():
        glance = readme(name).split(headings[2], 1)[1].split("\n## ", 1)[0]
        findings = [f for f in re.split(r"\n- ", glance) if "](results/" in f]
        assert len(findings) >= 5, name
        for finding in findings:
            links = re.findall(r"\]\((results/[^)]+)\)", finding)
            missing += [f"{name}: {n}" for n in numbers_missing(re.sub(r"\]\([^)]*\)", "]", finding), links, ROOT)]
    assert not missing, missing


def committed_plots():
    return sorted(f for f in tracked_files() if f.startswith("results/") and f.endswith(".png"))


def test_every_committed_plot_is_drawn_from_the_json_beside_it():
    """infra/plots.save stamps a plot with the sha256 of the JSON it was drawn from: a table rerun (its JSON
    rewritten) without its plot redrawn fails here (python experiments/redraw.py redraws them all)."""
    import hashlib
    from infra.plots import stamp
    plots = committed_plots()
    assert plots
    for path in plots:
        full = os.path.join(ROOT, path)
        json_path = full[:-len(".png")] + ".json"  # the digest computed here, not by the code that wrote the stamp
        with open(json_path, "rb") as f:
            name, digest = os.path.basename(json_path), hashlib.sha256(f.read()).hexdigest()
        assert stamp(full) == f"{name} sha256 {digest}", (
            f"{path} was not drawn from the {name} beside it: python experiments/redraw.py {path}")


def test_every_committed_plot_is_shown_where_its_table_is_read():
    """A plot nobody links is a plot nobody sees: each is shown beside its table's words (docs/results.md,
    docs/speed.md), the guide or the README."""
    pages = "".join(open(os.path.join(ROOT, page), encoding="utf-8").read()
                    for page in ("README.md", "docs/results.md", "docs/speed.md", "docs/chapter.md", "docs/code.md"))
    missing = [path for path in committed_plots() if os.path.basename(path) not in pages]
    assert not missing, f"plots linked from no page: {missing}"


def test_redraw_answers_help_and_a_damaged_json_in_one_line(tmp_path):
    """experiments/redraw.py: --help prints its use (status 0, no matplotlib needed); a JSON its plot cannot be
    drawn from is one line and status 2, its PNG left as it was (or, without matplotlib, the one line that says so)."""
    helped = run_script("experiments/redraw.py", "--help")
    assert helped.returncode == 0 and "python experiments/redraw.py" in helped.stdout
    (tmp_path / "study-cpu.json").write_text('{"not": "a study"}')
    (tmp_path / "study-cpu.png").write_bytes(b"old")
    result = run_script("experiments/redraw.py", str(tmp_path / "study-cpu.png"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "cannot be drawn" in result.stderr or "needs matplotlib" in result.stderr
    assert (tmp_path / "study-cpu.png").read_bytes() == b"old"
