"""
Question: in-context learning in miniature (claims C5 and X3): can a model learn a mapping it has never seen
from k demonstrations in its input, and does that need a left-to-right decoder?

    python experiments/incontext.py --jobs=2 --sweep_only=True   # gpt's sweep alone -> incontext-cpu-sweep.*:
                    # 115.5 minutes of training summed, about 70 on the clock (two runs at a time, 2 cores)
    python experiments/incontext.py --jobs=2 --sweep_from=results/study/incontext-cpu-sweep.json
                    # gpt's sweep read from its file, then bert, prefixlm and t5 at the budget found (9 runs at
                    # 8 x, 12 controls) -> results/study/incontext-cpu.{md,json,png}: 127.8 minutes on the
                    # clock (the test suite beside it for part of that time)
    python experiments/incontext.py --jobs=2                     # the same, the sweep trained first
    python experiments/incontext.py --scale=gpu      # one GPU, larger models and budget
    python experiments/incontext.py --quick          # a smoke run in seconds (the test suite runs it) -> out-quick/

The task. Every episode draws a fresh bijection f from 8 keys (a..h) to 8 values (A..H), shows k demonstrations
"xF " and then a query key whose value is the answer:   "bD eA hG cB e" -> "A". The query is one of the
demonstrated keys, so the answer is knowable from the demonstrations and from nothing else: with k = 0, or
with demonstrations of another mapping ("shuffled"), the best any rule can do is 1/8 (f is a random
bijection: every value is equally likely for every key). There are 8! = 40,320 mappings; evaluation uses only
mappings that never occur in the training text (tested), so accuracy above 1/8 is learning *in context*.
One matching demonstration is enough: more demonstrations add distractors, not information, so accuracy need
not rise with k (a trivial rule that copies the last value shown is right at k = 1 and falls with k).

Training: the four architectures read a stream of such episodes (k uniform in 0..16, each after a newline)
with their usual objectives (gpt clm, bert mlm, prefixlm and t5 prefix_lm: a random split of each window).
Nothing tells them where the answers are. Evaluation shows each episode as the stream does (after a newline)
and reads the answer where each architecture naturally can: gpt at the query (left to right), prefixlm with
the demonstrations and query as its bidirectional prefix, t5 with them in its encoder, bert from a [MASK] in
the answer slot (as X3 prompts it). Accuracy = the argmax over the 8 values at the answer slot; beside it, how
varied the answers are (a model that always answers one value sits near 12.5% without being a measurement near
chance). An induction score per layer for every arch: the attention weight from the position that reads the
answer (t5: its encoder's query position) to the value that followed the same key in a demonstration (the copy
an induction head makes), beside what uniform attention would give.

A winner first (the effect control). The budget is found, not fixed: gpt trains at 1 x, 2 x, 4 x ... the
scale's base budget (3 seeds each) until, on every seed, its mean accuracy over the k >= 1 points is at least
EFFECT_MARGIN above both k = 0 and the shuffled demonstrations, answering at least EFFECT_DISTINCT distinct
values, and RULE_MARGIN above the rule that copies the last value shown. Then bert, prefixlm and t5 train at
that budget (the same FLOPs, equal_compute.py) and are read with the same control. Where gpt never passes,
every arch is measured at the largest budget tried and the result says "not reproduced up to N x".

Positive control (the readout works): each architecture also trains (a quarter of the base budget) on episodes
that all show one fixed mapping, and is asked its keys with no demonstrations: that mapping can be learned only
in the weights, so the control shows that the objective, the training and the readout at the answer slot can
find an answer at all.
"""
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/incontext.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch

import objectives
from infra.attention_maps import attention_maps
from infra.configurator import QUICK_NOTE, UserError, run_main
from data.prepare_common import write_dataset
from infra.dataset import load_dataset
from infra.progress import check_writable, format_duration, format_flops, write_atomically
from experiments.equal_compute import machine_line, resolve_experiment, train_and_evaluate_seeds
from infra.plots import pyplot, save

KEYS, VALUES = "abcdefgh", "ABCDEFGH"
MAX_DEMONSTRATIONS = 16
K_VALUES = (0, 1, 2, 4, 8, 16)
START = "\n"  # every training episode follows a newline; evaluation shows each episode the same way
DEFAULTS = dict(scale="cpu", quick=False, device="auto", out_dir="results/study", seed=1337, quiet=False,
                reuse=False,  # True: load the runs finished earlier with the same settings
                sweep_only=False,  # True: gpt's sweep alone (which budget makes it read the demonstrations?)
                sweep_from="",  # a sweep file --sweep_only=True wrote: its gpt runs stand for the sweep (not retrained)
                jobs=1)  # how many runs train at once (processes, one per core)
