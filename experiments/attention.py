"""
Question: what does each mask let a position read, and what did training do with it? The four masks as one
picture, and the attention maps of the study's trained gpt and bert side by side (claims A1 and D1: one stack,
two masks).

    python experiments/attention.py            # seconds, no training: the four masks drawn from masks.py
                                               # (results/study/masks.{json,png}) and the trained maps read
                                               # from the committed summary, results/study/attention-cpu.*
    python experiments/attention.py --retrain=True  # measure the maps again from the study's gpt and bert
                                               # (seed 1337, rotary positions, each at its kept rate): 0.1
                                               # minutes when the study's checkpoints are there, else they
                                               # train first (~4 minutes on 2 cores, --jobs=2)
    python experiments/attention.py --quick    # tiny models trained for seconds (the test suite runs it)

Each model reads eval_windows held-out windows of the study. Per layer, averaged over heads, windows and query
positions: the attention a position gives itself, its left neighbour, its right neighbour (none for gpt: the mask
forbids it) and everything to its right, and the mean distance to what it reads; beside each, what attention
spread evenly over the positions the mask allows would give. The picture: every layer's map (heads averaged) of
the first PICTURE_LENGTH characters of the first window, gpt on top, bert below: the mask is the shape (a triangle
against a square), training is what fills it.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/attention.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import torch

from experiments import study
from masks import bidirectional_mask, causal_mask, flattened_encoder_decoder_mask, prefix_lm_mask
from experiments.equal_compute import machine_line, resolve_experiment, write_results
from infra.attention_maps import attention_maps
from infra.configurator import QUICK_NOTE, UserError, run_main
from infra.dataset import load_dataset
from infra.plots import pyplot, save
from infra.progress import write_atomically

DEFAULTS = dict(scale="cpu", quick=False, device="auto", dataset="shakespeare_char", out_dir="results/study",
                seed=1337, quiet=True,
                retrain=False,  # True: measure the trained maps again (--quick always does), not read the summary
                jobs=1)  # when the study's checkpoints are missing: how many of the two train at once
PICTURE_LENGTH = 32  # characters drawn (the statistics read every position of every window)
MODELS = ("gpt", "bert")
MASK_LENGTH, MASK_PREFIX = 8, 4  # the masks picture: 8 positions, a prefix (t5: an encoder) of 4


# ----------------------------------------------------------------------------- the four masks, untrained

def mask_data():
    """The four masks of masks.py as 0/1 grids (True = the query row may read the key column), the picture's JSON."""
    half = MASK_LENGTH - MASK_PREFIX
    grids = {"gpt: causal": causal_mask(MASK_LENGTH),
             "bert: bidirectional": bidirectional_mask(MASK_LENGTH),
             f"prefixlm: a prefix of {MASK_PREFIX}": prefix_lm_mask(torch.tensor([MASK_PREFIX]), MASK_LENGTH)
                 .reshape(MASK_LENGTH, MASK_LENGTH),
             f"t5: encoder {MASK_PREFIX} + decoder {half}, flattened":
                 flattened_encoder_decoder_mask(MASK_PREFIX, half)}
    return {"length": MASK_LENGTH, "prefix": MASK_PREFIX,
            "masks": {name: grid.int().tolist() for name, grid in grids.items()}}


def plot_masks(data, path):
    """One panel a mask: a dark cell = the row's position may read the column's (claim A1: one stack, four masks)."""
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(data["masks"]), figsize=(3.0 * len(data["masks"]), 3.7))
    for axis, (name, grid) in zip(axes, data["masks"].items()):
        axis.imshow(grid, cmap="Greys", vmin=0, vmax=1.4)
        axis.set_title(name, fontsize=9)
        ticks = range(data["length"])
        axis.set_xticks(ticks, [str(i) for i in ticks], fontsize=7)
        axis.set_yticks(ticks, [str(i) for i in ticks], fontsize=7)
        axis.set_xlabel("key (position read)", fontsize=8)
        axis.set_ylabel("query (position reading)", fontsize=8)
        if name.startswith(("prefixlm", "t5")):  # where the prefix (t5: the encoder) ends
            for line in (axis.axvline, axis.axhline):
                line(data["prefix"] - 0.5, color="tab:red", linewidth=1)
    fig.suptitle("The four architectures are four attention masks (masks.py). prefixlm and t5 draw the same "
                 "pattern: t5 reads it with two stacks of weights, the encoder's and the decoder's (claim A2)",
                 fontsize=9)
    fig.tight_layout()
    save(fig, path, dpi=110)


