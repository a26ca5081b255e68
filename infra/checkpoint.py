"""
A run's files in its out_dir, and what makes resuming exact:

    ckpt.pt / best.pt   the latest and the best checkpoint: weights, optimizer, config, the dataset's meta, the
                        iteration, and every process's RNG states (so a resumed run draws the same windows, noise
                        and dropout as an uninterrupted one: tests/test_reliability.py checks bit-identity)
    log.jsonl           one JSON object per line, on disk as soon as it is written
    lock                the PID of the one run that owns the out_dir while it trains

Writes are atomic (a temporary file, fsync, rename): a process killed or a disk filling up mid-save leaves the
previous checkpoint intact. Everything a user can get wrong ends in a UserError with one line that says what to do.
"""
import difflib
import json
import os
import random
import stat
from dataclasses import fields

import torch

from infra.adaptation import model_for
from infra.configurator import Failure, UserError
from infra.progress import disk_error, remove_quietly
from infra.train_config import MODEL_KEYS
from infra.dataset import META_KEYS
from infra.published_model import PublishedConfig, published_model
from model import ModelConfig
from objectives import OBJECTIVES_FOR_ARCH

CHECKPOINT_KEYS = ("model", "optimizer", "config", "model_config", "meta", "iter_num", "best_val_loss", "flops_done",
                   "rng")


class CheckpointWriteFailed(Failure):
    """The disk refused a save (full, a file-size limit, gone): one line, exit status 1."""


# ----------------------------------------------------------------------------- checkpoints

def save_checkpoint(state, path):
    """Atomic: write a temporary file, flush and fsync it, then rename it over the old one."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError, the OSError inside
        remove_quietly(tmp)
        previous = f"the previous {os.path.basename(path)} is intact" if os.path.exists(path) else \
            f"no {os.path.basename(path)} was written"
        raise CheckpointWriteFailed(f"{disk_error(e)} writing {path}; {previous}") from None
    except BaseException:  # Ctrl-C mid-save: the old checkpoint stays, the partial file goes
        remove_quietly(tmp)
        raise
    os.replace(tmp, path)


def iterations_trained(folder):
    """The last iteration a run's log.jsonl records (0 when it has none): how far the run in `folder` got,
    without loading its weights."""
    last = 0
    try:
        with open(os.path.join(folder, "log.jsonl")) as f:
            for line in f:
                try:
                    last = max(last, int(json.loads(line)["iter"]))
                except (ValueError, KeyError, TypeError):
                    pass  # a line cut short by a crash
    except OSError:
        pass
    return last


def missing_checkpoint(path):
    """The one line for a checkpoint that is not there: where it was looked for (an absolute folder: a relative
    --out_dir is read from the current folder), the name meant if a folder here is close to it, and otherwise the
    runs here, the most trained first (an iteration-0 checkpoint left by an early Ctrl-C samples noise)."""
    folder, name = os.path.split(path)
    where = f"no checkpoint at {path} (looked in {os.path.abspath(folder or '.')})"
    parent = os.path.dirname(os.path.abspath(folder or "."))
    try:
        runs = [d for d in os.listdir(parent) if os.path.isfile(os.path.join(parent, d, name))]
    except OSError:  # no such folder, or not one this user may list
        runs = []
    close = difflib.get_close_matches(os.path.basename(os.path.normpath(folder)), runs, n=1, cutoff=0.85)
    if close:
        return f"{where}: did you mean --out_dir={os.path.join(os.path.dirname(os.path.normpath(folder)), close[0])}?"
    runs.sort(key=lambda d: -iterations_trained(os.path.join(parent, d)))
    beside = os.path.dirname(os.path.normpath(folder))  # how the runs there are named from here
    found = "; runs there, the most trained first: " + ", ".join(
        f"--out_dir={os.path.join(beside, d)} ({iterations_trained(os.path.join(parent, d))} iterations)"
        for d in runs[:4]) if runs else ""
    return f"{where}: train first (python train.py ...) or fix --out_dir{found}"


def load_checkpoint(path, device="cpu"):
    """A checkpoint of this project, checked before anything uses it (train.py resuming, sample.py, finetune.py and
    the experiments all load through here): every problem is a UserError that says what is wrong."""
    if os.path.isdir(path):
        raise UserError(f"{path} is a folder, not a checkpoint: pass the ckpt.pt (or best.pt) file inside a run")
    if not os.path.exists(path):
        raise UserError(missing_checkpoint(path))
    if not stat.S_ISREG(os.stat(path).st_mode):  # torch.load would wait on a pipe forever
        raise UserError(f"{path} is not a regular file (a pipe or a device): pass the ckpt.pt written by train.py")
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:
        raise UserError(f"{path} is not a checkpoint torch can read ({type(e).__name__}): pass the ckpt.pt or "
                        f"best.pt written by train.py") from None
    problem = checkpoint_problem(checkpoint)
    if problem:
        raise UserError(f"{path} {problem}: it was not written whole by this version of train.py; retrain (or "
                        f"resume from an earlier checkpoint)")
    return checkpoint


# the settings ModelConfig held for published weights before they moved to infra/published_model.py, at the values
# every model trained from scratch had: a checkpoint written then loads with them dropped (or as a PublishedConfig)
EARLIER_PUBLISHED_FIELDS = {"norm": "layernorm", "norm_eps": 1e-5, "activation": "gelu_tanh", "post_norm": False,
                            "segment_vocab_size": 0, "mlm_head": False, "scale_attention": True,
                            "scale_tied_output": False, "relative_buckets": 32, "relative_max_distance": 128}


def upgrade_model_config(settings):
    """A model_config written before the published-weight settings left ModelConfig, in today's terms."""
    earlier = {k: settings[k] for k in EARLIER_PUBLISHED_FIELDS if k in settings}
    if not earlier or "family" in settings:  # today's layout (a PublishedConfig names its family)
        return settings
    today = {k: v for k, v in settings.items() if k not in EARLIER_PUBLISHED_FIELDS}
    if all(earlier[k] == EARLIER_PUBLISHED_FIELDS[k] for k in earlier):
        return today  # trained from scratch: nothing published about it
    family = "bert" if earlier.get("post_norm") else "t5" if earlier.get("norm") == "rmsnorm" else "gpt2"
    kept = {k: earlier[k] for k in ("norm_eps", "activation", "segment_vocab_size", "relative_buckets",
                                    "relative_max_distance") if k in earlier}
    return dict(today, family=family, **kept)


