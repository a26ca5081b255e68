"""
Question: the reversal curse (claim X4). Trained on "A is B" in one direction only, which objectives can answer
"B is ?", and does that depend on scale, or on which tokens each objective predicts from which?

    python experiments/reversal.py --jobs=2      # 7 models x 3 seeds at equal FLOPs, two runs at a time: 11 minutes
                                                 # measured on 2 cores (21 minutes of training; without --jobs, one
                                                 # run after another) -> results/structural/reversal-cpu.{md,json}
    python experiments/reversal.py --models=gpt,bert,diffusion --jobs=2   # the curse and its escape alone
                                                 # -> reversal-cpu-gpt-bert-diffusion.{md,json}
    python experiments/reversal.py --models=t5,t5-ul2 --budget=4    # the models that fail the positive control at
                                                 # 4 x the budget -> reversal-cpu-t5-t5-ul2-x4.{md,json}
    python experiments/reversal.py --scale=gpu   # more entities, a larger model
    python experiments/reversal.py --quick       # a smoke run in seconds (the test suite runs it) -> out-quick/

The task, in characters (Kitouni et al. 2024's key-value retrieval, in miniature: their keys and values are two
tokens each). N entities, each a unique key of lowercase letters and a unique value of capitals (disjoint
alphabets; two letters each at CPU scale). The training text states every fact once per repetition, in one
direction only, `kx:MZ`; for a training half of the entities it also holds their forward and backward questions,
`>kx:MZ` ("the value of kx is MZ") and `<MZ:kx` ("the key of MZ is kx"), so every model learns the two question
formats. The evaluation half's facts are in the training text too, but never a question about them: evaluation
asks their forward question `>kx:` and their backward question `<MZ:` (exact match of the answer). Bidirectional
models are also asked the fact's own line with the key masked, `??:MZ` (the infill layout: B is known, fill in A;
Kitouni et al.'s way of asking MLM-U). Every question is asked between other facts, two lines before it and one
after, as a line stands in a training window. Tested: keys and values unique, no evaluation question in the
training text, no question among its own entity's facts, the evaluation reads exactly the answer slots.

Every objective the project has trains on the same text at equal training FLOPs (experiments/equal_compute.py's
train_all): gpt (clm), gpt on the text plus a token-reversed copy of every line (Kitouni et al.'s "AR w/
reverse"), bert (mlm, 15%), masked diffusion (bert, the rate drawn uniformly: Kitouni et al.'s MLM-U), prefixlm
(prefix LM), t5 (span corruption) and t5 (UL2). Each answers as it can (experiments/structural.py): left to right
for the causal ones, unmasking the answer slots for bert and diffusion, a sentinel for t5.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/reversal.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np

import objectives
from experiments.equal_compute import resolve_experiment, train_and_evaluate_seeds
from experiments.structural import (char_dataset, compared_models, exact_and_per_character, fill_slots, result_name,
                                    mode_of, run_record, select, time_spent, write_seeds)
from experiments.study_report import plus_minus
from infra.configurator import QUICK_NOTE, run_main
from infra.dataset import load_dataset
from infra.progress import format_flops

DEFAULTS = dict(scale="cpu", quick=False, device="auto", out_dir="results/structural", seed=1337, quiet=True,
                reuse=False,  # True: load the runs finished earlier with the same settings
                jobs=1,  # how many runs train at once (processes, one per core)
                models="all", budget=1.0)  # some models only (comma-separated), at a multiple of the FLOPs budget
SCALES = {  # model size and the FLOPs budget (as gpt iterations); entities (half asked in evaluation) of `length`
    "cpu": dict(n_layer=2, n_head=4, n_embd=64, block_size=32, batch_size=24, gpt_iters=4000, eval_iters=10,
                entities=40, length=2, repetitions=200, seeds=3),
    "gpu": dict(n_layer=6, n_head=6, n_embd=384, block_size=64, batch_size=64, gpt_iters=10000, eval_iters=50,
                entities=1000, length=4, repetitions=100, seeds=3),
    "gpu-short": dict(n_layer=6, n_head=6, n_embd=384, block_size=64, batch_size=64, gpt_iters=2500, eval_iters=50,
                entities=1000, length=4, repetitions=100, seeds=1),  # experiments/gpu_figures.py: one seed, a quarter of the budget
    "quick": dict(n_layer=1, n_head=2, n_embd=32, block_size=32, batch_size=4, gpt_iters=10, eval_iters=2,
                  entities=20, length=2, repetitions=4, seeds=1),
}
KEY_LETTERS, VALUE_LETTERS = "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CHARACTERS = KEY_LETTERS + VALUE_LETTERS + ":<>?\n"
MODEL_NAMES = ("gpt", "gpt-reversed", "bert", "diffusion", "prefixlm", "t5", "t5-ul2")
PUBLISHED = ("Kitouni et al. 2024 (The Factorization Curse, key-value retrieval, Table 5; per-character accuracy, "
             "forward / backward): AR 100 / 0, AR w/ reverse 100 / 0, MLM at 15% 21 / 22, at 40% 17 / 16, at 85% "
             "27 / 28, MLM-U 100 / 100. Berglund et al. 2023: GPT-4 answers 79% of celebrity-parent questions, "
             "33% of the reverse. LLaDA (Nie et al. 2025, 8B masked diffusion), reversal poem completion: 51.8 "
             "forward / 45.6 reversal, GPT-4o 82.7 / 34.3.")


# ----------------------------------------------------------------------------- the task

def make_entities(count, rng, length=2):
    """count (key, value) pairs of `length` letters each: every key and every value unique."""
    def unique(letters):
        seen = set()
        while len(seen) < count:
            seen.add("".join(rng.choice(list(letters), length)))
        return sorted(seen)
    keys, values = unique(KEY_LETTERS), unique(VALUE_LETTERS)
    rng.shuffle(keys)
    rng.shuffle(values)
    return list(zip(keys, values))


def training_lines(entities):
    """(lines of the training text, the evaluation half). Every fact k:v once; the training half's forward and
    backward questions once; the evaluation half: its facts only."""
    half = len(entities) // 2
    train_half, eval_half = entities[:half], entities[half:]
    lines = [f"{k}:{v}" for k, v in entities]
    lines += [f">{k}:{v}" for k, v in train_half] + [f"<{v}:{k}" for k, v in train_half]
    return lines, train_half, eval_half


def stream(lines, repetitions, rng, reversed_copies=False):
    """The training text: the lines `repetitions` times, each repetition shuffled; with reversed_copies each line
    is also there written backwards, character by character (Kitouni et al.'s AR w/ reverse: "dcba:ZYXW")."""
    if reversed_copies:
        lines = lines + [line[::-1] for line in lines]
    out = []
    for _ in range(repetitions):
        out += list(rng.permutation(lines))
    return "\n".join(out) + "\n"


def questions(pairs):
    """Prompts and truths for a list of (key, value): forward, backward and the backward infill of the fact."""
    return {"forward": ([f">{k}:" for k, _ in pairs], [v for _, v in pairs]),
            "backward": ([f"<{v}:" for _, v in pairs], [k for k, _ in pairs]),
            "backward, infill": ([f"{'?' * len(k)}:{v}" for k, v in pairs], [k for k, _ in pairs])}


def slots_of(kind, length):
    """The answer's positions in the question: the key's in the infill layout, after ">k:" / "<v:" otherwise."""
    return list(range(length)) if kind == "backward, infill" else list(range(length + 2, 2 * length + 2))


def surroundings(pairs, entities, seed, before=2, after=1):
    """Where each question is asked: between other facts (never its own entity's), `before` lines ahead of it and
    `after` behind it, so that it reads like a line of a training window, which always has lines around it (a
    bidirectional reader trained on windows has never seen a line alone). Returns (texts before, texts after)."""
    rng = np.random.default_rng(seed)
    ahead, behind = [], []
    for pair in pairs:
        others = [f"{k}:{v}" for k, v in entities if (k, v) != pair]
        chosen = [others[i] for i in rng.choice(len(others), before + after, replace=False)]
        ahead.append("".join(line + "\n" for line in chosen[:before]))
        behind.append("".join("\n" + line for line in chosen[before:]) + "\n")
    return ahead, behind


def asked(kind, pairs, entities, seed):
    """The questions of one kind as the models read them: (prompts in their surroundings, answer slots, what
    follows the slots, truths)."""
    prompts, truths = questions(pairs)[kind]
    ahead, behind = surroundings(pairs, entities, seed)
    slots = [len(ahead[0]) + slot for slot in slots_of(kind, len(pairs[0][0]))]
    return [a + p for a, p in zip(ahead, prompts)], slots, behind, truths


def evaluate(model, pairs, entities, specials, stoi, seed=0, mode=None):
    """{question kind: (exact, per-character)} for one model on (key, value) pairs; a kind the architecture
    cannot be asked is absent. mode: UL2's mode token for a t5 trained with it (structural.fill_slots)."""
    result = {}
    for kind in questions(pairs[:1]):
        prompts, slots, behind, truths = asked(kind, pairs, entities, seed)
        answers = fill_slots(model, prompts, slots, specials, stoi, after=behind, mode=mode)
        if answers is not None:
            result[kind] = exact_and_per_character(answers, truths)
    return result


def rule_baselines(entities, eval_half):
    """What rules that read the training lines get, under the same scoring. A left-to-right reader (the answer is
    what most often follows the longest end of the prompt that occurs in the training lines: what next-token
    statistics can find); a lookup of the facts that reads them both ways; chance (a random key or value)."""
    lines, _, _ = training_lines(entities)
    length = len(entities[0][0])
    follows = {}
    for line in lines:
        for start in range(len(line)):
            for end in range(start + 1, len(line) - length + 1):
                counts = follows.setdefault(line[start:end], {})
                counts[line[end:end + length]] = counts.get(line[end:end + length], 0) + 1
    key_of, value_of = {v: k for k, v in entities}, dict(entities)

    def left_to_right(prompt):
        for start in range(len(prompt)):
            if prompt[start:] in follows:
                counts = follows[prompt[start:]]
                return max(sorted(counts), key=counts.get)
        return ""

    out = {"left-to-right reader of the text": {}, "lookup of the facts both ways": {},
           "chance (a random key or value)": {}}
    for kind, (prompts, truths) in questions(eval_half).items():
        if kind != "backward, infill":  # a left-to-right reader cannot fill slots at the start of its input
            out["left-to-right reader of the text"][kind] = exact_and_per_character(map(left_to_right, prompts), truths)
        asked = [p[-length:] if kind == "backward, infill" else p[1:1 + length] for p in prompts]
        lookup = value_of if kind == "forward" else key_of
        out["lookup of the facts both ways"][kind] = exact_and_per_character([lookup[a] for a in asked], truths)
        out["chance (a random key or value)"][kind] = (1 / len(entities), 1 / 26)
    return out


def prepare_task(seed, scale, work):
    """The task of `seed` at `scale`, its two training texts written as datasets under `work` (left alone if they
    hold the same): (entities, training half, evaluation half, stoi, {"data" | "data-reversed": dataset folder})."""
    s = SCALES[scale]
    rng = np.random.default_rng(seed)
    entities = make_entities(s["entities"], rng, s["length"])
    lines, train_half, eval_half = training_lines(entities)
    folders = {}
    for variant, reversed_copies in (("data", False), ("data-reversed", True)):
        val = stream(lines, 1, np.random.default_rng(seed + 1), reversed_copies)
        folders[variant] = os.path.join(work, variant)
        stoi = char_dataset(folders[variant], stream(lines, s["repetitions"], rng, reversed_copies), val, CHARACTERS)
    return entities, train_half, eval_half, stoi, folders


def score(result, entities, train_half, eval_half, specials, stoi):
    """One trained model's answers (train_all's summary): the evaluation half's questions, and, as a control, the
    training half's backward questions."""
    mode = mode_of(result, specials)
    return {"eval": evaluate(result["model"].eval(), eval_half, entities, specials, stoi, mode=mode),
            "train_half_backward": evaluate(result["model"], train_half, entities, specials, stoi, mode=mode)["backward"]}


KINDS = ("forward", "backward", "backward, infill", "training half, backward")  # a row's columns


def cells(runs):
    """A row's cells over seeds (runs: score's records): exact match mean +- std (per character in brackets) for each
    of KINDS, "-" for a kind the model cannot be asked."""
    out = []
    for kind in KINDS:
        scores = [r["train_half_backward"] if kind == KINDS[-1] else r["eval"].get(kind) for r in runs]
        out.append("-" if scores[0] is None else f"{plus_minus([e for e, _ in scores], 1, percent=True)} "
                                                 f"({plus_minus([c for _, c in scores], 0, percent=True)})")
    return out


def learned(runs):
    """The positive control of one row: the forward questions (the direction the text states) answered exactly in at
    least 90% of cases in every seed, so that the task was learnable at this budget."""
    return all(r["eval"]["forward"][0] >= 0.9 for r in runs)


def rule_rows(baselines, columns_after):
    """The rules' rows of a table whose columns are KINDS' first three, then `columns_after` more."""
    return [f"| (rule) {rule} | " + " | ".join(f"{100 * scores[k][0]:.1f}% ({100 * scores[k][1]:.0f}%)" if k in scores
                                              else "-" for k in KINDS[:3]) + " |" + " |" * columns_after
            for rule, scores in baselines.items()]


# ----------------------------------------------------------------------------- the experiment

def report(data, s, scale):
    lines = [QUICK_NOTE, ""] if scale == "quick" else []
    if data.get("interrupted"):
        lines += [f"**Interrupted: {len(data['runs'])} of {s['seeds']} seeds finished.**", ""]
    lines += [f"The reversal curse (claim X4), scale `{scale}` ({s['n_layer']} layers x {s['n_embd']} dims, block "
              f"{s['block_size']}; t5 {s['n_layer'] // 2 or 1} + {s['n_layer'] // 2 or 1}), {s['entities']} entities "
              f"(half asked), each training text {s['repetitions']} shuffled repetitions of its lines, "
              f"{format_flops(data['budget_flops'] * data.get('budget_multiple', 1))} per model (= "
              f"{s['gpt_iters'] * data.get('budget_multiple', 1):g} gpt iterations), "
              f"{len(data['seeds'])} seeds ({', '.join(map(str, data['seeds']))}), on {data['machine']}, "
              f"{time_spent(data)}. Exact match of the {s['length']}-character answer on the evaluation half's "
              f"questions, mean +- std over seeds (in brackets: per-character accuracy, the published tables' "
              f"measure). 'backward, infill': the fact's line with its key masked (bidirectional readers only). "
              f"The training half's backward questions are in the training text (a control: the format is "
              f"learnable).", "",
              "| model | forward | backward | backward, infill | training half, backward | val loss (own objective) |",
              "|---|---|---|---|---|---|"]
    for name in MODEL_NAMES:
        runs = [run["models"][name] for run in data["runs"] if name in run["models"]]
        if runs:
            lines.append(f"| {name} | " + " | ".join(cells(runs) + [plus_minus([r["val_loss"] for r in runs], 3)])
                         + " |")
    lines += rule_rows(data["baselines"], 2)
    control = [name for name in MODEL_NAMES
               if not learned([run["models"][name] for run in data["runs"] if name in run["models"]])]
    lines += ["", "Positive control (the task is learnable at this budget: forward >= 90% in every seed): "
              + ("passed by every model." if not control else f"**not passed by {', '.join(control)}**: the budget "
                                                              f"is too small for them, and their rows decide nothing.")]
    lines += ["", f"Published: {PUBLISHED}"]
    return "\n".join(lines)


def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES, "reversal", ())  # result_name checks its files
    result = result_name(config, MODEL_NAMES, "reversal", scale, SCALES[scale]["gpt_iters"])
    s = SCALES[scale]
    t0 = time.perf_counter()
    work = os.path.join(config["out_dir"], "checkpoints", f"reversal-{scale}")
    entities, train_half, eval_half, stoi, folders = prepare_task(config["seed"], scale, work)
    _, meta = load_dataset(folders["data"], s["block_size"], prepare_if_missing=False)
    specials = objectives.Specials.from_meta(meta)
    models = compared_models(folders["data-reversed"])

    def evaluate_models(trained):
        return {name: {**run_record(result), **score(result, entities, train_half, eval_half, specials, stoi)}
                for name, result in trained.items()}

    models, checkpoints = select(config, models, work)
    seeds_trained = train_and_evaluate_seeds("reversal", models, s, folders["data"], checkpoints, device, meta, config,
                                             evaluate_models)
    write_seeds(result, config, scale, device, seeds_trained, t0,
                {"baselines": rule_baselines(entities, eval_half), "budget_multiple": config["budget"], "sizes": s},
                lambda data: report(data, s, scale))


if __name__ == "__main__":
    run_main(main, interrupted="the runs finished so far are kept: the same command with --reuse=True goes on "
                              "from them")