SCALES = {  # model size, the base FLOPs budget (as gpt iterations) and its sweep, the training text, evaluation
    # cpu: 2 x 128 (a pilot at 2 x 64 never left the constant answer in 2,000 iterations; at 128 wide, rate 5e-4,
    # gpt's induction appeared between 3,000 and 4,500); the sweep stops at the first budget gpt passes
    "cpu": dict(n_layer=2, n_head=4, n_embd=128, block_size=64, batch_size=32, gpt_iters=1500, budgets=(1, 2, 4, 8),
                eval_iters=10, train_chars=600_000, eval_episodes=200, seeds=3),
    "gpu": dict(n_layer=6, n_head=6, n_embd=384, block_size=64, batch_size=64, gpt_iters=5000, budgets=(1, 4, 16),
                eval_iters=50, train_chars=5_000_000, eval_episodes=1000, seeds=3),
    "quick": dict(n_layer=1, n_head=2, n_embd=32, block_size=64, batch_size=4, gpt_iters=10, budgets=(1, 2),
                  eval_iters=2, train_chars=20_000, eval_episodes=16, seeds=2),
}
# rotary positions for every arch: a "look one token back" head (what copying a demonstrated value needs) is one
# relative offset, not 64 learned absolute ones. The rate: 5e-4 for every arch (the gpt pilots: 2e-3 and 3e-3
# never left the constant answer, 1e-3 was slower than 5e-4; not tuned per arch, the result file says so)
SETTINGS = dict(position="rope", learning_rate=5e-4, min_lr=5e-5)
MODELS = [("gpt", "gpt", "clm", SETTINGS), ("bert", "bert", "mlm", SETTINGS),
          ("prefixlm", "prefixlm", "prefix_lm", SETTINGS), ("t5", "t5", "prefix_lm", SETTINGS)]
CONTROL_BUDGET = 0.25  # the positive control's share of the base budget: a lookup of 8 keys, learned in the weights
CONTROL_PASS = 0.5  # a control run passes at 4 x chance or more
EFFECT_MARGIN = 0.30  # the effect control: mean accuracy over k >= 1 this far above k = 0 and shuffled (each ~1/8)
EFFECT_DISTINCT = 6  # ... with at least this many distinct answers at every k >= 1 (not one letter near chance),
RULE_MARGIN = 0.10  # ... and this far above the rule that copies the last value shown (it clears EFFECT_MARGIN
# without matching a single key): more than noise, the mean over 1,000 episodes has a binomial std under 1.6 points


# ----------------------------------------------------------------------------- the task

def random_mapping(rng):
    """A bijection keys -> values, as the string of values for a..h (e.g. "DAGBHCEF" means a->D, b->A, ...)."""
    return "".join(rng.permutation(list(VALUES)))


def make_episode(mapping, k, rng, shuffled=False):
    """(text up to and including the query key, answer). shuffled=True shows demonstrations of another, random
    mapping: the same format, keys and value statistics, but nothing about the answer (merely permuting the
    shown values would not do: a key shown twice keeps its value more often than chance)."""
    demo_keys = rng.choice(list(KEYS), size=k)
    shown = random_mapping(rng) if shuffled else mapping
    demo_values = [shown[KEYS.index(x)] for x in demo_keys]
    query = rng.choice(demo_keys) if k else rng.choice(list(KEYS))  # k > 0: a demonstrated key
    text = "".join(f"{x}{y} " for x, y in zip(demo_keys, demo_values)) + query
    return text, mapping[KEYS.index(query)]


def unseen_mapping(rng, seen):
    while True:
        mapping = random_mapping(rng)
        if mapping not in seen:
            return mapping


def make_dataset(folder, train_chars, rng, fixed=None):
    """The training stream (90%: mappings that evaluation never uses) and a validation stream of unseen mappings
    (10%), written like any prepared dataset. Returns the set of training mappings. fixed: every episode of both
    streams shows that one mapping instead (the positive control's text: the lookup learned in the weights)."""
    seen, parts, length = set(), [], 0
    while length < train_chars:
        mapping = fixed or random_mapping(rng)
        seen.add(mapping)
        text, answer = make_episode(mapping, int(rng.integers(0, MAX_DEMONSTRATIONS + 1)), rng)
        parts.append(text + answer + "\n")
        length += len(parts[-1])
    while length < train_chars / 0.9 + 100:
        text, answer = make_episode(fixed or unseen_mapping(rng, seen), int(rng.integers(0, MAX_DEMONSTRATIONS + 1)),
                                    rng)
        parts.append(text + answer + "\n")
        length += len(parts[-1])
    text = "".join(parts)
    chars = sorted(set(KEYS + VALUES + " \n"))
    stoi = {c: i for i, c in enumerate(chars)}
    os.makedirs(folder, exist_ok=True)
    write_dataset(folder, [stoi[c] for c in text], {"tokenizer": "char", "num_ordinary": len(chars), "stoi": stoi,
                                                    "itos": chars})
    return seen


