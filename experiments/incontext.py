"""
Question: in-context learning in miniature (claims C5 and X3): can a model learn a mapping it has never seen
from k demonstrations in its input, and does that need a left-to-right decoder?

    python experiments/incontext.py                  # gpt, bert, prefixlm, t5 x 3 seeds at equal FLOPs: 10.0
                                                     # minutes measured on 2 cores of an Intel Xeon
                                                     # -> results/study/incontext-cpu.{md,json,png}
    python experiments/incontext.py --scale=cpu-long # the same models 7.5x longer -> incontext-cpu-long.*
    python experiments/incontext.py --scale=gpu      # one GPU, larger models and budget
    python experiments/incontext.py --quick          # a smoke run in seconds (the test suite runs it) -> out-quick/

The task. Every episode draws a fresh bijection f from 8 keys (a..h) to 8 values (A..H), shows k demonstrations
"xF " and then a query key whose value is the answer:   "bD eA hG cB e" -> "A". The query is one of the
demonstrated keys, so the answer is knowable from the demonstrations and from nothing else: with k = 0, or
with demonstrations of another mapping ("shuffled"), the best any rule can do is 1/8 (f is a random
bijection: every value is equally likely for every key). There are 8! = 40,320 mappings; evaluation uses only
mappings that never occur in the training text (tested), so accuracy above 1/8 is learning *in context*.

Training: the four architectures read a stream of such episodes (k uniform in 0..16, separated by newlines)
with their usual objectives (gpt clm, bert mlm, prefixlm and t5 prefix_lm: a random split of each window), at
the same training FLOPs as in study.py. Nothing tells them where the answers are. Evaluation reads the answer
where each architecture naturally can: gpt at the query (left to right), prefixlm with the demonstrations and
query as its bidirectional prefix, t5 with them in its encoder, bert from a [MASK] in the answer slot (as X3
prompts it). Accuracy = the argmax over the 8 values at the answer slot; beside it, how varied the answers are
(how many of the 8 values a model ever answers, the share of its most common one): a model that always answers
the same value sits near 12.5% without being a measurement near chance. For gpt, an induction score per layer:
the attention weight from the query to the value that followed the same key in a demonstration (the copy an
induction head makes), beside what uniform attention would give.

Positive control: each architecture also trains (a quarter of the budget) on episodes that all show one fixed
mapping, and is asked its keys with no demonstrations: that mapping can be learned only in the weights, so the
control shows that the objective, the training and the readout at the answer slot can find an answer at all.
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
from infra.configurator import QUICK_NOTE, run_main
from data.prepare_common import write_dataset
from infra.dataset import load_dataset
from infra.progress import format_duration, format_flops, write_atomically
from experiments.equal_compute import machine_line, resolve_experiment, train_and_evaluate_seeds
from infra.plots import pyplot, save

KEYS, VALUES = "abcdefgh", "ABCDEFGH"
MAX_DEMONSTRATIONS = 16
K_VALUES = (0, 1, 2, 4, 8, 16)
DEFAULTS = dict(scale="cpu", quick=False, device="auto", out_dir="results/study", seed=1337, quiet=False,
                reuse=False,  # True: load the runs finished earlier with the same settings
                jobs=1)  # how many runs train at once (processes, one per core)
SCALES = {  # model size and the FLOPs budget (as gpt iterations), the training text, the evaluation
    # cpu: 12 models (4 archs x 3 seeds), 2,000 gpt steps each; cpu-long: 7.5x longer, one seed
    "cpu": dict(n_layer=2, n_head=4, n_embd=64, block_size=64, batch_size=32, gpt_iters=2000, eval_iters=10,
                train_chars=600_000, eval_episodes=200, seeds=3),
    "gpu": dict(n_layer=6, n_head=6, n_embd=384, block_size=64, batch_size=64, gpt_iters=20000, eval_iters=50,
                train_chars=5_000_000, eval_episodes=1000, seeds=3),
    "cpu-long": dict(n_layer=2, n_head=4, n_embd=64, block_size=64, batch_size=32, gpt_iters=15000, eval_iters=10,
                     train_chars=600_000, eval_episodes=200, seeds=1),
    "quick": dict(n_layer=1, n_head=2, n_embd=32, block_size=64, batch_size=4, gpt_iters=10, eval_iters=2,
                  train_chars=20_000, eval_episodes=16, seeds=2),
}
# rotary positions for every arch: a "look one token back" head (what copying a demonstrated value needs) is one
# relative offset, not 64 learned absolute ones; the learning rate of the pilots
SETTINGS = dict(position="rope", learning_rate=3e-3)
MODELS = [("gpt", "gpt", "clm", SETTINGS), ("bert", "bert", "mlm", SETTINGS),
          ("prefixlm", "prefixlm", "prefix_lm", SETTINGS), ("t5", "t5", "prefix_lm", SETTINGS)]
CONTROL_BUDGET = 0.25  # the positive control's share of the budget: a lookup of 8 keys, learned in the weights
CONTROL_PASS = 0.5  # a control run passes at 4 x chance or more


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
    """The value a model answers for each episode, in order: the argmax over the 8 values at the answer slot
    (episodes of one length read together)."""
    value_ids = torch.tensor([stoi[v] for v in VALUES], device=device)
    by_length = {}
    for number, (text, _) in enumerate(episodes):
        by_length.setdefault(len(text), []).append(number)
    predicted = [None] * len(episodes)
    for numbers in by_length.values():
        logits = answer_logits(model, [episodes[n][0] for n in numbers], stoi, specials, device)[:, value_ids]
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
def induction_scores(model, episodes, stoi, device):
    """gpt only. Per layer: the attention (max over heads of the mean over episodes) from the query position to
    the demonstrated value(s) that followed the query's key, and the same for uniform causal attention."""
    scores, uniform = None, []
    for text, _ in episodes:
        ids = torch.tensor([[stoi[c] for c in text]], device=device)
        query = len(text) - 1
        targets = [i + 1 for i in range(0, query, 3) if text[i] == text[query]]  # the value after each matching key
        maps = model.attention_maps(ids)  # per layer (1, heads, T, T)
        per_layer = torch.stack([m[0, :, query, targets].sum(dim=-1) for m in maps])  # (layers, heads)
        scores = per_layer if scores is None else scores + per_layer
        uniform.append(len(targets) / (query + 1))
    return (scores / len(episodes)).max(dim=1).values.tolist(), sum(uniform) / len(uniform)


