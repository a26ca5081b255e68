"""
Question: what do the result files say to the checkpoint questions whose answer is a measurement (docs/chapter.md)?
Printed from the files the answers rest on, so a reader holding the chapter sees them in a second:

    python experiments/answers.py     # trains nothing: under a second of reading (0 minutes), from results/

question 3 (B1, B2): labels decided by the right context, every reader fully fine-tuned and as a frozen probe,
beside the rules (tagging); then B2, one pretraining and a fresh head on few labels, each pretrained reader against
its twin from scratch and the rules, with the effect control (fewlabels);
question 5 (C2): the [MASK] mismatch, read on inputs without any [MASK] (the study's ablation);
question 10 (E3, X1, F3): the chapter's scenarios for an encoder, each with its positive control (encoders):
embedding models (retrieval of documents decided by their last line, and the control with it moved first),
rerankers (a cross-encoder and a bi-encoder reranking the same first-stage lists, near duplicates built for
interaction: rerankers), a judgement on the whole input (do two lines agree? each reader trained until validation
stops improving: encoders' judgement). Each block is the result file's own lines, under the file's name: what it prints is what the file says,
whatever a rerun changed.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAGGING, FEWLABELS = "results/structural/tagging-cpu.md", "results/structural/fewlabels-cpu.md"
STUDY, ENCODERS = "results/study/study-cpu.md", "results/structural/encoders-cpu.md"
RERANKERS, JUDGE = "results/structural/rerankers-cpu.md", "results/structural/encoders-cpu-judge.md"
ANSWERS = [  # question, claims, what it shows, the result file, the text its lines follow, the table's rows shown
    # (None: no table; () every row), the lines after it shown (those starting with one of these)
    (3, "B1", "per-character labels decided by what follows: a causal reader's own states against readers that "
              "see the right context (balanced accuracy; full: fine-tuned, probe: a head on frozen states)",
     TAGGING, "| reader | mode |", (), ("The prefix rule",)),
    (3, "B2", "one pretraining, a fresh head on 1,000 labels (is a word misspelt?): each pretrained reader against "
              "its twin from scratch, the models' own surprise and the rules", FEWLABELS, "| labels | reader |",
     ("| 1000 |", "| - |"), ("**Effect control",)),
    (5, "C2", "inputs with no [MASK] at all (as at fine-tuning): a new linear head on each model's frozen states",
     STUDY, "The measurement: a new linear head", ("| bert |", "| bert-100%-mask |", "| bert at initialisation |",
                                                   "| (rule)"), ()),
    (10, "E3", "retrieval of documents whose last line decides what they are about; the last column moves that "
               "line first (the mechanism's control). The embedding-model scenario", ENCODERS,
     "## 2. Bi-encoder retrieval", ("| gpt (mean)", "| gpt (last)", "| gpt (echo)", "| bert (mean)",
                                    "| prefixlm (mean)", "| (rule) n-gram cosine |"), ("Positive control",)),
    (10, "X1", "the reranker scenario: a cross-encoder and a bi-encoder rerank the same first-stage lists, each "
               "trained on the same examples until validation stops improving; near duplicates, built for "
               "interaction", RERANKERS, "## near duplicates", (), ("- ", "**Effect control")),
    (10, "F3", "a judgement on the whole input: do the two lines agree? each reader trained until validation "
               "stops improving", JUDGE, "## 3. A whole-input judgement", (), ("Positive control",)),
]


def lines_after(path, marker, rows, notes):
    """From the file at path, after `marker` and before the next heading: the header of the first table and
    those of its rows that start with one of `rows` (every row for (); no table for None), then the lines that
    start with one of `notes`. None when the marker is not in the file."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    if marker not in text:
        return None
    lines = text[text.index(marker):].split("\n## ", 1)[0].splitlines()
    shown = []
    if rows is not None:
        start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
        table = []
        for line in lines[start:]:
            if not line.startswith("|"):
                break
            table.append(line)
        shown = table[:1] + [line for line in table[2:] if line.startswith(rows or "|")]
    return shown + [line for line in lines if notes and line.startswith(notes)]


def main():
    for number, claim, what, path, marker, rows, notes in ANSWERS:
        print(f"question {number} ({claim}): {what}; from {path}:")
        found = lines_after(path, marker, rows, notes) if os.path.exists(os.path.join(ROOT, path)) else None
        print("\n".join(found) if found else f"  (not measured yet: {path} is missing or holds no such lines)")
        print()


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    from infra.configurator import run_demo  # --help, stray arguments, | head: as the chapter's demos
    run_demo(main)
