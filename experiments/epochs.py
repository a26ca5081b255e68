"""
Question: when data runs out (claim X2), repeating a small unique-data budget for 1..512 epochs, which
objective keeps improving on held-out text?

    python experiments/epochs.py             # CPU: the study's CPU model, first 10,000 characters, about 32
                                             # minutes alone on 2 cores -> results/study/epochs-cpu.{md,json,png}
    python experiments/epochs.py --scale=gpu # one GPU: the study's GPU model on the first 100,000 characters
    python experiments/epochs.py --quick     # a smoke run in seconds (the test suite runs it) -> out-quick/

Prabhudesai et al. (2025; docs/claims.md, X2) report that next-token prediction wins at a few epochs but
overfits, while masked diffusion keeps improving for ~100 epochs and ends lower. Here:

- The unique data is the first `unique_chars` characters of the training split and nothing else: a dataset
  folder whose train.bin holds exactly those tokens (its val.bin is the whole, untouched validation split).
- Every (objective, epochs, seed) is its own run, with the study's hyperparameters and a cosine schedule sized to
  that run: a model trained for 4 epochs is a finished 4-epoch model, not the 4-epoch point of a 512-epoch run
  still at its peak learning rate. The doubling schedule costs twice one long run. An epoch = unique_chars
  characters read; windows are drawn at random as in train.py, so an epoch reads each character once *in
  expectation*. The masked objectives learn slowly (a long plateau at the character-frequency level, as in the
  study), so they run to 512 epochs; gpt, overfit long before, to 256.
- Seeds: two at every epoch count up to 16 and, once the first seed has run everywhere, at each objective's best
  epoch count and at the crossover: the key points carry a spread, the expensive long runs one seed otherwise.
- Scored on the same held-out windows with the study's common metric (metrics.second_half_bits, bits/char of a
  window's second half given its first half): gpt's exact chain rule; the diffusion model's ELBO (an upper bound
  on its NLL, the curve the paper compares) and its exact chain rule with [MASK] placeholders; bert's
  left-to-right chain rule as the study computes it. The same on windows of the unique training data, so
  overfitting shows as the gap between the two. Character frequencies (of the unique data) are the trivial floor.
- gpt runs twice: with the study's settings (dropout 0) and with dropout 0.2 (nanoGPT's Shakespeare setting).
  The comparison uses, at each epoch count, the better of the two, so diffusion is compared against the
  stronger next-token baseline.

Finished runs are written after each run to results/study/epochs-<scale>.json; a rerun with the same settings
reuses them (--fresh=True starts over), so Ctrl-C loses at most the run in progress.
"""
import json
import os
import pickle
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/epochs.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch

import objectives
import train
from infra.configurator import QUICK_NOTE, UserError, run_main
from infra.dataset import get_windows, load_dataset, written_here
from infra.progress import StopSignals, format_duration, write_atomically
from infra.timing import machine_name
from experiments.equal_compute import resolve_experiment
from experiments.metrics import character_frequency_bits, second_half_bits
from experiments.study_report import mean_std
from infra.plots import pyplot, save

DEFAULTS = dict(scale="cpu", quick=False, device="auto", dataset="shakespeare_char", out_dir="results/study",
                seed=1337, fresh=False, quiet=True)  # quiet=False: the training log lines of every run too

SCALES = {  # the study's model sizes and positions (rotary: with learned ones the masked objectives sat at the
    # character-frequency level, experiments/plateau.py); unique_chars: the data budget; max_epochs: a series' last
    # epoch count (default the last of `epochs`); seeds: every cell up to all_seeds_up_to epochs, and each series' best epoch count
    "cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, position="rope", unique_chars=10_000,
                epochs=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), max_epochs={"gpt": 256, "gpt, dropout 0.2": 256},
                seeds=2, all_seeds_up_to=16, eval_windows=64, eval_iters=20),
    "gpu": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, position="rope", unique_chars=100_000,
                epochs=(1, 2, 4, 8, 16, 32, 64, 128, 256), max_epochs={}, seeds=3, all_seeds_up_to=256,
                eval_windows=256, eval_iters=50),
    "quick": dict(n_layer=1, n_head=2, n_embd=32, block_size=32, batch_size=4, position="rope", unique_chars=2_000,
                  epochs=(1, 2), max_epochs={}, seeds=1, all_seeds_up_to=2, eval_windows=4, eval_iters=2),
}
# each objective at the rate study.py kept for it at the CPU scale (results/study/study-cpu.json, checked by a test)
STUDY_RATES = {"clm": 4e-3, "mlm": 2e-3, "diffusion": 1e-3}
EARLIER_RATE = 1e-3  # the rate of every row recorded before rows carried their own (one rate for all objectives)
PLAN_KEYS = ("epochs", "max_epochs", "seeds", "all_seeds_up_to")  # what to run, not how a run runs
SERIES = [  # name, arch, objective, settings that differ from the study's
    ("gpt", "gpt", "clm", {}),
    ("gpt, dropout 0.2", "gpt", "clm", {"dropout": 0.2}),
    ("diffusion", "bert", "diffusion", {}),
    ("bert", "bert", "mlm", {}),
]