# ----------------------------------------------------------------------------- reading the answer

@torch.no_grad()
def answer_logits(model, texts, stoi, specials, device):
    """Logits over the vocabulary at the answer slot of each text (all of one length), as each arch reads it."""
    ids = torch.tensor([[stoi[c] for c in t] for t in texts], device=device)  # (N, L)
    arch = model.config.arch
    if arch == "t5":  # demonstrations and query in the encoder; the decoder's first step is the answer
        start = torch.full((len(texts), 1), specials.pad, device=device)
        return model(ids, decoder_inputs=start)[0][:, 0]
    if arch == "bert":  # a [MASK] in the answer slot, read with both sides (here: the left side is all there is)
        ids = torch.cat([ids, torch.full((len(texts), 1), specials.mask, device=device)], dim=1)
        return model(ids)[0][:, -1]
    prefix = torch.full((len(texts),), ids.size(1), device=device) if arch == "prefixlm" else None
    return model(ids, prefix_length=prefix)[0][:, -1]  # gpt / prefixlm: the query position predicts the answer


def answers(model, episodes, stoi, specials, device):
    """The value a model answers for each episode, in order: the argmax over the 8 values at the answer slot, each
    episode shown after a newline as in the training stream (episodes of one length read together)."""
    value_ids = torch.tensor([stoi[v] for v in VALUES], device=device)
    by_length = {}
    for number, (text, _) in enumerate(episodes):
        by_length.setdefault(len(text), []).append(number)
    predicted = [None] * len(episodes)
    for numbers in by_length.values():
        texts = [START + episodes[n][0] for n in numbers]
        logits = answer_logits(model, texts, stoi, specials, device)[:, value_ids]
        for n, i in zip(numbers, logits.argmax(dim=-1).tolist()):
            predicted[n] = VALUES[i]
    return predicted


def accuracy(model, episodes, stoi, specials, device, spread=None):
    """Share of episodes answered right. spread: a dict that receives how varied the answers are ("distinct":
    how many of the 8 values it ever answers; "most_common": the share of its most frequent answer), so that a
    constant answer (accuracy near 1/8 whatever the demonstrations) is never read as a measurement near chance."""
    predicted = answers(model, episodes, stoi, specials, device)
    if spread is not None:
        spread.update(distinct=len(set(predicted)),
                      most_common=max(map(predicted.count, set(predicted))) / len(predicted))
    return sum(p == a for p, (_, a) in zip(predicted, episodes)) / len(episodes)


@torch.no_grad()
def induction_scores(model, episodes, stoi, specials, device):
    """Per layer: the attention (max over heads of the mean over episodes) from the position that reads the answer
    to the demonstrated value(s) that followed the query's key, and the same for uniform attention over what that
    position sees. The reading position: gpt's and prefixlm's query, bert's [MASK] after it, t5's query in its
    encoder (its decoder reads the encoder through cross-attention, not recorded here)."""
    arch = model.config.arch
    scores, uniform = None, []
    for text, _ in episodes:
        ids = [stoi[c] for c in START + text]
        query = len(ids) - 1
        targets = [len(START) + i + 1 for i in range(0, len(text) - 1, 3) if text[i] == text[-1]]
        reader, seen = query, query + 1  # the query is the episode's last position: it sees all of it
        if arch == "bert":  # its [MASK] after the query reads, and sees the [MASK] too
            ids, reader, seen = ids + [specials.mask], query + 1, query + 2
        prefix = torch.tensor([len(ids)], device=device) if arch == "prefixlm" else None
        maps = attention_maps(model, torch.tensor([ids], device=device), prefix)  # per layer (1, heads, T, T)
        per_layer = torch.stack([m[0, :, reader, targets].sum(dim=-1) for m in maps])  # (layers, heads)
        scores = per_layer if scores is None else scores + per_layer
        uniform.append(len(targets) / seen)
    return (scores / len(episodes)).max(dim=1).values.tolist(), sum(uniform) / len(uniform)


def last_value_rule(text):
    """A trivial rule that reads the demonstrations without matching keys: answer the last value shown."""
    return text[-3] if len(text) > 1 else VALUES[0]


