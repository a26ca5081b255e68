"""
Command-line overrides, nanoGPT style, clean errors for every script, and the checks of a training config.

    python train.py config/train_shakespeare_char_cpu.py --arch=bert --batch_size=32

A positional `config/*.py` file is executed first (it is Python, as in nanoGPT: its plain values must be known
keys; modules it imports and functions it defines are ignored), then each `--key=value` is parsed as a Python
literal and must match the type of the default. Anything wrong raises UserError, which `run_main` turns into one
line on stderr and exit status 2: no traceback, nothing written.
"""
import ast
import difflib
import math
import os
import sys
import types

import torch

import objectives
from model import ARCHS, PRESETS, ModelConfig


class UserError(Exception):
    """A mistake the user can fix: printed as one line, exit status 2."""


def run_main(main):
    prog = os.path.basename(sys.argv[0]) or "python"
    try:
        main()
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C where the script keeps nothing partial (its writes are atomic)
        print(f"{prog}: interrupted; nothing written", file=sys.stderr)
        sys.exit(130)


def _check_type(key, value, default):
    if default is None or isinstance(default, str) and isinstance(value, str):
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # NaN and inf pass every "<" check: refuse them here, for every script
                raise UserError(f"--{key}={value!r} is not a finite number")
            return float(value)
    elif isinstance(default, tuple):
        if isinstance(value, (tuple, list)):
            return tuple(value)
    elif isinstance(value, type(default)):
        return value
    raise UserError(f"--{key}={value!r} has the wrong type: expected {type(default).__name__} "
                    f"like the default {default!r}")


def _unknown(key, known):
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean --{close[0]}?" if close else "run with --help to list the options"
    return UserError(f"unknown option --{key}: {hint}")


def apply_overrides(defaults, argv):
    """Return a copy of `defaults` updated from argv (config files and --key=value). Raises UserError."""
    config = dict(defaults)
    for arg in argv:
        if arg in ("-h", "--help"):
            print("options (defaults):\n" + "\n".join(f"  --{k}={v!r}" for k, v in defaults.items()))
            sys.exit(0)
        if not arg.startswith("--"):
            if os.path.isdir(arg):
                raise UserError(f"config file {arg!r} is a folder: pass a file such as config/<name>.py")
            if not os.path.isfile(arg):
                raise UserError(f"config file {arg!r} not found (pass config/<name>.py or --key=value)")
            values = {}
            try:
                with open(arg, encoding="utf-8") as f:
                    exec(f.read(), {}, values)
            except Exception as e:  # a broken config file is a user error too
                raise UserError(f"config file {arg!r} failed to run: {type(e).__name__}: {e}") from None
            for key, value in values.items():
                if key.startswith("_") or isinstance(value, (types.ModuleType, types.FunctionType, type)):
                    continue  # helpers of the config file, not settings
                if key not in defaults:
                    raise _unknown(key, defaults)
                config[key] = _check_type(key, value, defaults[key])
            continue
        key, has_value, text = arg[2:].partition("=")
        if key not in defaults:
            raise _unknown(key, defaults)
        if not has_value:
            if isinstance(defaults[key], bool):
                config[key] = True  # --flag alone means --flag=True
                continue
            raise UserError(f"--{key} needs a value: --{key}=<value>")
        if isinstance(defaults[key], str):
            value = text  # a string option takes the text as typed: --start=2024 is the prompt "2024"
        else:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text  # not a Python literal: reported as the wrong type below
        config[key] = _check_type(key, value, defaults[key])
    return config


# ----------------------------------------------------------------------------- devices

def pick_device(name):
    """auto picks CUDA, then MPS, then the CPU; an explicit device that is not there is a UserError."""
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown --device={name}: auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device={name} but CUDA is not available here: use --device=cpu (or auto)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"--device={name} but this machine has {torch.cuda.device_count()} GPU(s): cuda:0 .. "
                        f"cuda:{torch.cuda.device_count() - 1}")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device=mps but MPS is not available here: use --device=cpu (or auto)")
    if device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"unknown --device={name}: auto, cpu, cuda, cuda:N or mps")
    return name