# ----------------------------------------------------------------------------- the data budget

def budget_dataset(splits, meta, unique_tokens, folder):
    """A dataset folder whose train.bin is the first `unique_tokens` tokens of the training split (the only text
    the runs may learn from) and whose val.bin is the whole validation split, untouched. Returns its path."""
    train_ids = np.memmap(splits["train"], dtype=np.uint16, mode="r")
    if unique_tokens > len(train_ids):
        raise UserError(f"unique_chars={unique_tokens} is more than the {len(train_ids)} tokens of the training split")
    os.makedirs(folder, exist_ok=True)
    np.array(train_ids[:unique_tokens]).tofile(os.path.join(folder, "train.bin"))
    shutil.copyfile(splits["val"], os.path.join(folder, "val.bin"))
    val_tokens = os.path.getsize(splits["val"]) // 2
    with open(os.path.join(folder, "meta.pkl"), "wb") as f:
        pickle.dump(dict(meta, train_tokens=unique_tokens, val_tokens=val_tokens), f)
    for split in ("train", "val"):
        written_here(os.path.join(folder, f"{split}.bin"))
    return folder


def at_current_rates(runs):
    """The runs trained at the rate their series trains at now: a row records its rate (rows without one were all
    trained at EARLIER_RATE), so a change of STUDY_RATES reruns only the series it changes."""
    objective = {name: obj for name, _, obj, _ in SERIES}
    return [r for r in runs if r.get("learning_rate", EARLIER_RATE) == STUDY_RATES[objective[r["series"]]]]


def plan_runs(s, runs, base_seed):
    """The (series, epochs, seed) still to run. First every series at each of its epoch counts with the first seed,
    the other seeds at the cheap counts (<= all_seeds_up_to); once those are done, the other seeds at each
    series' best epoch count and at the crossover, so the key points carry a seed spread."""
    seeds = [base_seed + k for k in range(s["seeds"])]
    counts = {name: [e for e in s["epochs"] if e <= s["max_epochs"].get(name, s["epochs"][-1])] for name, *_ in SERIES}
    plan = [(series, e, seed) for seed in seeds for e in s["epochs"] for series in SERIES
            if e in counts[series[0]] and (seed == seeds[0] or e <= s["all_seeds_up_to"])]
    done = {(r["series"], r["epochs"], r["seed"]) for r in runs}
    if all((p[0][0], p[1], p[2]) in done for p in plan):
        _, best, crossover = summarise(runs, s)
        key_points = {(name, e) for name, e in best.items()} | \
            {(name, crossover) for name in ("gpt", "gpt, dropout 0.2", "diffusion") if crossover is not None}
        plan += [(series, e, seed) for seed in seeds[1:] for series in SERIES for e in counts[series[0]]
                 if (series[0], e) in key_points]
    return [p for p in plan if (p[0][0], p[1], p[2]) not in done]


def iterations_for(epochs, unique_tokens, s):
    """Training steps that read `epochs` times the unique data, in windows of batch_size x block_size."""
    return max(1, round(epochs * unique_tokens / (s["batch_size"] * s["block_size"])))


# ----------------------------------------------------------------------------- one run

