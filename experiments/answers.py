"""
Question: what do the result files say to the checkpoint questions whose answer is a measurement (docs/chapter.md)?
Printed from the files the answers rest on, so a reader holding the chapter sees them in a second:

    python experiments/answers.py     # trains nothing: under a second of reading (0 minutes), from results/

question 3 (B1): labels decided by the right context, causal readers against bidirectional ones (tagging);
question 5 (C2): the [MASK] mismatch, read on inputs without any [MASK] (the study's ablation);
question 10 (E3): retrieval of documents decided by their last line, and the control with it moved first
(encoders). Each block is the result file's own table rows, under the file's name: what it prints is what the
file says, whatever a rerun changed.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANSWERS = [  # question, claim, what it shows, the result file, the text its table follows, the rows shown
    (3, "B1", "per-character labels decided by what follows: a causal reader's own states against readers that "
              "see the right context (balanced accuracy)", "results/structural/tagging-cpu.md",
     "| reader | mode |", ("| gpt (states) | full", "| gpt (echo) | full", "| bert (states) | full",
                           "| prefixlm (states) | full", "| (rule)")),
    (5, "C2", "inputs with no [MASK] at all (as at fine-tuning): a new linear head on each model's frozen states",
     "results/study/study-cpu.md", "The measurement: a new linear head", ("| bert |", "| bert-100%-mask |",
                                                                          "| bert at initialisation |",
                                                                          "| (rule)")),
    (10, "E3", "retrieval of documents whose last line decides what they are about; the last column moves that "
               "line first (the mechanism's control)", "results/structural/encoders-cpu.md",
     "## 2. Bi-encoder retrieval", ("| gpt (mean)", "| gpt (last)", "| gpt (echo)", "| bert (mean)",
                                    "| prefixlm (mean)", "| (rule) n-gram cosine |")),
]


def table_after(path, marker, rows):
    """The header of the first table after `marker` in the file at path, and those of its rows that start with
    one of `rows`."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    if marker not in text:
        return None
    lines = text[text.index(marker):].splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return table[:1] + [line for line in table[2:] if line.startswith(rows)]


def main():
    for number, claim, what, path, marker, rows in ANSWERS:
        print(f"question {number} ({claim}): {what}; from {path}:")
        table = table_after(path, marker, rows) if os.path.exists(os.path.join(ROOT, path)) else None
        print("\n".join(table) if table else f"  (not measured yet: {path} is missing or holds no such table)")
        print()


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    from infra.configurator import run_demo  # --help, stray arguments, | head: as the chapter's demos
    run_demo(main)
