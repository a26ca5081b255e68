"""
sample.py's command beside its samplers: what it reads, refuses and chooses before a sampler runs, kept out of the
chapter file. sample.py calls each of these once: main the first four, generate_left_to_right the last two.

    config, device = resolve_options(argv, DEFAULTS)  # the options; refused under torchrun; --compile checked
    weights = load_weights(config, device)            # train.py's checkpoint, or published weights (--init_from)
    text, ids = prompt_ids(config["start"], weights.tokenizer)
    check_request(config, DEFAULTS, UNMASK_ORDERS, weights.model, len(ids), weights.objective)
    compiled = compile_choice(config, model, device)  # --compile=auto: compile where the generation repays it
    how += decoding_note(model, rows, compiled)       # which decoding step ran, for the line after the samples

Every refusal is one line (a UserError), made before anything is generated.
"""
import math
import os
from types import SimpleNamespace

from infra.checkpoint import load_model
from infra.configurator import UserError, apply_overrides, check_compiler, pick_device, read_text_file
from infra.decode_layout import COMPILED_MAX_ROWS, compile_pays, runs_compiled_step
from infra.hardware import compile_option
from infra.pretrained import tokenizer_for
from objectives import Specials


def resolve_options(argv, defaults):
    """(config, device) from the command line: sample.py's DEFAULTS overridden by --key=value, --compile as "auto",
    True or False (a C++ compiler checked at once where True asks for one on a CPU)."""
    config = apply_overrides(defaults, argv)
    # what a process on its own reads
    alone = (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0"))
    if any(os.environ.get(key, value) != value for key, value in alone):
        # one of a torchrun job's processes: each would write the same samples
        raise UserError("sample.py runs in one process: start it with python, not under torchrun or infra.parallel")
    config["compile"] = compile_option(config["compile"])  # "auto", True or False
    device = pick_device(config["device"])
    if config["compile"] is True:
        check_compiler(device)
    return config, device


def load_weights(config, device):
    """What generates: train.py's checkpoint in --out_dir, or published weights (--init_from, infra/pretrained.py;
    transformers is needed only there). A namespace of model (eval mode, on device), tokenizer, specials, objective
    (the checkpoint's; "pretrained") and trained (the line that says which run wrote the checkpoint; None for
    published weights)."""
    if config["init_from"]:
        from infra.pretrained import load_for_sampling
        model, tokenizer, specials = load_for_sampling(config["init_from"], device)
        return SimpleNamespace(model=model, tokenizer=tokenizer, specials=specials, objective="pretrained",
                               trained=None)
    path = os.path.join(config["out_dir"], config["checkpoint"])
    model, checkpoint = load_model(path, device)
    meta = checkpoint["meta"]
    return SimpleNamespace(model=model, tokenizer=tokenizer_for(meta), specials=Specials.from_meta(meta),
                           objective=checkpoint["config"].get("objective"),
                           trained=what_trained_it(path, checkpoint))


def what_trained_it(path, checkpoint):
    """The line printed before the samples: which run wrote these weights and how far it got; a warning when they
    are untrained or the run stopped early (the samples then say little about the arch)."""
    config, done, loss = checkpoint["config"], checkpoint["iter_num"], checkpoint["best_val_loss"]
    line = f"{path}: {config['arch']} ({config['objective']}), trained {done} of {config['max_iters']} iterations"
    if loss is not None and math.isfinite(loss):
        line += f", best val loss {loss:.4f}"
    if done == 0:
        line += "\nwarning: these weights are untrained (saved at iteration 0): the samples are noise"
    elif done < config["max_iters"] and not config.get("max_flops"):
        line += (f"\nwarning: its run stopped at iteration {done} of {config['max_iters']}: train on with the same "
                 "train.py command plus --init_from=resume")
    return line


def prompt_ids(start, tokenizer):
    """(text, token ids) of --start: the prompt as typed, or FILE:path to read it from a text file."""
    text = read_text_file(start[5:], "prompt file") if start.startswith("FILE:") else start
    if not text:
        raise UserError("the prompt is empty: pass --start=<text> (or FILE:path)")
    ids = tokenizer.encode(text)
    if not ids:
        # a published tokenizer may drop what it has no token for (a lone newline, for BERT's)
        raise UserError(f"the prompt {text!r} encodes to no tokens: pass --start=<some text> (or FILE:path)")
    return text, ids


def check_request(config, defaults, unmask_orders, model, prompt_tokens, objective):
    """Refuse what this model cannot do with these options (check_sample_config), or what cannot fit in memory
    (check_memory), before anything is allocated."""
    check_sample_config(config, defaults, unmask_orders, model.config.arch, prompt_tokens, model.config.block_size,
                        objective)
    check_memory(model, config, prompt_tokens)


def check_sample_config(config, defaults, unmask_orders, arch, prompt_tokens, block_size, objective):
    """The options against each other and against the model: defaults, sample.py's DEFAULTS (an unmasking option
    changed from its default is refused for a model that generates left to right); unmask_orders, the orders
    sample.unmask knows."""
    for key in ("num_samples", "max_new_tokens", "steps"):
        if config[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {config[key]}")
    if config["temperature"] < 0 or config["top_k"] < 0 or config["block_length"] < 0:
        raise UserError("--temperature, --top_k and --block_length must not be negative")
    if 0 < config["temperature"] < 1e-3:
        raise UserError(f"--temperature={config['temperature']} is too small to sample with: use 0 for greedy")
    if config["temperature"] > 1e3:
        # logits / temperature would underflow to a uniform draw (overflow past 3e38)
        raise UserError(f"--temperature={config['temperature']} is too large: from ~100 on every token is already "
                        "about equally likely; use at most 1000")
    if config["order"] not in unmask_orders:
        raise UserError(f"--order={config['order']}: choose {', '.join(unmask_orders)}")
    unmasking_only = [k for k in ("steps", "order", "block_length") if config[k] != defaults[k]]
    if arch != "bert" and unmasking_only:
        raise UserError(f"--{unmasking_only[0]} is for iterative unmasking (bert); {arch} generates left to right: "
                        "drop it")
    if config["compile"] is True and (arch == "bert" or config["no_cache"]):
        raise UserError("--compile=True compiles the cached one-token decoding step: "
                        + ("bert has no such step (claim D4), drop --compile" if arch == "bert" else
                           "it does not apply with --no_cache, drop one of them"))
    if arch == "bert" and config["no_cache"]:
        raise UserError("--no_cache does not apply to bert: it has no cache to turn off (claim D4), every pass "
                        "recomputes the whole sequence")
    # added: UL2's mode token; a sentinel and [EOS]
    extra = {"ul2": 1, "span_corruption": 2}.get(objective, 0)
    if prompt_tokens + extra > block_size:
        added = {1: " + UL2's mode token", 2: " + the sentinel and [EOS] of span corruption"}.get(extra, "")
        raise UserError(f"the prompt has {prompt_tokens} tokens{added}, but the model's context is {block_size}: "
                        "shorten it")
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
    available = float("inf")
    if hasattr(os, "sysconf"):
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > available / 2:
        raise UserError(f"--num_samples={rows} x --max_new_tokens={config['max_new_tokens']} need about "
                        f"{needed / 2 ** 30:,.1f} GiB, more than half of this machine's "
                        f"{available / 2 ** 30:,.0f} GiB: ask for fewer")


def compile_choice(config, model, device):
    """--compile as a bool: True or False as given; auto, whether this generation repays compiling the decoding step
    (infra/decode_layout.compile_pays, from what bench.py measured) where a compiler can build it. Same tokens
    either way."""
    if config["compile"] != "auto":
        return config["compile"]
    if model.config.arch == "bert" or config["no_cache"]:  # no cached step to compile (claim D4)
        return False
    try:
        check_compiler(device)
    except UserError:
        return False  # no C++ compiler: auto decodes eagerly
    return compile_pays(model, config["num_samples"], config["max_new_tokens"])


COMPILED_NOTE = (", compiled decoding step (the time includes compiling it once per process: seconds; on a CPU, "
                 "30-50 s for a model 256 wide or wider, whose weights are frozen into tuned kernels)")


def decoding_note(model, rows, compiled):
    """What the line after the samples adds about the decoding step of a compiled generation ("" for an eager one):
    the compiled step, or the eager one where more than COMPILED_MAX_ROWS rows make it the faster on a CPU."""
    if compiled and not runs_compiled_step(model, rows):
        return (f", the eager step (--compile=True: with more than {COMPILED_MAX_ROWS} rows on a CPU it is the "
                "faster)")
    return COMPILED_NOTE if compiled else ""
