"""
What the structural experiments (experiments/reversal.py, experiments/planning.py) share: a synthetic char-level
dataset written like any prepared one, the one way each architecture fills the answer slots of a question, and
(with experiments/tagging.py) how a result is written.

    suffix layout   the answer follows the prompt ("kxqb>" -> "MZRT"):
                    gpt, prefixlm  greedy, left to right (prefixlm: the prompt is its bidirectional prefix)
                    bert           [MASK] in every slot, then what follows them in a training window (the newline
                                   and the next line), filled by sample.unmask
                    t5             the prompt, <S0> for the slots and what follows them to the encoder; the
                                   decoder writes <S0> then the answer, greedy
    infill layout   the slots stand inside the prompt as [MASK]s ("????>MZRT" -> "kxqb"): what only a model that
                    reads both sides can be asked; bert unmasks them, t5 reads <S0> in their place, and gpt and
                    prefixlm have no way to (None)

Answers are exact: argmax (temperature 0) at every step, over the text characters only.
"""
import sys

if __name__ == "__main__":  # beside the commands, but not one: one line, not an import error
    sys.exit("structural.py: a helper of reversal.py, planning.py and tagging.py, not a command: "
             "experiments/README.md lists the commands")

import os
import pickle
import time

import numpy as np
import torch

import sample
from data.prepare_common import write_dataset
from experiments.equal_compute import machine_line, write_results
from infra.configurator import UserError
from infra.progress import check_writable


SETTINGS = dict(position="rope", learning_rate=3e-3, min_lr=3e-4)  # every model: rotary positions (a line starts
# anywhere in a training window), the rate of a short run


def compared_models(reversed_dataset):
    """Every objective the project has, as train_all's (name, arch, objective, settings), plus gpt trained on the
    experiment's reversed text (its dataset folder: reversed_dataset; reversal: every line also written backwards,
    character by character; planning: every path written from the goal to the start)."""
    models = [("gpt", "gpt", "clm", {}), ("gpt-reversed", "gpt", "clm", {"dataset": reversed_dataset}),
              ("bert", "bert", "mlm", {}), ("diffusion", "bert", "diffusion", {}),
              ("prefixlm", "prefixlm", "prefix_lm", {}), ("t5", "t5", "span_corruption", {}), ("t5-ul2", "t5", "ul2", {})]
    return [(name, arch, objective, dict(SETTINGS, **extra)) for name, arch, objective, extra in models]


def result_name(config, names, name, scale, gpt_iters=None):
    """Check --models (all, or some of `names`, comma-separated) and --budget (a multiple of the scale's FLOPs
    budget: at what budget does a model that fails the positive control pass?) before any work, and name the
    result: <name>-<scale>, plus the models' names and -x<budget> when they are not the defaults (a partial run
    never overwrites the whole one). Its files are checked writable here too."""
    asked = names if config["models"] == "all" else config["models"].split(",")
    if not asked or any(n not in names for n in asked):
        raise UserError(f"--models={config['models']}: choose all, or some of {', '.join(names)} (comma-separated)")
    wanted = [n for n in names if n in asked]  # in the experiment's order, each once: one name per set
    if not isinstance(config["budget"], (int, float)) or not 0 < config["budget"] <= 1000:
        raise UserError(f"--budget={config['budget']}: a multiple of the scale's FLOPs budget, in (0, 1000]")
    if gpt_iters and config["budget"] * gpt_iters < 1:  # a run trains whole steps: at least one
        raise UserError(f"--budget={config['budget']:g}: {config['budget'] * gpt_iters:.3g} gpt iterations is less than "
                        f"one training step; use --budget={1 / gpt_iters:.3g} or more")
    result = f"{name}-{scale}" + ("" if config["models"] == "all" else "-" + "-".join(wanted)) \
        + ("" if config["budget"] == 1 else f"-x{config['budget']:g}")
    check_writable([os.path.join(config["out_dir"], result + extension) for extension in (".md", ".json")])
    return result