def checkpoint_problem(checkpoint):
    """What is wrong with a loaded checkpoint, in words, or None."""
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(checkpoint, dict) or checkpoint.get(k) is None
               and k != "best_val_loss"]
    if missing:
        return f"is not a checkpoint of this project (no {', '.join(missing)})"
    wrong = [k for k, kind in (("model", dict), ("optimizer", dict), ("config", dict), ("model_config", dict),
                               ("meta", dict), ("iter_num", int), ("rng", list), ("flops_done", (int, float)),
                               ("best_val_loss", (int, float, type(None)))) if not isinstance(checkpoint[k], kind)]
    if not wrong and any(k not in checkpoint["meta"] for k in META_KEYS):
        wrong = ["meta"]
    if wrong:
        return f"has {', '.join(wrong)} of the wrong type"
    checkpoint["model_config"] = upgrade_model_config(checkpoint["model_config"])  # (in place: an earlier version)
    known = fields(PublishedConfig if "family" in checkpoint["model_config"] else ModelConfig)
    unknown = sorted(set(checkpoint["model_config"]) - {f.name for f in known})
    if unknown:
        return f"has model settings this version does not know: {', '.join(unknown)}"
    arch, objective = checkpoint["config"].get("arch"), checkpoint["config"].get("objective")
    if not isinstance(arch, str) or not isinstance(objective, str):
        return "names no arch or objective in its config"
    if objective not in OBJECTIVES_FOR_ARCH.get(arch, ()):
        return f"names an objective {objective!r} that arch {arch!r} does not have"
    meta = checkpoint["meta"]
    if meta["tokenizer"] == "char" and not (isinstance(meta.get("stoi"), dict) and isinstance(meta.get("itos"), list)
                                            and len(meta["itos"]) == meta["num_ordinary"] == len(meta["stoi"])):
        return "has a character vocabulary that does not add up (its stoi / itos are missing or of other sizes)"
    bad = [name for name, value in checkpoint["model"].items()
           if torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all()]
    if bad:
        return f"has weights that are not finite (NaN or inf: {bad[0]}{' and more' if len(bad) > 1 else ''})"
    return None


def model_from_checkpoint(checkpoint, path):
    """The Transformer a checkpoint describes, with its weights; a mismatch is a UserError, not a traceback."""
    try:
        settings = checkpoint["model_config"]  # a fine-tuned published model names its family
        # (a diffusion model adapted from gpt, its outputs shifted: infra/adaptation.py's DiffusionFromGpt)
        model = published_model(PublishedConfig(**settings)) if "family" in settings else \
            model_for(ModelConfig(**settings))
    except (ValueError, TypeError) as e:
        raise UserError(f"{path}: its model settings cannot be built ({e}); retrain") from None
    return load_weights(model, checkpoint, path)


