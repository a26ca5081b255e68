"""
Generate from a checkpoint written by train.py.

    python sample.py --out_dir=out-gpt --start="ROMEO:" --max_new_tokens=240
    python sample.py --out_dir=out-gpt --no_cache          # full recomputation each token, for comparison
    python sample.py --out_dir=out-bert --steps=16         # mask-predict: N [MASK]s filled over 16 forward passes
    python sample.py --init_from=gpt2 --start="The king"   # published weights (pretrained.py; transformers, the hub)
    python sample.py --out_dir=out-gpt --compile=True --num_samples=32  # compiled decoding, 32 streams, one prefill

gpt, prefixlm and t5 decode left to right with a KV cache (kvcache.py). bert cannot (claim D4): its conditionals
do not chain into a left-to-right density (claim C4), so it fills [MASK] placeholders by iterative unmasking,
which is also the sampler of a masked-diffusion model (--objective=diffusion). Every run prints the text, the
number of forward passes and the decode speed.
"""
import os
import sys
import time

import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import torch

from infra.checkpoint import load_model
from infra.configurator import UserError, apply_overrides, check_compiler, pick_device, read_text_file, run_main
from infra.pretrained import tokenizer_for
from kvcache import UNMASK_ORDERS, generate, iterative_unmask
from objectives import Specials
from infra.progress import StopSignals

DEFAULTS = dict(
    init_from="",             # "" = the checkpoint in out_dir; or gpt2, bert-base-uncased, t5-small, a folder (HF)
    out_dir="out-gpt",
    checkpoint="ckpt.pt",     # or best.pt
    start="\n",               # prompt text, or FILE:path to read it from a file
    num_samples=3,
    max_new_tokens=200,
    temperature=0.8,          # 0 = greedy
    top_k=200,                # 0 = no top-k
    seed=1337,
    device="auto",
    no_cache=False,           # recompute the whole sequence for every new token
    steps=32,                 # bert / diffusion: forward passes of iterative unmasking
    order="confident",        # bert / diffusion: reveal the most confident positions first, the largest top-2
                              # margin (margin), or random ones
    block_length=0,           # bert / diffusion: > 0 = semi-autoregressive blocks left to right
    compile=False,            # gpt / prefixlm / t5: torch.compile the one-token decoding step (bench.py 4c)
)


# ----------------------------------------------------------------------------- the command

def read_prompt(start):
    """--start: the prompt as typed, or FILE:path to read it from a text file."""
    return read_text_file(start[5:], "prompt file") if start.startswith("FILE:") else start


COMPILED_NOTE = ", compiled decoding step (the time includes compiling it: seconds, once per process)"


def generate_left_to_right(model, ids, objective, specials, config, generator, stop):
    """gpt / prefixlm / t5: one new token per forward pass, with the KV cache (or recomputing, --no_cache).
    Returns (texts' token lists, what ran)."""
    device = next(model.parameters()).device
    all_specials = specials.special_ids(model.config.vocab_size, device)
    settings = dict(max_new_tokens=config["max_new_tokens"], num_samples=config["num_samples"],
                    temperature=config["temperature"], top_k=config["top_k"] or None, generator=generator,
                    use_cache=not config["no_cache"], stop=stop, compiled=config["compile"])
    # what the model reads first is laid out as in training: after span corruption (t5, or prefixlm's flattened
    # copy of it, claim A2) the text ends in a masked span, <S0> [EOS], which the model fills (its sentinels
    # allowed); UL2's sequential denoiser reads [S2S] first; otherwise the text itself
    source, banned = ids, all_specials
    if objective == "span_corruption":
        source = ids + [specials.sentinels[0], specials.eos]
        banned = torch.tensor([specials.pad, specials.mask, *specials.modes.values()], device=device)
    elif objective == "ul2":
        source = [specials.modes["S"]] + ids
    if model.config.arch == "t5":
        tokens = generate(model, None, encoder_inputs=torch.tensor([source], device=device),
                          start_token=specials.pad, banned=banned, **settings)
        how = "encoder + decoder recomputed per token" if config["no_cache"] else "encoder once, cached decoder"
        return [row[1:] for row in tokens.tolist()], (how + COMPILED_NOTE if config["compile"] else how)
    tokens = generate(model, torch.tensor([source], device=device), banned=banned, **settings)
    how = "full recomputation per token" if config["no_cache"] else "KV cache (one shared prefill, one position per step)"
    return [row[len(source):] for row in tokens.tolist()], (how + COMPILED_NOTE if config["compile"] else how)


def generate_by_unmasking(model, ids, specials, config, generator, stop):
    """bert (mlm or diffusion): [MASK] placeholders after the prompt, filled over --steps bidirectional passes."""
    device = next(model.parameters()).device
    all_specials = specials.special_ids(model.config.vocab_size, device)
    tokens, passes = iterative_unmask(model, torch.tensor([ids], device=device), num_new=config["max_new_tokens"],
                                      steps=config["steps"], mask_id=specials.mask,
                                      num_samples=config["num_samples"], temperature=config["temperature"],
                                      top_k=config["top_k"] or None, order=config["order"],
                                      block_length=config["block_length"], generator=generator, banned=all_specials,
                                      stop=stop)
    how = f"iterative unmasking ({config['order']}, {passes} full forward passes for {config['max_new_tokens']} tokens)"
    return [row[len(ids):] for row in tokens.tolist()], how, passes