# ----------------------------------------------------------------------------- train.py's config

MODEL_KEYS = ("arch", "n_layer", "n_decoder_layer", "n_head", "n_embd", "block_size", "bias", "position")


def model_config(config, vocab_size):
    """The ModelConfig a training config describes."""
    return ModelConfig(vocab_size=vocab_size, dropout=config["dropout"],
                       d_ff=PRESETS.get(config["preset"], {}).get("d_ff", 0),
                       **{k: config[k] for k in MODEL_KEYS})


def check_training_config(config):
    """Fill in what defaults to the arch (objective, out_dir, a preset's shape) and refuse what cannot run."""
    if config["arch"] not in ARCHS:
        raise UserError(f"unknown --arch={config['arch']}: choose one of {', '.join(ARCHS)}")
    allowed = objectives.OBJECTIVES_FOR_ARCH[config["arch"]]
    config["objective"] = config["objective"] or allowed[0]
    if config["objective"] not in allowed:
        raise UserError(f"--objective={config['objective']} does not fit --arch={config['arch']}: "
                        f"choose one of {', '.join(allowed)}")
    if config["preset"]:
        if config["preset"] not in PRESETS:
            raise UserError(f"unknown --preset={config['preset']}: choose one of {', '.join(PRESETS)}")
        for key, value in PRESETS[config["preset"]].items():
            if key in MODEL_KEYS and key != "arch":
                config[key] = value
    close = difflib.get_close_matches(config["init_from"], ["scratch", "resume"], n=1, cutoff=0.6)
    if not config["init_from"] or (close and close[0] != config["init_from"]):
        raise UserError(f"--init_from={config['init_from']}: did you mean {close[0] if close else 'scratch'}? "
                        f"(scratch, resume, or published weights: gpt2, a save_pretrained folder)")
    config["out_dir"] = config["out_dir"] or f"out-{config['arch']}"
    for key in ("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval"):
        if config[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {config[key]}")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters"):
        if config[key] < 0:
            raise UserError(f"--{key} must be at least 0, got {config[key]}")
    if min(config["mlm_mask_fraction"], config["mlm_random_fraction"]) < 0 or \
            config["mlm_mask_fraction"] + config["mlm_random_fraction"] > 1:
        raise UserError("need mlm_mask_fraction, mlm_random_fraction >= 0 with a sum of at most 1 (BERT: 0.8, 0.1)")
    if config["block_size"] < 8:
        raise UserError(f"--block_size={config['block_size']} is too small: use at least 8")
    mixture = config["ul2_mixture"]
    if len(mixture) != 3 or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)
                                    for w in mixture) or min(mixture) < 0 or sum(mixture) <= 0:
        raise UserError("--ul2_mixture must be three non-negative weights (S, R, X), e.g. (0.5,0.25,0.25)")
    if config["learning_rate"] <= 0 or config["min_lr"] < 0:
        raise UserError("--learning_rate must be > 0 and --min_lr >= 0")
    if config["weight_decay"] < 0 or not 0 <= config["beta1"] < 1 or not 0 <= config["beta2"] < 1:
        raise UserError("need --weight_decay >= 0 and 0 <= --beta1, --beta2 < 1")
    if config["grad_clip"] < 0 or config["max_flops"] < 0:
        raise UserError("--grad_clip and --max_flops must not be negative")
    check_seed(config["seed"])
    if config["dtype"] not in ("auto", "float32", "bfloat16", "float16"):
        raise UserError(f"unknown --dtype={config['dtype']}: auto, float32, bfloat16 or float16")
    try:
        model_config(config, vocab_size=1).validate()
    except ValueError as e:
        raise UserError(str(e)) from None


def check_seed(seed):
    if not 0 <= seed < 2 ** 32:  # torch and numpy take larger seeds, but the project adds offsets to them
        raise UserError(f"--seed={seed} is out of range: use 0 <= seed < 2**32")