def load_weights(model, checkpoint, path):
    try:
        model.load_state_dict(checkpoint["model"])
    except (RuntimeError, TypeError, AttributeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: its weights do not fit its model settings ({first[:160]}); retrain") from None
    return model


def load_model(path, device):
    """(model in eval mode on device, checkpoint) from a checkpoint file: what sample.py and friends need."""
    checkpoint = load_checkpoint(path, device)
    return model_from_checkpoint(checkpoint, path).to(device).eval(), checkpoint


# ----------------------------------------------------------------------------- exact resume

def rng_state(data_rng, objective_rng):
    return {"python": random.getstate(), "numpy_data": data_rng.bit_generator.state, "objective": objective_rng.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def restore_rng(state, data_rng, objective_rng):
    random.setstate(state["python"])
    data_rng.bit_generator.state = state["numpy_data"]
    objective_rng.set_state(state["objective"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def restore_training_state(checkpoint, path, optimizer, processes, data_rng, objective_rng):
    """Exact resume: the optimizer's moments, the counters, and this process's RNG states (the weights were loaded
    with the model). Returns (iter_num, best_val_loss, flops_done)."""
    try:
        optimizer.load_state_dict(checkpoint["optimizer"])
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: its optimizer state does not fit the model ({e}); retrain") from None
    if len(checkpoint["rng"]) != processes.world_size:
        raise UserError(f"the checkpoint was written by {len(checkpoint['rng'])} process(es), this run has "
                        f"{processes.world_size}: resume with the same --nproc_per_node")
    try:
        restore_rng(checkpoint["rng"][processes.rank], data_rng, objective_rng)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise UserError(f"{path}: its random-number states are unreadable ({type(e).__name__}); retrain") from None
    return checkpoint["iter_num"], checkpoint["best_val_loss"], checkpoint["flops_done"]


def check_resume(config, checkpoint, meta):
    """Resuming continues the same run: the model's shape, the objective and the vocabulary must match."""
    saved = checkpoint["config"]
    published = saved.get("published_weights")  # fine-tuned published weights: their shape came with them
    earlier = dict({f.name: f.default for f in fields(ModelConfig)}, anneal_steps=0)  # not recorded by earlier versions
    for key in (("arch", "block_size") if published else MODEL_KEYS) + ("objective", "shift_logits", "anneal_steps"):
        # (another objective would mix units in the best-checkpoint comparison)
        held = saved[key] if key in saved else checkpoint["model_config"].get(key, earlier.get(key))
        if held is None:
            raise UserError(f"cannot resume: the checkpoint in {config['out_dir']} does not record its {key}: "
                            f"start a new run (a new --out_dir)")
        if held != config[key]:
            raise UserError(f"cannot resume: --{key}={config[key]} but the checkpoint in {config['out_dir']} has "
                            f"{key}={held}; pass --{key}={held} (or a new --out_dir)")
    if published:  # the shape no flag describes: this run's config says what it holds, as the first run's did
        config.update({k: saved[k] for k in MODEL_KEYS}, published_weights=published)
    saved_meta = checkpoint["meta"]
    if any(saved_meta.get(k) != meta.get(k) for k in ("vocab_size", "tokenizer", "itos")):
        how = f"{meta['vocab_size']} tokens against the checkpoint's {saved_meta.get('vocab_size')}" \
            if saved_meta.get("vocab_size") != meta.get("vocab_size") else \
            f"as many tokens ({meta['vocab_size']}), but other ones (other characters or another tokenizer)"
        raise UserError(f"cannot resume: the vocabulary of dataset {config['dataset']} is not the checkpoint's: {how}; "
                        f"use the checkpoint's dataset")


# ----------------------------------------------------------------------------- the log and the lock

class RunLog:
    """log.jsonl. Each line is flushed when written (a crash loses at most the lines not yet read back from the
    device) and fsynced at each checkpoint. A resumed run keeps the lines before the checkpoint's iteration and
    appends: no iteration appears twice."""

    def __init__(self, path, resume_iteration=None):
        self.path = path
        if resume_iteration is not None and os.path.exists(path):
            kept = []
            with open(path) as f:
                for line in f:
                    try:
                        if json.loads(line)["iter"] < resume_iteration:
                            kept.append(line if line.endswith("\n") else line + "\n")
                    except (ValueError, KeyError, TypeError):
                        pass  # a line cut short by a crash
            with open(path + ".tmp", "w") as f:
                f.writelines(kept)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)
        self.file = open(path, "a" if resume_iteration is not None else "w")

    def write(self, record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def sync(self):
        os.fsync(self.file.fileno())

    def close(self):
        self.file.close()


class OutDirLock:
    """One run per out_dir: an exclusive lock on out_dir/lock, which holds the owner's PID. The kernel releases
    it when the process ends, however it ends, so a dead run's lock never blocks the next one."""

    def __init__(self, out_dir):
        self.path = os.path.join(out_dir, "lock")
        self.file = None

    def acquire(self):
        import fcntl
        while True:
            f = open(self.path, "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.seek(0)
                owner = f.read().strip() or "unknown"
                f.close()
                raise UserError(f"another run (PID {owner}) is using {os.path.dirname(self.path)}: wait for it, stop "
                                f"it, or choose another --out_dir") from None
            try:  # the file we locked must still be the one at the path (its owner may have just removed it)
                same = os.fstat(f.fileno()).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            f.close()
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self.file = f

    def release(self):
        if self.file is not None:
            remove_quietly(self.path)
            self.file.close()
            self.file = None