def select(config, models, work):
    """The models --models names (checked by result_name), each at --budget times the FLOPs budget, and the folder
    for their checkpoints: `work`, or beside it for another budget (a run at x4 never replaces one at x1)."""
    wanted = config["models"].split(",")
    chosen = [(n, arch, objective, dict(extra, budget_fraction=config["budget"]))
              for n, arch, objective, extra in models if config["models"] == "all" or n in wanted]
    return chosen, work if config["budget"] == 1 else f"{work}-x{config['budget']:g}"


def char_dataset(folder, train_text, val_text, characters):
    """A prepared char-level dataset folder: train.bin holds exactly train_text, val.bin val_text (no training
    text is lost to a 90/10 split). characters: every character the texts and the questions may hold."""
    chars = sorted(set(characters))
    stoi = {c: i for i, c in enumerate(chars)}
    os.makedirs(folder, exist_ok=True)
    ids = [stoi[c] for c in train_text + val_text]
    if holds(folder, ids, len(train_text), stoi):  # written the same before: left alone, since another run of the
        return stoi                                 # experiment may be reading it (it would see a change)
    write_dataset(folder, ids, {"tokenizer": "char", "num_ordinary": len(chars), "stoi": stoi, "itos": chars},
                  train_tokens=len(train_text))
    return stoi


def holds(folder, ids, train_tokens, stoi):
    """Whether a dataset folder already holds exactly these ids, split at train_tokens, with this vocabulary."""
    paths = [os.path.join(folder, name) for name in ("train.bin", "val.bin", "meta.pkl")]
    if not all(os.path.isfile(path) for path in paths):
        return False
    with open(paths[2], "rb") as f:
        meta = pickle.load(f)
    return meta.get("stoi") == stoi and all(
        np.array_equal(np.fromfile(path, dtype=np.uint16), part)
        for path, part in zip(paths[:2], (ids[:train_tokens], ids[train_tokens:])))


@torch.no_grad()
def greedy_continuation(model, ids, length, text_ids):
    """gpt / prefixlm: `length` greedy tokens after ids (B, P), recomputing the whole row each step (answers are a
    few characters: the KV cache would change nothing but speed). prefixlm reads the prompt as its prefix."""
    prefix = torch.full((ids.size(0),), ids.size(1), device=ids.device) if model.config.arch == "prefixlm" else None
    for _ in range(length):
        logits = model(ids, prefix_length=prefix)[0][:, -1]
        ids = torch.cat([ids, text_ids[logits[:, text_ids].argmax(-1)][:, None]], dim=1)
    return ids[:, -length:]