# ----------------------------------------------------------------------------- the experiment

def evaluate(model, name, eval_rng_seed, seen, s, stoi, specials, device):
    """Accuracy against k on unseen mappings, with shuffled demonstrations, and on seen mappings (k = 8). For a
    positive control run (name "<arch>, control"; `seen` is then its one mapping): accuracy on that mapping with
    no demonstrations."""
    if name.endswith(", control"):  # trained on one fixed mapping: asked it with no demonstrations
        rng = np.random.default_rng(eval_rng_seed + 400)
        fixed = [make_episode(seen, 0, rng) for _ in range(s["eval_episodes"])]  # (seen: the mapping, here)
        result = {"spread": {}}
        result["fixed_k0"] = accuracy(model, fixed, stoi, specials, device, result["spread"])
        return result
    result = {"accuracy": {}, "spread": {}}
    for k in K_VALUES:
        rng = np.random.default_rng(eval_rng_seed + k)  # the same episodes for every model and seed
        episodes = [make_episode(unseen_mapping(rng, seen), k, rng) for _ in range(s["eval_episodes"])]
        result["spread"][k] = {}
        result["accuracy"][k] = accuracy(model, episodes, stoi, specials, device, result["spread"][k])
    rng = np.random.default_rng(eval_rng_seed + 100)
    shuffled = [make_episode(unseen_mapping(rng, seen), 8, rng, shuffled=True) for _ in range(s["eval_episodes"])]
    result["shuffled_k8"] = accuracy(model, shuffled, stoi, specials, device)
    rng = np.random.default_rng(eval_rng_seed + 200)
    seen_list = sorted(seen)
    familiar = [make_episode(seen_list[int(rng.integers(len(seen_list)))], 8, rng) for _ in range(s["eval_episodes"])]
    result["seen_mappings_k8"] = accuracy(model, familiar, stoi, specials, device)
    if name == "gpt":
        rng = np.random.default_rng(eval_rng_seed + 300)
        episodes = [make_episode(unseen_mapping(rng, seen), 8, rng) for _ in range(min(64, s["eval_episodes"]))]
        result["induction"], result["induction_uniform"] = induction_scores(model, episodes, stoi, device)
    return result