def effect_control(result, rules):
    """The in-context effect on one seed's result (k as strings, as JSON gives them back): the mean accuracy over
    the k >= 1 points against the larger of the k = 0 and shuffled controls, the fewest distinct answers at a
    k >= 1 point, and the same mean for the rule that copies the last value shown (rules: rule_accuracies on the
    same episodes). Passed: a margin of at least EFFECT_MARGIN, at least EFFECT_DISTINCT distinct answers, and
    RULE_MARGIN above the rule (which uses the demonstrations without matching keys, and clears the first margin
    alone)."""
    shown = [str(k) for k in K_VALUES if k >= 1]
    mean = sum(result["accuracy"][k] for k in shown) / len(shown)
    rule = sum(rules["last_value"][k] for k in shown) / len(shown)
    floor = max(result["accuracy"]["0"], result["shuffled_k8"])
    distinct = min(result["spread"][k]["distinct"] for k in shown)
    return dict(mean_k1=mean, floor=floor, margin=mean - floor, distinct=distinct, rule_mean_k1=rule,
                passed=mean - floor >= EFFECT_MARGIN and distinct >= EFFECT_DISTINCT and mean - rule >= RULE_MARGIN)


def evaluation_episodes(eval_rng_seed, seen, s):
    """The episodes every model and seed is asked (the same for all): unseen mappings at each k, shuffled
    demonstrations (k = 8), training mappings (k = 8), and 64 unseen ones (k = 8) for the induction score."""
    familiar = sorted(seen)

    def draw(offset, k, mapping=None, shuffled=False, n=s["eval_episodes"]):
        rng = np.random.default_rng(eval_rng_seed + offset)
        return [make_episode(familiar[int(rng.integers(len(familiar)))] if mapping == "seen" else
                             unseen_mapping(rng, seen), k, rng, shuffled) for _ in range(n)]
    episodes = {str(k): draw(k, k) for k in K_VALUES}
    episodes.update(shuffled=draw(100, 8, shuffled=True), seen=draw(200, 8, "seen"),
                    induction=draw(300, 8, n=min(64, s["eval_episodes"])))
    return episodes


def rule_accuracies(episodes):
    """What the trivial rules score on the same episodes: the last value shown, at each k and shuffled."""
    score = lambda items: sum(last_value_rule(t) == a for t, a in items) / len(items)  # noqa: E731
    return {"last_value": dict({str(k): score(episodes[str(k)]) for k in K_VALUES},
                               shuffled_k8=score(episodes["shuffled"]))}


def evaluate(model, name, eval_rng_seed, seen, s, stoi, specials, device):
    """Accuracy against k on unseen mappings, with shuffled demonstrations, and on seen mappings (k = 8), the
    effect control and the induction score per layer. For a positive control run (name "<arch>, control"; `seen`
    is then its one mapping): accuracy on that mapping with no demonstrations."""
    if name.endswith(", control"):  # trained on one fixed mapping: asked it with no demonstrations
        rng = np.random.default_rng(eval_rng_seed + 400)
        fixed = [make_episode(seen, 0, rng) for _ in range(s["eval_episodes"])]  # (seen: the mapping, here)
        result = {"spread": {}}
        result["fixed_k0"] = accuracy(model, fixed, stoi, specials, device, result["spread"])
        return result
    episodes = evaluation_episodes(eval_rng_seed, seen, s)
    result = {"accuracy": {}, "spread": {}}
    for k in map(str, K_VALUES):
        result["spread"][k] = {}
        result["accuracy"][k] = accuracy(model, episodes[k], stoi, specials, device, result["spread"][k])
    result["shuffled_k8"] = accuracy(model, episodes["shuffled"], stoi, specials, device)
    result["seen_mappings_k8"] = accuracy(model, episodes["seen"], stoi, specials, device)
    result["effect"] = effect_control(result, rule_accuracies(episodes))
    result["induction"], result["induction_uniform"] = induction_scores(model, episodes["induction"], stoi,
                                                                        specials, device)
    return result


def mean_std(values):
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1))


def trained_runs(data):
    """The record of every run the result holds, each once: the sweep's gpt runs, then (a full result) the other
    archs' and every arch's control (the compared gpt is the sweep's last)."""
    runs = [m for step in data["sweep"] for r in step["runs"] for m in r["models"].values()]
    if not data.get("sweep_only"):
        runs += [m for r in data["runs"] for name, m in r["models"].items() if name != "gpt"]
        runs += [m for r in data["runs"] for m in r["controls"].values()]
    return runs


def training_minutes(data):
    """The training time of every run the result holds, in minutes (each measured when it trained)."""
    return sum(m["train_seconds"] for m in trained_runs(data)) / 60


def reused_note(data):
    """How many of the result's runs this command loaded instead of training (--reuse=True)."""
    runs = trained_runs(data)
    reused = sum(m.get("reused", False) for m in runs)
    return f" ({reused} of its {len(runs)} runs finished earlier, reused)" if reused else ""