# ----------------------------------------------------------------------------- what training does with them


def attention_statistics(maps, arch):
    """maps: a layer's (N, nh, T, T) probabilities -> the shares and distance of the module's docstring, and the
    same for attention spread evenly over what arch's mask allows."""
    A = maps.mean(dim=(0, 1))  # (T, T): heads and windows averaged
    T = A.size(0)
    allowed = (causal_mask if arch == "gpt" else bidirectional_mask)(T).float()  # (T, T), 1 where it may read
    even = allowed / allowed.sum(dim=-1, keepdim=True)
    i = torch.arange(T)
    distance = (i[:, None] - i[None, :]).abs().float()
    future = torch.triu(torch.ones(T, T), diagonal=1)

    def shares(P):
        return {"itself": float(P.diagonal().mean()), "left neighbour": float(P.diagonal(-1).mean()),
                "right neighbour": float(P.diagonal(1).mean()), "right of it": float((P * future).sum(-1).mean()),
                "mean distance": float((P * distance).sum(-1).mean())}
    return {"trained": shares(A), "even over the mask": shares(even)}


def report(data):
    lines = [QUICK_NOTE, ""] if data["scale"] == "quick" else []
    lines += [f"Attention of the study's trained gpt and bert, scale `{data['scale']}` ({data['n_layer']} layers x "
              f"{data['n_head']} heads, {data['position']} positions; seed {data['seed']}, each at its kept rate: "
              + ", ".join(f"{n} {r:g} (validation loss {data['val_loss'][n]:.3f})" for n, r in data['rates'].items())
              + " (each on its own objective: the two losses are not comparable)"
              + f"), on {data['windows']} held-out windows of {data['length']} characters; {data['machine']}. "
              f"Per layer, heads, windows and query positions averaged: the attention a position gives itself, "
              f"its left and right neighbours and all positions to its right (a share of 1), and the mean distance "
              f"(characters) to what it reads; in brackets what attention spread evenly over the positions its "
              f"mask allows would give.", "",
              "| model | layer | itself | left neighbour | right neighbour | right of it | mean distance |",
              "|---|---|---|---|---|---|---|"]
    for name in MODELS:
        for layer, stats in enumerate(data["statistics"][name]):
            cells = [f"{stats['trained'][key]:.3f} ({stats['even over the mask'][key]:.3f})"
                     for key in ("itself", "left neighbour", "right neighbour", "right of it")]
            even = stats["even over the mask"]["mean distance"]
            cells.append(f"{stats['trained']['mean distance']:.1f} ({even:.1f})")
            lines.append(f"| {name} | {layer} | " + " | ".join(cells) + " |")
    lines += ["", "gpt gives nothing to its right in any layer (the causal mask: claim A1); what bert gives there is "
                  "what it learned to use of the right context (claim D1). Picture: attention-"
                  f"{data['scale']}.png (the first {data['picture_length']} characters of the first window: "
                  f"{data['picture_text']!r})."]
    return lines


def plot(data, path):
    """Every layer's map of the picture's characters, gpt on the first row, bert on the second."""
    plt = pyplot()
    if plt is None:
        return
    layers = len(data["picture"]["gpt"])
    fig, axes = plt.subplots(len(MODELS), layers, figsize=(3.2 * layers, 3.4 * len(MODELS)), squeeze=False)
    for row, name in enumerate(MODELS):
        for layer, matrix in enumerate(data["picture"][name]):
            axis = axes[row][layer]
            axis.imshow(matrix, cmap="viridis", vmin=0.0, vmax=max(max(r) for r in matrix))
            axis.set_title(f"{name}, layer {layer}", fontsize=9)
            axis.set_xlabel("position read (key)", fontsize=7)
            axis.set_ylabel("position reading (query)", fontsize=7)
            axis.tick_params(labelsize=6)
    fig.suptitle(f"Attention, heads averaged: {data['picture_text']!r}", fontsize=9)
    fig.tight_layout()
    save(fig, path, dpi=110)