def mean_std(values):
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1))


def summarise(runs, s, budget, seconds, scale, machine):
    """The markdown table: accuracy (%) mean +- std over seeds against k, and the controls."""
    names = list(runs[0]["models"])
    fmt = lambda values: "{:.1f} +- {:.1f}".format(*[100 * x for x in mean_std(values)])  # noqa: E731
    lines = [QUICK_NOTE, ""] if scale == "quick" else []
    half = s["n_layer"] // 2 or 1  # t5's encoder and decoder layers
    lines += [f"In-context learning, scale `{scale}` ({s['n_layer']} layers x {s['n_embd']} dims; t5 {half}"
             f" + {half}), {format_flops(budget)} per model (= {s['gpt_iters']} gpt iterations), "
             f"{len(runs)} seeds, {s['eval_episodes']} episodes per cell on mappings never seen in training. "
             f"Accuracy (%) at the answer slot, mean +- std over seeds. Chance, and the best rule that ignores the "
             f"demonstrations: 12.5. Whole run {seconds / 60:.1f} min on {machine}.", "",
             "| model | " + " | ".join(f"k={k}" for k in K_VALUES) + " | k=8, shuffled | k=8, seen mappings |",
             "|" + "---|" * (len(K_VALUES) + 3)]
    for name in names:
        cells = [fmt([r["models"][name]["accuracy"][k] for r in runs]) for k in K_VALUES]
        cells += [fmt([r["models"][name]["shuffled_k8"] for r in runs]),
                  fmt([r["models"][name]["seen_mappings_k8"] for r in runs])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| chance / demonstration-blind rule | " + " | ".join(["12.5"] * (len(K_VALUES) + 2)) + " |")
    lines += ["", "How varied the answers are (unseen mappings): how many of the 8 values a model ever answers, and "
                  "the share of its most common answer, mean over seeds. A model that answers one value whatever "
                  "it is shown scores near 12.5 without measuring anything near chance.", "",
              "| model | " + " | ".join(f"k={k}: distinct, most common" for k in K_VALUES) + " |",
              "|" + "---|" * (len(K_VALUES) + 1)]
    for name in names:
        cells = [f"{mean_std([r['models'][name]['spread'][k]['distinct'] for r in runs])[0]:.1f}, "
                 f"{100 * mean_std([r['models'][name]['spread'][k]['most_common'] for r in runs])[0]:.0f}%"
                 for k in K_VALUES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Positive control: each architecture trained on episodes of one fixed mapping ({CONTROL_BUDGET:g} x "
                  f"the budget, the same format, objective and readout), then asked its keys with no "
                  f"demonstrations (k = 0): the mapping can only come from the weights. It shows that training and "
                  f"readout can find an answer at this slot at all. Passing: at least {100 * CONTROL_PASS:.0f}% "
                  f"({CONTROL_PASS * 8:g} x chance).", "",
              "| model | accuracy per seed (%) | distinct answers | past |", "|---|---|---|---|"]
    for name in names:
        scores = [r["controls"][name]["fixed_k0"] for r in runs]
        lines.append(f"| {name} | {', '.join(f'{100 * v:.1f}' for v in scores)} | "
                     f"{', '.join(str(r['controls'][name]['spread']['distinct']) for r in runs)} | "
                     f"{sum(v >= CONTROL_PASS for v in scores)}/{len(scores)} |")
    induction = [r["models"]["gpt"]["induction"] for r in runs]
    uniform = sum(r["models"]["gpt"]["induction_uniform"] for r in runs) / len(runs)
    lines += ["", f"gpt's induction score per layer (attention from the query to the value after the matching "
                  f"demonstrated key; max over heads, mean over episodes with k=8; uniform attention gives "
                  f"{uniform:.3f}):", "", "| layer | score (mean +- std over seeds) |", "|---|---|"]
    lines += [f"| {i} | {mean_std([seed[i] for seed in induction])[0]:.3f} +- "
              f"{mean_std([seed[i] for seed in induction])[1]:.3f} |" for i in range(len(induction[0]))]
    return "\n".join(lines)


def plot(runs, path):
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in runs[0]["models"]:
        stats = [mean_std([100 * r["models"][name]["accuracy"][str(k)] for r in runs]) for k in K_VALUES]
        ax.errorbar(K_VALUES, [m for m, _ in stats], yerr=[d for _, d in stats], marker="o", capsize=3, label=name)
    ax.axhline(12.5, color="gray", linestyle="--", label="chance (no rule without the demonstrations does better)")
    ax.set_xlabel("demonstrations k")
    ax.set_ylabel("answer accuracy on unseen mappings (%)")
    ax.set_title("In-context learning at equal training FLOPs (claims C5, X3)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path, dpi=120)
    return path


def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES, "incontext")
    s = SCALES[scale]
    t0 = time.perf_counter()
    folder = os.path.join(config["out_dir"], "checkpoints", f"incontext-{scale}-data")
    seen = make_dataset(folder, s["train_chars"], np.random.default_rng(config["seed"]))
    fixed = random_mapping(np.random.default_rng(config["seed"] + 1))  # the positive control's one mapping
    control_folder = folder.replace("-data", "-control-data")
    make_dataset(control_folder, s["train_chars"], np.random.default_rng(config["seed"] + 2), fixed=fixed)
    _, meta = load_dataset(folder, s["block_size"], prepare_if_missing=False)
    specials, stoi = objectives.Specials.from_meta(meta), meta["stoi"]
    controls = [(f"{name}, control", arch, objective, dict(settings, dataset=control_folder,
                                                           budget_fraction=CONTROL_BUDGET))
                for name, arch, objective, settings in MODELS]
    runs, budget, interrupted = train_and_evaluate_seeds(
        "incontext", MODELS + controls, s, folder, os.path.join(config["out_dir"], "checkpoints", f"incontext-{scale}"),
        device, meta, config, lambda trained: {name: evaluate(result["model"].eval(), name, config["seed"],
                                                              fixed if name.endswith(", control") else seen, s,
                                                              stoi, specials, device)
                                               for name, result in trained.items()})
    if not runs:
        raise KeyboardInterrupt  # before any seed finished: run_main says what is kept (status 130)
    for run in runs:  # the controls apart from the compared models
        run["controls"] = {name: run["models"].pop(f"{name}, control") for name, *_ in MODELS}
    seconds = time.perf_counter() - t0
    text = summarise(runs, s, budget, seconds, scale, machine_line(device, config))
    if len(runs) < s["seeds"]:
        text += f"\n\n**Interrupted: {len(runs)} of {s['seeds']} seeds finished.**"
    print("\n" + text)
    base = os.path.join(config["out_dir"], f"incontext-{scale}")
    write_atomically(base + ".md", text + "\n", base + ".json", json.dumps(
        {"scale": scale, "sizes": s, "budget_flops": budget, "seconds": seconds, "runs": runs,
         "training_mappings": len(seen), "control_mapping": fixed, "control_budget": CONTROL_BUDGET}, indent=1))
    picture = plot(json.loads(json.dumps(runs)), base + ".png")  # as experiments/redraw.py reads them back
    print(f"\nwrote {base}.md, .json{' and .png' if picture else ''} in {format_duration(seconds)}")
    if interrupted:
        raise KeyboardInterrupt  # the stop asked for ends the command (status 130) once the seeds finished are written


if __name__ == "__main__":
    run_main(main, interrupted="the runs finished so far are kept: the same command with --reuse=True goes on "
                              "from them")