@torch.no_grad()
def fill_slots(model, prompts, slots, specials, stoi, order="confident", after="\n", mode=None):
    """The answer each row of `prompts` gets, as strings. prompts: strings of one length; slots: the positions to
    fill (the suffix layout: slots == len(prompt) .. len(prompt) + n - 1; else the infill layout, slots inside the
    prompt, which hold a placeholder character). `after`: what follows the slots, one string or one per row (all
    of one length): bert and t5 read it, the causal readers never need it. mode: a t5 trained with UL2 reads the
    mode token its span-filling denoisers were trained with first (specials.modes["R"]), as in training. Returns
    None where the architecture cannot be asked."""
    device = next(model.parameters()).device
    arch, P = model.config.arch, len(prompts[0])
    itos = {i: c for c, i in stoi.items()}
    text_ids = torch.arange(specials.num_ordinary, device=device)
    banned = torch.arange(specials.num_ordinary, model.config.vocab_size, device=device)
    suffix = slots == list(range(P, P + len(slots)))
    ids = torch.tensor([[stoi[c] for c in p] for p in prompts], device=device)  # (B, P)
    afters = [after] * len(prompts) if isinstance(after, str) else after
    tail = torch.tensor([[stoi[c] for c in a] for a in afters], device=device)  # (B, len(after))
    if arch in ("gpt", "prefixlm"):
        if not suffix:
            return None
        out = greedy_continuation(model, ids, len(slots), text_ids)
    elif arch == "bert":
        x = torch.cat([ids, torch.full((len(prompts), len(slots)), specials.mask, device=device), tail], dim=1) \
            if suffix else torch.cat([ids, tail], dim=1)
        x[:, slots] = specials.mask
        to_fill = torch.zeros_like(x, dtype=torch.bool)
        to_fill[:, slots] = True
        sample.unmask(model, x, to_fill, len(slots), sample.Sampling(0, banned=banned, order=order))
        out = x[:, slots]
    else:  # t5: the slots become one span, <S0>, in the encoder's input; the decoder writes the span
        start, end = slots[0], slots[-1] + 1
        sentinel = torch.full((len(prompts), 1), specials.sentinels[0], device=device)
        # every source span corruption makes ends with a span (its last sentinel, then [EOS]): so does this one,
        # <S1> after the right context, as in training; only <S0>'s span is read
        last_span = torch.full((len(prompts), 2), specials.eos, device=device)
        last_span[:, 0] = specials.sentinels[1]
        encoder = torch.cat([ids[:, :start], sentinel, ids[:, end:] if not suffix else ids[:, P:], tail, last_span],
                            dim=1)
        if mode is not None:  # UL2: every source it was trained on starts with its denoiser's mode token
            encoder = torch.cat([torch.full((len(prompts), 1), mode, device=device), encoder], dim=1)
        decoder = torch.cat([torch.full((len(prompts), 1), specials.pad, device=device), sentinel], dim=1)
        memory = model.encode(encoder)
        for _ in range(len(slots)):
            logits = model.logits(model.decode(decoder, memory))[:, -1]
            decoder = torch.cat([decoder, text_ids[logits[:, text_ids].argmax(-1)][:, None]], dim=1)
        out = decoder[:, 2:]
    return ["".join(itos[i] for i in row) for row in out.tolist()]


def exact_and_per_character(answers, truths):
    """(exact-match accuracy, per-character accuracy) of answer strings against the truth: the first is this
    project's score, the second the one Kitouni et al. (2024) report in their retrieval table."""
    answers = list(answers)
    exact = sum(a == t for a, t in zip(answers, truths)) / len(truths)
    characters = sum(x == y for a, t in zip(answers, truths) for x, y in zip(a, t)) / sum(len(t) for t in truths)
    return exact, characters


def mode_of(result, specials):
    """The mode token fill_slots gives a t5 trained with UL2 (its span-filling denoiser's, R), else None."""
    return specials.modes["R"] if result["objective"] == "ul2" else None


def run_record(result):
    """What a model's row keeps of train_all's summary besides its scores: its cost, and whether it was reused."""
    return {"val_loss": result["val_loss"], "flops": result["flops"], "seconds": result["seconds"],
            "reused": bool(result.get("reused"))}


def time_spent(data):
    """The command's own time, and the training time of all its runs (reused ones were trained by an earlier
    command of the same settings: the command's time alone would hide them)."""
    runs = [run for seed in data["runs"] for run in seed["models"].values()]
    reused = sum(run.get("reused", False) for run in runs)
    return (f"{data['seconds'] / 60:.1f} min for this command; training {sum(run['seconds'] for run in runs) / 60:.1f} "
            f"min summed over its {len(runs)} runs" + (f", {reused} of them reused from an earlier command" if reused
                                                      else ""))


def write_seeds(result, config, scale, device, seeds_trained, started, extra, report):
    """The end of a structural experiment: its data (train_and_evaluate_seeds' (runs, budget, interrupted), the
    machine, the time, and `extra`) and report(data) written as out_dir/<result>.{json,md}. A stop ends the
    command with status 130 once what finished is written; a stop before any seed finished writes nothing."""
    runs, budget, interrupted = seeds_trained
    if not runs:
        raise KeyboardInterrupt  # run_main says what is kept
    runs_trained = sum(len(run["models"]) for run in runs)
    data = dict({"scale": scale, "machine": machine_line(device, config, runs_trained),
                 "seeds": [run["seed"] for run in runs],
                 "runs": runs, "interrupted": interrupted, "budget_flops": budget,
                 "seconds": time.perf_counter() - started}, **extra)
    write_results(config["out_dir"], result, data, report(data))
    if interrupted:
        raise KeyboardInterrupt


