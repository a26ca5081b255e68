"""docs/chapter.md, the guide a reader keeps beside the chapter: every section and checkpoint question is there,
each question's command (parsed from the guide itself, so the guide cannot rot) prints what the guide says, and
the figures it quotes are in the result files it links."""
import os
import re
import subprocess
import sys

from conftest import ROOT

GUIDE = os.path.join(ROOT, "docs", "chapter.md")
SECTIONS = ("一", "二", "三", "四", "五", "六")


def guide():
    return open(GUIDE, encoding="utf-8").read()


def questions():
    """{number: (heading and text, [(command, [expected lines])])} of the ten checkpoint questions."""
    part = guide().split("## 十个检查点", 1)[1]
    found = {}
    for block in re.split(r"^### ", part, flags=re.M)[1:]:
        number = int(block.split("·", 1)[0])
        commands = []
        for line in block.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:].strip(), []))
            elif line.startswith("> "):
                commands[-1][1].append(line[2:])
        found[number] = (block, commands)
    return found


def test_every_section_and_reason_maps_to_code_and_a_claim():
    sections = guide().split("## 十个检查点", 1)[0]
    for key in [f"### {s} " for s in SECTIONS] + [f"理由 {n} " for n in range(1, 6)]:
        assert key in sections, key
        start = sections.index(key)
        text = sections[start:].split("\n### ", 1)[0] if key.startswith("###") else \
            sections[start:].split("\n- ", 1)[0]  # a reason: its own bullet
        assert re.search(r"\b[A-FX][0-9]\b", text), key  # a claim id
        if key not in ("### 六 ", "### 五 "):  # 六 is the ranking of the others; 五's E1 is history
            assert re.search(r"`[\w./]+(\.py)?`|\.py", text), key  # a file or a function to read


def test_the_ten_questions_each_have_a_command_that_prints_what_the_guide_says():
    found = questions()
    assert sorted(found) == list(range(1, 11))
    outputs = {}
    for number, (text, commands) in sorted(found.items()):
        if number == 7:  # D2: nothing runs at this scale, and the guide says so instead of a command
            assert not commands and "no command" in text and "not at this scale" in text
            continue
        assert commands, f"question {number} has no command"
        for command, expected in commands:
            assert expected, f"question {number}: {command} says nothing about its output"
            program = command.split()
            assert program[0] == "python" and len(program) == 2 and program[1].endswith(".py"), command
            if command not in outputs:  # seconds each, no training run beforehand
                result = subprocess.run([sys.executable, program[1]], cwd=ROOT, capture_output=True, text=True,
                                        timeout=120)
                assert result.returncode == 0, (command, result.stderr[-500:])
                outputs[command] = result.stdout
            for line in expected:
                assert line in outputs[command], (number, command, line)


def test_the_readme_sends_a_chapter_reader_to_the_guide():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    first_screen = readme[:2500]
    assert "docs/chapter.md" in first_screen and "章节" in first_screen


def test_every_figure_of_the_guide_is_in_the_result_file_its_line_links():
    """A line of the guide that links a result file quotes only numbers (with a decimal point) that the file
    holds, whole and to its digits, as the README's table does."""
    missing = []
    for line in guide().splitlines():
        links = [link for link in re.findall(r"\]\(\.\./(results/[^)]+)\)", line) if not link.endswith(".png")]
        if not links:
            continue
        files = "".join(open(os.path.join(ROOT, link), encoding="utf-8").read() for link in links)
        files = files.replace(" ± ", " +- ").replace("%", "")
        for number in re.findall(r"\d+\.\d+", line):
            if not re.search(r"(?<![\d.])" + re.escape(number) + r"(?![\d]|\.\d|e[-+]?\d)", files):
                missing.append(f"{number} in: {line[:80]}")
    assert not missing, missing


def test_every_exercise_is_linked_from_the_section_it_belongs_to():
    """Each handout is linked from a section of the guide (一 to 六), in an item that names the claim it is about."""
    text = open(GUIDE, encoding="utf-8").read()
    items = re.split(r"\n(?=- |### )", text.split("## 十个检查点")[0])  # the sections' bullet items
    handouts = sorted(f for f in os.listdir(os.path.join(ROOT, "exercises")) if re.match(r"\d\d-.*\.md$", f))
    assert len(handouts) >= 12
    for handout in handouts:
        claim = re.search(r"Claim ([A-FX]\d)", open(os.path.join(ROOT, "exercises", handout), encoding="utf-8").read())
        homes = [item for item in items if f"../exercises/{handout}" in item]
        assert homes, f"{handout} is linked from no section of the guide"
        assert claim and any(claim.group(1) in item for item in homes), (handout, claim)