def main():
    config, scale, device = resolve_experiment(DEFAULTS, study.SCALES, "attention")
    t0 = time.perf_counter()
    if scale != "quick":  # the untrained masks: drawn from masks.py in a second
        base = os.path.join(config["out_dir"], "masks")
        write_atomically(base + ".json", json.dumps(mask_data(), indent=1))
        plot_masks(mask_data(), base + ".png")
        print(f"drew the four masks of masks.py: {base}.png", flush=True)
    summary = os.path.join(config["out_dir"], f"attention-{scale}.json")
    if not config["retrain"] and scale != "quick":  # the trained maps: the committed summary, redrawn
        try:
            with open(summary) as f:
                data = json.load(f)
            text = "\n".join(report(data))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{summary} cannot be read ({type(e).__name__}): --retrain=True measures the maps "
                            f"again (the study's gpt and bert, trained first where their checkpoints are missing)")
        print("\n" + text)
        plot(data, summary[:-len(".json")] + ".png")
        print(f"\nread {summary} and redrew its picture (--retrain=True measures the maps again)", flush=True)
        return
    s = study.SCALES[scale]
    splits, meta = load_dataset(config["dataset"], s["block_size"], prepare_if_missing=True)
    study_json = os.path.join(config["out_dir"], f"study-{scale}.json")
    try:  # the rates the study kept (its committed result file)
        with open(study_json) as f:
            kept = json.load(f)["chosen_learning_rate"]
        rates = {name: kept[name] for name in MODELS}
    except (OSError, ValueError, KeyError, TypeError):
        rates = {name: s["learning_rates"][0] for name in MODELS}
        print(f"[attention] no study result in {study_json}: each model at the grid's first rate, "
              f"{s['learning_rates'][0]:g}", flush=True)
    by_name = {model[0]: model for model in study.MODELS}
    folder = os.path.join(config["out_dir"], "checkpoints", scale)
    seed = config["seed"]
    runs = {name: study.study_run(by_name[name], rates[name], seed, f"{folder}-lr{rates[name]:g}-seed{seed}-{name}")
            for name in MODELS}  # the study's own folders: its finished runs are loaded, not retrained
    for name, run in runs.items():  # ... never retrained in place: a run of other settings would replace the study's
        record = os.path.join(run[3]["out_dir"], "study_run.json")
        try:
            with open(record) as f:
                done = json.load(f)["settings"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # no finished run there: it trains (the study would have trained the same)
        differ = [f"{key} {done.get(key)!r}" for key, value in (("dataset", config["dataset"]), ("device", device))
                  if done.get(key) != value]
        if differ:
            raise UserError(f"{run[3]['out_dir']} holds the study's {name} run, trained with {', '.join(differ)}: "
                            f"run with those settings, or pass --out_dir=<another folder> to train this command's own")
    trained = study.train_runs(runs, s, dict(config, reuse=True), device, meta)
    if trained is None:
        raise KeyboardInterrupt  # run_main: status 130, the runs finished are kept
    windows = study.evaluation_windows(splits, s, seed, device)[0]  # (N, T) held-out characters
    itos = meta["itos"]
    data = {"scale": scale, "seed": seed, "rates": rates, "n_layer": s["n_layer"], "n_head": s["n_head"],
            "position": s.get("position", "learned"), "windows": windows.size(0), "length": windows.size(1),
            "picture_length": PICTURE_LENGTH, "val_loss": {n: trained[n]["val_loss"] for n in MODELS},
            "picture_text": "".join(itos[i] if isinstance(itos, list) else itos[str(i)]
                                    for i in windows[0, :PICTURE_LENGTH].tolist()),
            "statistics": {}, "picture": {}}
    for name in MODELS:
        maps = [m.cpu() for m in attention_maps(trained[name]["model"].eval(), windows)]  # per layer (N, nh, T, T)
        data["statistics"][name] = [attention_statistics(m, name) for m in maps]
        data["picture"][name] = [[[round(float(v), 4) for v in row]
                                  for row in m[0, :, :PICTURE_LENGTH, :PICTURE_LENGTH].mean(0)] for m in maps]
    data.update(machine=machine_line(device, config), seconds=time.perf_counter() - t0)
    write_results(config["out_dir"], f"attention-{scale}", data, "\n".join(report(data)), plot)


if __name__ == "__main__":
    run_main(main, interrupted="the runs finished so far are kept: the same command goes on from them")