def train_and_score(name, arch, objective, extra, epochs, seed, s, folder, windows, specials, device, quiet, out_dir):
    """Train one (objective, epochs, seed) run from scratch and score it on the held-out and the training windows.
    Returns the row, or None when the run was interrupted."""
    iterations = iterations_for(epochs, s["unique_chars"], s)
    args = dict(arch=arch, objective=objective, dataset=folder, device=device, out_dir=out_dir,
                n_layer=s["n_layer"], n_head=s["n_head"], n_embd=s["n_embd"], block_size=s["block_size"],
                batch_size=s["batch_size"], position=s["position"], dropout=0.0, bias=False, max_iters=iterations,
                lr_decay_iters=iterations, warmup_iters=min(100, iterations // 10),
                learning_rate=STUDY_RATES[objective], min_lr=STUDY_RATES[objective] / 10, beta2=0.99,
                eval_interval=10 ** 9, eval_iters=s["eval_iters"], log_interval=10 ** 9,
                seed=seed, quiet=quiet, overwrite=True)  # equal_compute.train_all's defaults, the study's rates
    args.update(extra)
    config = train.resolve_config([f"--{k}={v}" for k, v in args.items()])
    t0 = time.perf_counter()
    result = train.train(config)
    if result["interrupted"]:
        return None
    seconds = time.perf_counter() - t0
    model = result["model"].eval()
    row = {"series": name, "epochs": epochs, "seed": seed, "iterations": result["iter_num"],
           "tokens_seen": result["tokens_seen"], "epochs_read": result["tokens_seen"] / s["unique_chars"],
           "seconds": seconds, "loss_val": result["val_loss"], "loss_train": result["train_loss"],
           "learning_rate": STUDY_RATES[objective]}
    for split in ("val", "train"):
        bits, extra_bits = second_half_bits(name, model, windows[split], specials, torch.Generator().manual_seed(seed))
        row[f"chain_bits_{split}"] = bits  # diffusion: its exact chain rule; also its ELBO below
        row[f"elbo_bits_{split}"] = extra_bits.get("elbo_bits")
        row[f"bits_{split}"] = extra_bits.get("elbo_bits", bits)  # the curve: ELBO for diffusion, as the paper
    return row


# ----------------------------------------------------------------------------- summary

def summarise(runs, s):
    """{series: {epochs: (mean, std, n)}} of held-out bits, plus each series' best epoch and the crossover."""
    table = {}
    for name, *_ in SERIES:
        for epochs in s["epochs"]:
            rows = [r for r in runs if r["series"] == name and r["epochs"] == epochs]
            if rows:
                stats = {key: mean_std([r[key] for r in rows]) for key in ("bits_val", "bits_train", "chain_bits_val")}
                table.setdefault(name, {})[epochs] = dict(stats, seeds=len(rows))
    best = {name: min(curve, key=lambda e: curve[e]["bits_val"][0]) for name, curve in table.items()}
    # the crossover: the first epoch count from which diffusion's held-out bound stays below the better gpt's NLL,
    # by more than both seed spreads, at every larger epoch count where gpt runs and at two counts at least (one
    # lucky point does not make a crossover)
    crossover, below = None, 0
    if "diffusion" in table:
        for epochs in reversed(s["epochs"]):
            planned = [g for g in ("gpt", "gpt, dropout 0.2")
                       if g in table and epochs <= s.get("max_epochs", {}).get(g, epochs)]
            if not planned:  # past the gpt series' last epoch count (max_epochs): nothing to compare with here
                continue
            gpts = [table[g][epochs]["bits_val"] for g in planned if epochs in table.get(g, {})]
            if epochs not in table["diffusion"] or len(gpts) < len(planned):  # not measured yet: no verdict past it
                break
            diffusion_mean, diffusion_std = table["diffusion"][epochs]["bits_val"]
            gpt_mean, gpt_std = min(gpts)
            if diffusion_mean + (diffusion_std or 0) >= gpt_mean - (gpt_std or 0):
                break
            crossover, below = epochs, below + 1
        if below < 2:
            crossover = None
    return table, best, crossover


def report(data, s, scale):
    table, best, crossover = summarise(data["runs"], s)
    fmt = lambda ms: "-" if ms[0] is None else f"{ms[0]:.3f}" + ("" if ms[1] is None else f" +- {ms[1]:.3f}")  # noqa: E731
    lines = [QUICK_NOTE, ""] if scale == "quick" else []
    lines += [f"Repeated data (claim X2), scale `{scale}`: {s['n_layer']} layers x {s['n_embd']} dims, "
             f"{s.get('position', 'learned')} positions, block "
             f"{s['block_size']}, batch {s['batch_size']}; unique data = the first {s['unique_chars']:,} characters "
             f"of the training split; each cell its own run with its own cosine schedule; held-out = "
             f"{s['eval_windows']} windows of the validation split, train = {s['eval_windows']} windows of the unique "
             f"data; metric = bits/char of a window's second half given its first half (gpt: exact NLL; diffusion: "
             f"ELBO, an upper bound on its NLL; bert: left-to-right chain rule with [MASK] placeholders); mean +- std "
             f"over seeds (n per cell in the last column). On {data.get('machine', data['device'])}, "
             f"{data['seconds'] / 60:.1f} min for the runs recorded here.", "",
             "| objective | epochs | held-out bits/char | train bits/char | diffusion: exact chain rule, held-out "
             "| seeds |", "|---|---|---|---|---|---|"]
    for name, curve in table.items():
        for epochs, cell in curve.items():
            mark = " **(best)**" if best[name] == epochs else ""
            chain = fmt(cell["chain_bits_val"]) if name == "diffusion" else ""
            lines.append(f"| {name} | {epochs}{mark} | {fmt(cell['bits_val'])} | {fmt(cell['bits_train'])} | "
                         f"{chain} | {cell['seeds']} |")
    lines += ["", f"Character frequencies of the unique data (trivial rule): {data['character_frequency_bits']:.3f} "
                  f"bits/char held-out."]
    if table:
        lines.append("Best epoch count per objective (lowest held-out mean): " +
                     ", ".join(f"{n} {best[n]} ({table[n][best[n]]['bits_val'][0]:.3f})" for n in table) + ".")
    lines.append(f"Crossover (the first epoch count from which diffusion's held-out ELBO stays below the better gpt's "
                 f"exact NLL by more than both seed spreads, at two epoch counts at least): "
                 f"{crossover if crossover is not None else 'none in this range'}.")
    floor = data["character_frequency_bits"]
    near_floor = [n for n in table if table[n][best[n]]["bits_val"][0] > floor - 0.1]
    if near_floor:
        lines.append(f"Never more than 0.1 bit below the character-frequency level at any epoch count: "
                     f"{', '.join(near_floor)}: at this scale these objectives learned next to nothing beyond "
                     f"character frequencies, so the comparison says little about them.")
    if data.get("not_done"):
        lines += ["", f"**Interrupted: {len(data['not_done'])} runs not done (rerun the same command to finish).**"]
    return "\n".join(lines), table, best


def plot(table, best, data, path):
    """Held-out bits/char against epochs (log x), one line per objective, the best epoch marked."""
    plt = pyplot()
    if plt is None:
        return
    fig, axis = plt.subplots(figsize=(7, 4.5))
    for name, curve in table.items():
        epochs = sorted(curve)
        means = np.array([curve[e]["bits_val"][0] for e in epochs])
        stds = np.array([curve[e]["bits_val"][1] or 0.0 for e in epochs])  # None: one seed
        label = {"diffusion": "diffusion (ELBO: upper bound on NLL)", "bert": "bert (left-to-right chain rule)"}
        line, = axis.plot(epochs, means, marker="o", label=label.get(name, f"{name} (exact NLL)"))
        axis.fill_between(epochs, means - stds, means + stds, color=line.get_color(), alpha=0.2)
        axis.plot([best[name]], [curve[best[name]]["bits_val"][0]], marker="*", markersize=16, color=line.get_color())
    axis.axhline(data["character_frequency_bits"], color="grey", linestyle=":", label="character frequencies")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("epochs over the unique data (each point its own run)")
    axis.set_ylabel("held-out bits/char (2nd half | 1st half)")
    axis.set_title(f"Repeated data: {data['unique_chars']:,} unique characters (star = best epoch)")
    axis.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path, dpi=120)