def cell(values, scale=100, digits=1):
    """mean +- std over seeds, as a table cell (percent unless scale says otherwise)."""
    return " +- ".join(f"{scale * x:.{digits}f}" for x in mean_std(values))


def sweep_detail(data):
    """A --sweep_only run's detail: gpt's accuracy against k at each budget, per seed, and its induction score."""
    lines = ["", "gpt's accuracy (%) against k at each budget, per seed (the effect control's verdict beside):", "",
             "| budget | seed | " + " | ".join(f"k={k}" for k in K_VALUES) + " | shuffled | distinct (k >= 1) | "
             "induction per layer | passed |", "|" + "---|" * (len(K_VALUES) + 6)]
    for step in data["sweep"]:
        for run in step["runs"]:
            gpt = run["models"]["gpt"]
            lines.append(f"| {step['multiple']:g} x | {run['seed']} | "
                         + " | ".join(f"{100 * gpt['accuracy'][str(k)]:.1f}" for k in K_VALUES)
                         + f" | {100 * gpt['shuffled_k8']:.1f} | {gpt['effect']['distinct']} | "
                         + ", ".join(f"{x:.3f}" for x in gpt["induction"])
                         + f" (uniform {gpt['induction_uniform']:.3f}) | "
                         + ("yes" if gpt["effect"]["passed"] else "no") + " |")
    rule = data["rules"]["last_value"]
    lines.append("| rule: the last value shown | | " + " | ".join(f"{100 * rule[str(k)]:.1f}" for k in K_VALUES)
                 + f" | {100 * rule['shuffled_k8']:.1f} | | | |")
    lines += ["", "The other architectures are measured at the budget the sweep found by the command without "
                  "--sweep_only (with --reuse=True it keeps these gpt runs)."]
    return lines


def verdict(data):
    """One line: the budget at which gpt passed its effect control, or the largest budget tried."""
    at, flops = data["measured_multiple"], format_flops(data["budget_flops"])
    if data["chosen_multiple"] is None:
        line = (f"**gpt never passed its effect control: in-context learning not reproduced up to {at:g} x** "
                f"({flops} per model)")
        return line + ("." if data.get("sweep_only") else "; every arch below is measured there.")
    line = f"**gpt passes its effect control at {at:g} x** ({flops} per model) on every seed"
    return line + ("." if data.get("sweep_only") else "; every arch below is measured at that budget.")


