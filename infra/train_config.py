"""
The checks of a training config (train.py's DEFAULTS after the overrides): what the architecture decides (its
objective, its out_dir, a preset's shape), and every value that cannot run, refused in one line before anything
is built or written. The model's own checks stay in model.ModelConfig.validate; this adds the training ones.
"""
import difflib
import math
import os

import objectives
from infra.configurator import UserError, check_seed
from model import ARCHS, PRESETS, ModelConfig

MODEL_KEYS = ("arch", "n_layer", "n_decoder_layer", "n_head", "n_embd", "block_size", "bias", "position")


def model_config(config, vocab_size):
    """The ModelConfig a training config describes."""
    return ModelConfig(vocab_size=vocab_size, dropout=config["dropout"], init_std=config["init_std"],
                       d_ff=PRESETS.get(config["preset"], {}).get("d_ff", 0),
                       shift_logits=config.get("shift_logits", False), **{k: config[k] for k in MODEL_KEYS})


def check_training_config(config):
    """Fill in what depends on the arch (the objective, out_dir's {arch}, a preset's shape); refuse what cannot run."""
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
                        f"(scratch, resume, a gpt run's out_dir to adapt, or published weights: gpt2, a "
                        f"save_pretrained folder)")
    try:  # "out-{arch}" (the default), "out-cpu-{arch}" (the CPU recipe): one folder per arch, never shared
        config["out_dir"] = config["out_dir"].format(arch=config["arch"], objective=config["objective"])
    except (KeyError, IndexError, ValueError):
        raise UserError(f"--out_dir={config['out_dir']}: the only placeholders are {{arch}} and {{objective}}") from None
    if not config["out_dir"]:
        raise UserError("--out_dir is empty: name a folder (default out-{arch})")
    check_init_from_folder(config)
    for key in ("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval"):
        if config[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {config[key]}")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters", "anneal_steps"):
        if config[key] < 0:
            raise UserError(f"--{key} must be at least 0, got {config[key]}")
    if (config["anneal_steps"] or config["shift_logits"]) and config["objective"] != "diffusion":
        raise UserError("--anneal_steps and --shift_logits make a trained gpt into a masked-diffusion model: use "
                        "them with --arch=bert --objective=diffusion --init_from=<the gpt's out_dir>")
    if config["shift_logits"] and config["init_from"] != "resume" and \
            not os.path.exists(os.path.join(config["init_from"], "ckpt.pt")):
        raise UserError(f"--shift_logits keeps a gpt's outputs where they were: it needs --init_from=<a gpt run's "
                        f"out_dir> (or resume), not {config['init_from']}")
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
    if config["init_std"] > INIT_STD_MAX:
        raise UserError(f"--init_std={config['init_std']} is above {INIT_STD_MAX:g}, {INIT_STD_MAX / 0.02:g} x GPT-2's "
                        f"0.02: at 1.0 a 6 x 384 gpt already starts at 51 nats a token, ten times a uniform guess's 5.1, "
                        f"and at 1e30 at nan; use a value near 0.02 (experiments/plateau.py tries 0.01 and 0.04)")
    try:
        model_config(config, vocab_size=1).validate()
    except ValueError as e:
        raise UserError(str(e)) from None


INIT_STD_MAX = 1.0  # the widest starting weights train.py accepts (the reason: check_training_config's message)


def check_init_from_folder(config):
    """--init_from naming a run's folder: never the folder this run writes (it would overwrite the run it starts
    from, whatever --overwrite says), never the run's ckpt.pt file itself (its folder is what is named)."""
    source = config["init_from"]
    if source in ("scratch", "resume"):
        return
    if os.path.basename(source) == "ckpt.pt" and os.path.isfile(source):
        raise UserError(f"--init_from={source} is a run's checkpoint file: name its folder, "
                        f"--init_from={os.path.dirname(source) or '.'}")
    if os.path.exists(source) and os.path.realpath(source) == os.path.realpath(config["out_dir"]):
        raise UserError(f"--init_from and --out_dir are one folder ({source}): this run would overwrite the run it "
                        f"starts from; give it its own --out_dir (--init_from=resume continues that run instead)")


def check_objective_fits_dataset(config, specials, meta):
    """The special tokens an objective needs must be in the dataset's vocabulary (a published one may lack them)."""
    if config["objective"] == "ul2" and not specials.modes:  # a published vocabulary (pretrained.dataset_meta)
        raise UserError(f"--objective=ul2 needs UL2's mode tokens, which dataset {config['dataset']} "
                        f"({meta['tokenizer']}'s vocabulary) does not have: use span_corruption")
    if config["objective"] in ("span_corruption", "ul2") and not specials.sentinels:
        raise UserError(f"--objective={config['objective']} needs sentinel tokens, which dataset {config['dataset']} "
                        f"({meta['tokenizer']}'s vocabulary) does not have: use a T5 or character/GPT-2 dataset")
    if config["objective"] in ("mlm", "diffusion") and meta.get("tokenizer_family") == "t5":
        raise UserError(f"--objective={config['objective']} needs a [MASK] token, which T5's vocabulary (dataset "
                        f"{config['dataset']}) does not have: use span_corruption")