def seconds_left(timings, todo):
    """The runs still to do, at seconds = fixed + per_epoch * epochs fitted to the runs so far (a small run is
    mostly its fixed cost: evaluation, building the model)."""
    epochs, seconds = np.array(timings, dtype=float).T
    if len(set(epochs)) > 1:
        per_epoch, fixed = np.polyfit(epochs, seconds, 1)
    else:
        per_epoch, fixed = seconds.mean() / epochs.mean(), 0.0
    return sum(max(0.0, fixed) + max(0.0, per_epoch) * p[1] for p in todo)


# ----------------------------------------------------------------------------- the experiment

def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES, "epochs")
    s = SCALES[scale]
    splits, meta = load_dataset(config["dataset"], s["block_size"], prepare_if_missing=True)
    if meta["tokenizer"] != "char":  # the budget and the metric are in characters
        raise UserError(f"--dataset={config['dataset']} is {meta['tokenizer']}-level: the data budget and bits/char "
                        f"need a character-level dataset (shakespeare_char)")
    work = os.path.abspath(os.path.join(config["out_dir"], "checkpoints", f"epochs-{scale}"))
    folder = budget_dataset(splits, meta, s["unique_chars"], os.path.join(work, "data"))
    specials = objectives.Specials.from_meta(meta)
    rng = np.random.default_rng(config["seed"] + 7)  # the same held-out windows for every run
    windows = {split: get_windows(os.path.join(folder, f"{split}.bin"), s["eval_windows"], s["block_size"] - 2,
                                  rng).to(device) for split in ("val", "train")}
    # a finished run is reused when everything that defines it is the same; the plan may grow (PLAN_KEYS)
    settings = {"scale": scale, "seed": config["seed"], "dataset": config["dataset"],
                **{k: v for k, v in s.items() if k not in PLAN_KEYS}}  # the rates: each row's own (at_current_rates)
    json_path = os.path.join(config["out_dir"], f"epochs-{scale}.json")
    runs = []
    if os.path.exists(json_path) and not config["fresh"]:
        with open(json_path) as f:
            previous = json.load(f)
        if previous.get("settings") == settings:
            runs = at_current_rates(previous["runs"])
            print(f"reusing {len(runs)} finished runs from {json_path} (--fresh=True to start over; "
                  f"{len(previous['runs']) - len(runs)} at another rate than their series' now dropped)", flush=True)
        else:  # never replaced by a partial run unasked
            raise UserError(f"{json_path} holds {len(previous.get('runs', []))} runs of other settings: --fresh=True "
                            f"replaces them (from its first finished run on), or --out_dir=<another folder>")
    todo = plan_runs(s, runs, config["seed"])
    data = {"settings": settings, "device": device, "machine": machine_name(device), "unique_chars": s["unique_chars"], "runs": runs,
            "character_frequency_bits": character_frequency_bits(os.path.join(folder, "train.bin"), windows["val"],
                                                                 specials.num_ordinary)}
    os.makedirs(config["out_dir"], exist_ok=True)
    timings, number = [], 0  # (epochs, seconds) of this invocation's runs, for the time left
    stopped = False
    try:
        with StopSignals(immediate=True):  # train.train catches the first signal itself and saves; see below
            while todo:
                (name, arch, objective, extra), epochs, seed = todo[0]
                number += 1
                eta = f", ~{format_duration(seconds_left(timings, todo))} left" if len(timings) > 1 else ""
                print(f"[epochs] run {number}/{number + len(todo) - 1}: {name}, {epochs} epochs, seed {seed}{eta} "
                      f"(more seeds at the best epoch counts once these are done)", flush=True)
                row = train_and_score(name, arch, objective, extra, epochs, seed, s, folder, windows, specials,
                                      device, config["quiet"], os.path.join(work, name.replace(", ", "-")))
                if row is None:
                    raise KeyboardInterrupt
                runs.append(row)
                timings.append((epochs, row["seconds"]))
                print(f"  held-out {row['bits_val']:.3f} bits/char, train {row['bits_train']:.3f} "
                      f"({row['iterations']} iterations, {row['seconds']:.0f} s)", flush=True)
                data["seconds"] = sum(r["seconds"] for r in runs)
                write_atomically(json_path, json.dumps(data, indent=1))
                todo = plan_runs(s, runs, config["seed"])
    except KeyboardInterrupt:
        data["not_done"] = [f"{p[0][0]} x{p[1]} seed {p[2]}" for p in plan_runs(s, runs, config["seed"])]
        print(f"interrupted: {len(runs)} runs finished and kept, {len(data['not_done'])} not done; rerun the same "
              f"command to continue", flush=True)
        stopped = True
    data["seconds"] = sum(r["seconds"] for r in runs)
    text, table, best = report(data, s, scale)
    print("\n" + text)
    write_atomically(json_path, json.dumps(data, indent=1), os.path.join(config["out_dir"], f"epochs-{scale}.md"),
                     text + "\n")
    if table:
        plot(table, best, data, os.path.join(config["out_dir"], f"epochs-{scale}.png"))
    print(f"wrote {os.path.join(config['out_dir'], f'epochs-{scale}')}.md, .json and .png", flush=True)
    if stopped:
        sys.exit(130)  # a stop, after writing what finished (docs/reliability.md)


if __name__ == "__main__":
    run_main(main, interrupted="the finished runs are kept: the same command goes on from them")