def check_sample_config(config, arch, prompt_tokens, block_size, objective):
    for key in ("num_samples", "max_new_tokens", "steps"):
        if config[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {config[key]}")
    if config["temperature"] < 0 or config["top_k"] < 0 or config["block_length"] < 0:
        raise UserError("--temperature, --top_k and --block_length must not be negative")
    if 0 < config["temperature"] < 1e-3:
        raise UserError(f"--temperature={config['temperature']} is too small to sample with: use 0 for greedy")
    if config["order"] not in UNMASK_ORDERS:
        raise UserError(f"--order={config['order']}: choose {', '.join(UNMASK_ORDERS)}")
    unmasking_only = [k for k in ("steps", "order", "block_length") if config[k] != DEFAULTS[k]]
    if arch != "bert" and unmasking_only:
        raise UserError(f"--{unmasking_only[0]} is for iterative unmasking (bert); {arch} generates left to right: "
                        f"drop it")
    if config["compile"] and (arch == "bert" or config["no_cache"]):
        raise UserError("--compile=True compiles the cached one-token decoding step: "
                        + ("bert has no such step (claim D4), drop --compile" if arch == "bert" else
                           "it does not apply with --no_cache, drop one of them"))
    if arch == "bert" and config["no_cache"]:
        raise UserError("--no_cache does not apply to bert: it has no cache to turn off (claim D4), every pass "
                        "recomputes the whole sequence")
    extra = {"ul2": 1, "span_corruption": 2}.get(objective, 0)  # added: UL2's mode token; a sentinel and [EOS]
    if prompt_tokens + extra > block_size:
        added = {1: " + UL2's mode token", 2: " + the sentinel and [EOS] of span corruption"}.get(extra, "")
        raise UserError(f"the prompt has {prompt_tokens} tokens{added}, but the model's context is {block_size}: "
                        f"shorten it")
    if arch == "bert" and prompt_tokens + config["max_new_tokens"] > block_size:
        raise UserError(f"bert fills masks inside its context: prompt ({prompt_tokens}) + --max_new_tokens "
                        f"({config['max_new_tokens']}) must be at most {block_size}")


def check_memory(model, config, prompt_tokens):
    """Refuse, before allocating, what cannot fit: the tokens of every sample and one KV cache row per sample."""
    c = model.config
    layers = c.n_layer + c.n_decoder_layer
    rows = config["num_samples"]
    needed = rows * (prompt_tokens + config["max_new_tokens"]) * 8 * 2 \
        + rows * layers * 2 * c.block_size * c.n_embd * 4 + rows * c.vocab_size * 4 * 4
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else float("inf")
    if needed > available / 2:
        raise UserError(f"--num_samples={rows} x --max_new_tokens={config['max_new_tokens']} need about "
                        f"{needed / 2 ** 30:,.1f} GiB, more than half of this machine's {available / 2 ** 30:,.0f} GiB: "
                        f"ask for fewer")


def main():
    config = apply_overrides(DEFAULTS, sys.argv[1:])
    device = pick_device(config["device"])
    if config["compile"]:
        check_compiler(device)
    if config["init_from"]:  # published weights (pretrained.py); transformers is needed only here
        from infra.pretrained import load_for_sampling
        model, tokenizer, specials = load_for_sampling(config["init_from"], device)
        arch, objective = model.config.arch, "pretrained"
    else:
        model, checkpoint = load_model(os.path.join(config["out_dir"], config["checkpoint"]), device)
        arch, objective, meta = model.config.arch, checkpoint["config"].get("objective"), checkpoint["meta"]
        specials, tokenizer = Specials.from_meta(meta), tokenizer_for(meta)
    text = read_prompt(config["start"])
    if not text:
        raise UserError("the prompt is empty: pass --start=<text> (or FILE:path)")
    ids = tokenizer.encode(text)
    if not ids:  # a published tokenizer may drop what it has no token for (a lone newline, for BERT's)
        raise UserError(f"the prompt {text!r} encodes to no tokens: pass --start=<some text> (or FILE:path)")
    check_sample_config(config, arch, len(ids), model.config.block_size, objective)
    check_memory(model, config, len(ids))
    torch.manual_seed(config["seed"])
    generator = torch.Generator(device=device).manual_seed(config["seed"])
    num_samples, max_new_tokens = config["num_samples"], config["max_new_tokens"]

    t0 = time.perf_counter()
    with StopSignals("stopping: printing what was generated so far") as stop:
        if arch == "bert":
            new_tokens, how, passes = generate_by_unmasking(model, ids, specials, config, generator, stop)
        else:
            new_tokens, how = generate_left_to_right(model, ids, objective, specials, config, generator, stop)
            passes = len(new_tokens[0])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    for row in new_tokens:
        if arch == "t5" or objective == "span_corruption":  # what fills the span, up to its [EOS]
            print(text + " => " + tokenizer.decode(row).split("[EOS]")[0])
        else:
            print(text + tokenizer.decode(row))
        print("---------------")
    made = len(new_tokens[0]) if arch != "bert" else max_new_tokens
    print(f"{arch} ({objective}): {num_samples} x {made} tokens in {seconds:.2f} s = "
          f"{num_samples * made / seconds:,.1f} tokens/s; {how}; {passes} forward passes per sample")
    if stop and arch == "bert":
        print(f"interrupted after {passes} passes: the [MASK]s shown were not filled")
    elif stop:
        print(f"interrupted: {made} of {max_new_tokens} new tokens generated; the rest were not")


if __name__ == "__main__":
    run_main(main)