def summarise(data, machine):
    """The markdown: the sweep, the verdict, every arch at the budget found, its controls and attention readout
    (a --sweep_only run: the sweep, and gpt at each budget)."""
    s, scale, runs = data["sizes"], data["scale"], data["runs"]
    names, shown = list(runs[0]["models"]), [str(k) for k in K_VALUES]
    rule_mean = runs[0]["models"]["gpt"]["effect"]["rule_mean_k1"]  # the same episodes for every model and seed
    half = s["n_layer"] // 2 or 1  # t5's encoder and decoder layers
    lines = [QUICK_NOTE, ""] if scale == "quick" else []
    lines += [f"In-context learning, scale `{scale}` ({s['n_layer']} layers x {s['n_embd']} dims; t5 {half} + {half}), "
              f"rotary positions, rate {SETTINGS['learning_rate']:g} for every arch (chosen on gpt pilots, not tuned "
              f"per arch), {len(runs)} seeds, {s['eval_episodes']} episodes per cell on mappings never seen in "
              f"training. Accuracy (%) at the answer slot, mean +- std over seeds. Training "
              f"{training_minutes(data):.1f} min summed over its runs (each measured when it trained), the whole "
              f"command {data['seconds'] / 60:.1f} min{reused_note(data)}, on {machine}.", "",
              f"The sweep (gpt, the expected winner; 1 x = {s['gpt_iters']} gpt iterations). Effect control: on every "
              f"seed, the mean accuracy over k >= 1 at least {100 * EFFECT_MARGIN:.0f} points above both k = 0 and "
              f"shuffled demonstrations, with at least {EFFECT_DISTINCT} distinct answers at every k >= 1, and "
              f"{100 * RULE_MARGIN:.0f} points above the rule that copies the last value shown ({100 * rule_mean:.1f}% "
              f"on the same episodes).", "",
              "| budget | FLOPs per model | mean over k >= 1 | k=0 | k=8, shuffled | fewest distinct | passed |",
              "|---|---|---|---|---|---|---|"]
    for step in data["sweep"]:
        gpt = [r["models"]["gpt"] for r in step["runs"]]
        lines.append(f"| {step['multiple']:g} x | {format_flops(step['flops'])} | "
                     f"{cell([g['effect']['mean_k1'] for g in gpt])} | {cell([g['accuracy']['0'] for g in gpt])} | "
                     f"{cell([g['shuffled_k8'] for g in gpt])} | "
                     f"{', '.join(str(g['effect']['distinct']) for g in gpt)} | "
                     f"{sum(g['effect']['passed'] for g in gpt)}/{len(gpt)} |")
    if data.get("sweep_only"):
        return "\n".join(lines + ["", verdict(data)] + sweep_detail(data))
    lines += ["", verdict(data), "",
              "| model | " + " | ".join(f"k={k}" for k in K_VALUES) + " | k=8, shuffled | k=8, seen mappings |",
              "|" + "---|" * (len(K_VALUES) + 3)]
    for name in names:
        cells = [cell([r["models"][name]["accuracy"][k] for r in runs]) for k in shown]
        cells += [cell([r["models"][name]["shuffled_k8"] for r in runs]),
                  cell([r["models"][name]["seen_mappings_k8"] for r in runs])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    rule = data["rules"]["last_value"]
    lines.append("| rule: the last value shown | " + " | ".join(f"{100 * rule[k]:.1f}" for k in shown)
                 + f" | {100 * rule['shuffled_k8']:.1f} | |")
    lines.append("| chance / any rule blind to the demonstrations | " + " | ".join(["12.5"] * (len(K_VALUES) + 2))
                 + " |")
    lines += ["", "The effect control of every arch at this budget (the same test gpt's sweep used): mean accuracy "
                  "over k >= 1 minus the larger of k = 0 and shuffled, per seed, and the fewest distinct answers.", "",
              "| model | margin per seed (points) | fewest distinct per seed | passed |", "|---|---|---|---|"]
    for name in names:
        effects = [r["models"][name]["effect"] for r in runs]
        margins = ", ".join(f"{100 * e['margin']:.1f}" for e in effects)
        lines.append(f"| {name} | {margins} | "
                     f"{', '.join(str(e['distinct']) for e in effects)} | "
                     f"{sum(e['passed'] for e in effects)}/{len(effects)} |")
    lines += ["", "How varied the answers are (unseen mappings): how many of the 8 values a model ever answers, and "
                  "the share of its most common answer, mean over seeds.", "",
              "| model | " + " | ".join(f"k={k}: distinct, most common" for k in K_VALUES) + " |",
              "|" + "---|" * (len(K_VALUES) + 1)]
    for name in names:
        cells = [f"{mean_std([r['models'][name]['spread'][k]['distinct'] for r in runs])[0]:.1f}, "
                 f"{100 * mean_std([r['models'][name]['spread'][k]['most_common'] for r in runs])[0]:.0f}%"
                 for k in shown]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Positive control: each architecture trained on episodes of one fixed mapping ({CONTROL_BUDGET:g} x "
                  f"the base budget, the same format, objective and readout), then asked its keys with no "
                  f"demonstrations (k = 0): the mapping can only come from the weights. It shows that training and "
                  f"readout can find an answer at this slot at all. Passing: at least {100 * CONTROL_PASS:.0f}% "
                  f"({CONTROL_PASS * 8:g} x chance).", "",
              "| model | accuracy per seed (%) | distinct answers | passed |", "|---|---|---|---|"]
    for name in names:
        scores = [r["controls"][name]["fixed_k0"] for r in runs]
        lines.append(f"| {name} | {', '.join(f'{100 * v:.1f}' for v in scores)} | "
                     f"{', '.join(str(r['controls'][name]['spread']['distinct']) for r in runs)} | "
                     f"{sum(v >= CONTROL_PASS for v in scores)}/{len(scores)} |")
    layers = len(runs[0]["models"]["gpt"]["induction"])
    lines += ["", "Induction score per layer: the attention from the position that reads the answer (gpt, prefixlm: "
                  "the query; bert: its [MASK]; t5: the query in its encoder) to the value that followed the "
                  "query's key in a demonstration, max over heads, mean over up to 64 episodes with k = 8; mean +- std "
                  "over seeds, beside what uniform attention over the positions it sees would give.", "",
              "| model | " + " | ".join(f"layer {i}" for i in range(layers)) + " | uniform |",
              "|" + "---|" * (layers + 2)]
    for name in names:
        scores = [r["models"][name]["induction"] for r in runs]
        uniform = mean_std([r["models"][name]["induction_uniform"] for r in runs])[0]
        cells = [cell([seed[i] for seed in scores], 1, 3) for i in range(len(scores[0]))]
        cells += ["-"] * (layers - len(cells))  # t5: its encoder's layers only, half of the others'
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {uniform:.3f} |")
    return "\n".join(lines)


MARKERS = {"gpt": "o", "bert": "s", "prefixlm": "^", "t5": "D"}


def plot(data, path):
    """Left: each arch's mean accuracy over k >= 1 against training FLOPs (gpt's sweep, the others at the budget
    found). Right: accuracy against k at that budget, the trivial rules beside. Lines that share values stay
    visible: each arch its marker, offset a little along k."""
    plt = pyplot()
    if plt is None:
        return None
    runs = data["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    curves = [(f"gpt at {step['multiple']:g} x", step["runs"], "gpt") for step in data["sweep"]] \
        if data.get("sweep_only") else [(name, runs, name) for name in runs[0]["models"]]
    for name in runs[0]["models"]:
        points = [(step["flops"], [r["models"]["gpt"]["effect"]["mean_k1"] for r in step["runs"]])
                  for step in data["sweep"]] if name == "gpt" else \
            [(data["budget_flops"], [r["models"][name]["effect"]["mean_k1"] for r in runs])]  # the sweep's last
        stats = [mean_std([100 * v for v in values]) for _, values in points]
        left.errorbar([f for f, _ in points], [m for m, _ in stats], yerr=[d for _, d in stats], capsize=3,
                      marker=MARKERS.get(name, "o"), label=name, alpha=0.85)
    left.set_xscale("log")
    left.set_ylim(0, 100)
    left.axhline(12.5, color="gray", linestyle="--", label="chance")
    left.axhline(100 * runs[0]["models"]["gpt"]["effect"]["rule_mean_k1"], color="black", linestyle=":",
                 label="rule: the last value shown")
    left.set_xlabel("training FLOPs per model")
    left.set_ylabel("mean accuracy over k >= 1 (%)")
    left.set_title("Score against compute (gpt's sweep)")
    left.legend(fontsize=8)
    for number, (label, curve_runs, name) in enumerate(curves):
        stats = [mean_std([100 * r["models"][name]["accuracy"][str(k)] for r in curve_runs]) for k in K_VALUES]
        offset = [k * (1 + 0.04 * (number - 1.5)) if k else 0.08 * (number - 1.5) for k in K_VALUES]
        right.errorbar(offset, [m for m, _ in stats], yerr=[d for _, d in stats], capsize=3, label=label, alpha=0.85,
                       marker=MARKERS.get(name, "o") if not data.get("sweep_only") else "os^Dv"[number % 5])
    rule = data["rules"]["last_value"]
    right.plot(K_VALUES, [100 * rule[str(k)] for k in K_VALUES], color="black", linestyle=":",
               label="rule: the last value shown")
    right.axhline(12.5, color="gray", linestyle="--", label="chance (any rule blind to the demonstrations)")
    right.set_xscale("symlog", linthresh=1)
    right.set_xticks(K_VALUES, [str(k) for k in K_VALUES])
    right.set_xlabel("demonstrations k")
    right.set_ylabel("answer accuracy on unseen mappings (%)")
    right.set_title("gpt at each budget of the sweep (claim C5)" if data.get("sweep_only") else
                    f"Every arch at {data['measured_multiple']:g} x (claims C5, X3)")
    right.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, dpi=120)
    return path


def read_sweep(config, scale, s, rules):
    """gpt's sweep from a file --sweep_only=True wrote with these settings: (sweep, the multiple it passed at or
    None). The same rules on the same evaluation episodes show that the seed and training text are the same too."""
    path = config["sweep_from"]
    if config["sweep_only"]:
        raise UserError(f"--sweep_from={path} with --sweep_only=True: the sweep is read, not made; give one of the two")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"--sweep_from={path}: cannot read it as a JSON file ({e.__class__.__name__}): give the "
                        f".json that --sweep_only=True wrote, or leave --sweep_from out to train the sweep")
    if not isinstance(data, dict) or not data.get("sweep_only") or not data.get("sweep"):
        raise UserError(f"--sweep_from={path}: not a sweep file (--sweep_only=True writes "
                        f"incontext-<scale>-sweep.json)")
    same = json.loads(json.dumps(dict(scale=scale, sizes=s, settings=SETTINGS, effect_margin=EFFECT_MARGIN,
                                      effect_distinct=EFFECT_DISTINCT, rule_margin=RULE_MARGIN, rules=rules)))
    differ = [key for key, value in same.items() if data.get(key) != value]
    if differ:
        raise UserError(f"--sweep_from={path}: its {', '.join(differ)} differ from this run's (another scale, seed "
                        f"or version of incontext.py): train the sweep again without --sweep_from")
    budgets = ", ".join(f"{step['multiple']:g} x" for step in data["sweep"])
    print(f"[incontext] the sweep read from {path}: gpt at {budgets}", flush=True)
    return data["sweep"], data["chosen_multiple"]


def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES, "incontext", ())  # its files: checked below
    base = os.path.join(config["out_dir"], f"incontext-{scale}" + ("-sweep" if config["sweep_only"] else ""))
    check_writable([base + extension for extension in (".md", ".json", ".png")])
    s = SCALES[scale]
    t0 = time.perf_counter()
    folder = os.path.join(config["out_dir"], "checkpoints", f"incontext-{scale}-data")
    seen = make_dataset(folder, s["train_chars"], np.random.default_rng(config["seed"]))
    fixed = random_mapping(np.random.default_rng(config["seed"] + 1))  # the positive control's one mapping
    control_folder = folder.replace("-data", "-control-data")
    make_dataset(control_folder, s["train_chars"], np.random.default_rng(config["seed"] + 2), fixed=fixed)
    _, meta = load_dataset(folder, s["block_size"], prepare_if_missing=False)
    specials, stoi = objectives.Specials.from_meta(meta), meta["stoi"]
    work = os.path.join(config["out_dir"], "checkpoints", f"incontext-{scale}")

    def train_at(multiple, models):  # every seed of `models` at `multiple` x the base budget, evaluated
        sized = dict(s, gpt_iters=round(multiple * s["gpt_iters"]))
        runs, budget, interrupted = train_and_evaluate_seeds(
            "incontext", models, sized, folder, f"{work}-x{multiple:g}", device, meta, config,
            lambda trained: json.loads(json.dumps({  # as the JSON file gives them back (k as strings)
                name: dict(evaluate(result["model"].eval(), name, config["seed"],
                                    fixed if name.endswith(", control") else seen, s, stoi, specials, device),
                           train_seconds=result["seconds"],  # measured when it trained (a reused run: then)
                           reused=bool(result.get("reused")))
                for name, result in trained.items()})))
        if interrupted or len(runs) < s["seeds"]:
            raise KeyboardInterrupt  # nothing written: run_main says the finished runs are kept (status 130)
        return runs, budget

    rules = rule_accuracies(evaluation_episodes(config["seed"], seen, s))
    sweep, chosen = read_sweep(config, scale, s, rules) if config["sweep_from"] else ([], None)
    for multiple in s["budgets"][len(sweep):] if chosen is None else ():  # a winner first: the budget is found
        print(f"[incontext] the sweep: gpt at {multiple:g} x the base budget", flush=True)
        runs, budget = train_at(multiple, MODELS[:1])
        sweep.append(dict(multiple=multiple, flops=budget, runs=runs))
        effects = [run["models"]["gpt"]["effect"] for run in runs]
        means = ", ".join(f"{100 * e['mean_k1']:.1f}" for e in effects)
        print(f"[incontext] gpt at {multiple:g} x: mean accuracy over k >= 1 {means}% by seed; effect control "
              f"passed on {sum(e['passed'] for e in effects)}/{len(effects)} seeds", flush=True)
        if all(e["passed"] for e in effects):
            chosen = multiple
            break
    at = sweep[-1]["multiple"]
    data = {"scale": scale, "sizes": s, "sweep": sweep, "chosen_multiple": chosen, "measured_multiple": at,
            "budget_flops": sweep[-1]["flops"], "rules": rules, "training_mappings": len(seen),
            "settings": SETTINGS, "effect_margin": EFFECT_MARGIN, "effect_distinct": EFFECT_DISTINCT,
            "rule_margin": RULE_MARGIN}
    if config["sweep_only"]:
        data.update(sweep_only=True, runs=sweep[-1]["runs"])
    else:
        print(f"[incontext] every other arch at {at:g} x" + (", where gpt passed" if chosen else
                                                              ", the largest budget tried"), flush=True)
        controls = [(f"{name}, control", arch, objective, dict(settings, dataset=control_folder,
                                                               budget_fraction=CONTROL_BUDGET / at))
                    for name, arch, objective, settings in MODELS]
        runs, budget = train_at(at, MODELS[1:] + controls)
        for run, gpt in zip(runs, sweep[-1]["runs"]):
            run["models"] = dict(gpt=gpt["models"]["gpt"], **run["models"])
            run["controls"] = {name: run["models"].pop(f"{name}, control") for name, *_ in MODELS}
        data.update(runs=runs, budget_flops=budget, control_mapping=fixed, control_budget=CONTROL_BUDGET)
    data["seconds"] = time.perf_counter() - t0
    text = summarise(data, machine_line(device, config))
    print("\n" + text)
    write_atomically(base + ".md", text + "\n", base + ".json", json.dumps(data, indent=1))
    picture = plot(data, base + ".png")
    print(f"\nwrote {base}.md, .json{' and .png' if picture else ''} in {format_duration(data['seconds'])}")


if __name__ == "__main__":
    run_main(main, interrupted="the runs finished so far are kept: the same command with --reuse=True goes on "
                              "from them")
