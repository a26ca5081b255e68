"""
Train any of the four architectures with one command (one training loop for all):

    python train.py --arch=bert                                  # defaults sized for one GPU
    python train.py config/train_shakespeare_char_cpu.py --arch=t5   # nanoGPT's CPU recipe
    python train.py --arch=gpt --init_from=resume                # continue exactly where it stopped
    torchrun --standalone --nproc_per_node=2 train.py ...        # data parallel (gloo on CPU, NCCL on CUDA)

Defaults are at the top; a config/*.py file and --key=value override them. Each log line reports the loss in the
objective's own units, ms/iter, tokens/s, *supervised* tokens/s (claim C1) and MFU against the matmul rate this
machine measured at start.
"""
import json
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch

import objectives
from configurator import UserError, apply_overrides, run_main
from model import ARCHS, ModelConfig, Transformer, PRESETS, describe

# ----------------------------------------------------------------------------- defaults (one GPU)
DEFAULTS = dict(
    arch="gpt",                 # gpt | bert | prefixlm | t5
    objective="",               # "" = the arch's natural one (clm, mlm, prefix_lm, span_corruption)
    dataset="shakespeare_char",  # a folder of data/ holding train.bin, val.bin, meta.pkl
    out_dir="",                 # "" = out-<arch>
    init_from="scratch",        # scratch | resume (from out_dir/ckpt.pt)
    preset="",                  # a model *shape* from model.PRESETS (gpt2, bert-base, t5-small, cpu-*): it sets the
                                # layers/heads/dims/block (winning over those keys); --arch still picks the architecture
    # model
    n_layer=6, n_decoder_layer=0, n_head=6, n_embd=384, block_size=256, dropout=0.2, bias=False,
    position="learned",         # learned | rope | none (NoPE, claim D5)
    # objective settings
    mlm_rate=0.15, mlm_mask_fraction=0.8, mlm_random_fraction=0.1, noise_density=0.15, mean_span=3.0, ul2_mixture=(0.5, 0.25, 0.25),
    # optimisation
    batch_size=64, gradient_accumulation_steps=1, max_iters=5000, max_flops=0.0,  # max_flops > 0: stop at this budget
    learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=5000, decay_lr=True,
    weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0,
    # evaluation, logging, checkpoints
    eval_interval=250, eval_iters=200, log_interval=10, eval_only=False, always_save_checkpoint=True,
    overwrite=False,            # a new run into an out_dir that holds a checkpoint: refused unless True
    # system
    device="auto",              # auto | cpu | cuda | cuda:N | mps
    dtype="auto",               # auto (bfloat16 on CUDA, else float32) | float32 | bfloat16 | float16
    compile=False, seed=1337, quiet=False,
)
MODEL_KEYS = ("arch", "n_layer", "n_decoder_layer", "n_head", "n_embd", "block_size", "bias", "position")
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


# ----------------------------------------------------------------------------- configuration

def resolve_config(argv):
    config = apply_overrides(DEFAULTS, argv)
    check_config(config)
    return config


def check_config(config):
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
    if config["init_from"] not in ("scratch", "resume"):
        raise UserError(f"--init_from={config['init_from']} is not scratch or resume")
    config["out_dir"] = config["out_dir"] or f"out-{config['arch']}"
    for key in ("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval"):
        if config[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {config[key]}")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters"):
        if config[key] < 0:
            raise UserError(f"--{key} must be at least 0, got {config[key]}")
    if not 0 < config["mlm_rate"] < 1 or not 0 < config["noise_density"] < 1 or config["mean_span"] < 1:
        raise UserError("need 0 < mlm_rate < 1, 0 < noise_density < 1 and mean_span >= 1")
    if min(config["mlm_mask_fraction"], config["mlm_random_fraction"]) < 0 or \
            config["mlm_mask_fraction"] + config["mlm_random_fraction"] > 1:
        raise UserError("need mlm_mask_fraction, mlm_random_fraction >= 0 with a sum of at most 1 (BERT: 0.8, 0.1)")
    if config["block_size"] < 8:
        raise UserError(f"--block_size={config['block_size']} is too small: use at least 8")
    mixture = config["ul2_mixture"]
    if len(mixture) != 3 or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in mixture) \
            or min(mixture) < 0 or sum(mixture) <= 0:
        raise UserError("--ul2_mixture must be three non-negative weights (S, R, X), e.g. (0.5,0.25,0.25)")
    if config["learning_rate"] <= 0 or config["min_lr"] < 0:
        raise UserError("--learning_rate must be > 0 and --min_lr >= 0")
    if config["weight_decay"] < 0 or not 0 <= config["beta1"] < 1 or not 0 <= config["beta2"] < 1:
        raise UserError("need --weight_decay >= 0 and 0 <= --beta1, --beta2 < 1")
    if config["seed"] < 0 or config["grad_clip"] < 0 or config["max_flops"] < 0:
        raise UserError("--seed, --grad_clip and --max_flops must not be negative")
    if config["dtype"] not in ("auto", "float32", "bfloat16", "float16"):
        raise UserError(f"unknown --dtype={config['dtype']}: auto, float32, bfloat16 or float16")
    try:
        model_config(config, vocab_size=1).validate()
    except ValueError as e:
        raise UserError(str(e)) from None


def model_config(config, vocab_size):
    return ModelConfig(vocab_size=vocab_size, dropout=config["dropout"],
                       d_ff=PRESETS.get(config["preset"], {}).get("d_ff", 0),
                       **{k: config[k] for k in MODEL_KEYS})


def pick_device(name):
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


# ----------------------------------------------------------------------------- data

def load_dataset(name, block_size, prepare_if_missing):
    """name: a folder of data/ (prepared on first use) or a path to any folder with train.bin, val.bin, meta.pkl."""
    folder = name if os.sep in name else os.path.join(DATA_DIR, name)
    if not os.path.isdir(folder):
        known = sorted(d for d in os.listdir(DATA_DIR) if os.path.isfile(os.path.join(DATA_DIR, d, "prepare.py")))
        raise UserError(f"unknown --dataset={name}: choose one of {', '.join(known)} (folders of data/)")
    meta_path = os.path.join(folder, "meta.pkl")
    prepare_script = os.path.join(folder, "prepare.py")
    if not os.path.exists(meta_path) and prepare_if_missing and os.path.exists(prepare_script):
        print(f"dataset {name} is not prepared yet: running data/{name}/prepare.py")
        result = subprocess.run([sys.executable, prepare_script], capture_output=True, text=True)
        if result.returncode != 0:  # pass its one-line error on as ours
            message = (result.stderr.strip().splitlines() or ["failed"])[-1].split("error: ", 1)[-1]
            raise UserError(message)
        print(result.stdout.strip())
    if not os.path.exists(meta_path):
        raise UserError(f"{meta_path} is missing: prepare the dataset first (python data/<name>/prepare.py)")
    try:
        with open(meta_path, "rb") as f:
            meta = pickle.load(f)
    except Exception as e:
        raise UserError(f"{meta_path} is unreadable ({type(e).__name__}): prepare the dataset again") from None
    splits = {}
    for split in ("train", "val"):
        path = os.path.join(folder, f"{split}.bin")
        if not os.path.exists(path):
            raise UserError(f"{path} is missing: prepare the dataset again (python data/<name>/prepare.py)")
        size = os.path.getsize(path)
        expected = meta.get(f"{split}_tokens")
        if size % 2 or (expected is not None and size // 2 != expected):
            raise UserError(f"{path} is truncated: {size} bytes where meta.pkl promises {expected} uint16 tokens; "
                            f"prepare the dataset again (python data/<name>/prepare.py)")
        if size // 2 < block_size + 2:
            raise UserError(f"{path} holds {size // 2} tokens, too few for --block_size={block_size}: "
                            f"use a smaller block_size or more text")
        splits[split] = path
    return splits, meta


def get_windows(path, batch_size, block_size, rng):
    """batch_size random windows of block_size + 1 tokens: (B, T+1) int64. A fresh memmap each call, as nanoGPT."""
    data = np.memmap(path, dtype=np.uint16, mode="r")
    starts = rng.integers(0, len(data) - block_size - 1, size=batch_size)
    return torch.from_numpy(np.stack([data[i:i + block_size + 1].astype(np.int64) for i in starts]))


# ----------------------------------------------------------------------------- checkpoints

def save_checkpoint(state, path):
    """Atomic: write a temporary file, flush and fsync it, then rename it over the old one. A process killed
    mid-save leaves the previous checkpoint intact."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path, device="cpu"):
    if not os.path.exists(path):
        raise UserError(f"no checkpoint at {path}: train first (python train.py ...) or fix --out_dir")
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:
        raise UserError(f"{path} is not a readable checkpoint ({type(e).__name__}): delete it or retrain") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(checkpoint, dict) or k not in checkpoint]
    if missing:
        raise UserError(f"{path} is not a checkpoint of this project (no {', '.join(missing)}): retrain")
    return checkpoint


CHECKPOINT_KEYS = ("model", "optimizer", "config", "model_config", "meta", "iter_num", "best_val_loss", "flops_done",
                   "rng")


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


def check_resume(config, checkpoint, meta):
    saved = checkpoint["config"]
    for key in MODEL_KEYS:
        if saved[key] != config[key]:
            raise UserError(f"cannot resume: --{key}={config[key]} but the checkpoint in {config['out_dir']} has "
                            f"{key}={saved[key]}; pass --{key}={saved[key]} (or a new --out_dir)")
    saved_meta = checkpoint["meta"]
    if any(saved_meta.get(k) != meta.get(k) for k in ("vocab_size", "tokenizer", "itos")):
        raise UserError(f"cannot resume: the vocabulary of dataset {config['dataset']} ({meta['vocab_size']} tokens) "
                        f"is not the checkpoint's ({saved_meta['vocab_size']} tokens); use the checkpoint's dataset")


# ----------------------------------------------------------------------------- schedule and evaluation

def learning_rate_at(it, config):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters (nanoGPT)."""
    if not config["decay_lr"]:
        return config["learning_rate"]
    if it < config["warmup_iters"]:
        return config["learning_rate"] * (it + 1) / (config["warmup_iters"] + 1)
    if it > config["lr_decay_iters"]:
        return config["min_lr"]
    ratio = (it - config["warmup_iters"]) / max(1, config["lr_decay_iters"] - config["warmup_iters"])
    return config["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (config["learning_rate"] - config["min_lr"])


def batch_for(config, windows, specials, generator):
    return objectives.make_batch(config["objective"], windows, specials, generator, config["arch"],
                                 mlm_rate=config["mlm_rate"], mlm_mask_fraction=config["mlm_mask_fraction"],
                                 mlm_random_fraction=config["mlm_random_fraction"], noise_density=config["noise_density"],
                                 mean_span=config["mean_span"], ul2_mixture=config["ul2_mixture"])


@torch.no_grad()
def estimate_loss(model, config, splits, specials, device, autocast):
    """Mean loss over eval_iters batches per split, on the same windows and noise every time (fixed seeds), so
    evaluations are comparable across iterations and architectures."""
    model.eval()
    result = {}
    for split, path in splits.items():
        data_rng = np.random.default_rng(config["seed"] + 10_000)
        generator = torch.Generator().manual_seed(config["seed"] + 20_000)
        losses = torch.zeros(config["eval_iters"])
        for k in range(config["eval_iters"]):
            windows = get_windows(path, config["batch_size"], config["block_size"], data_rng)
            batch = batch_for(config, windows, specials, generator).to(device)
            with autocast:
                _, loss = model(**batch.model_inputs())
            losses[k] = loss.item()
        result[split] = losses.mean().item()
    model.train()
    return result


# ----------------------------------------------------------------------------- the loop

def train(config):
    """Train with a resolved config (dict). Returns a summary dict; raises UserError on bad input."""
    ddp = int(os.environ.get("RANK", -1)) != -1
    rank, world_size = 0, 1
    if ddp:
        import torch.distributed as dist
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if config["gradient_accumulation_steps"] % world_size:
            raise UserError(f"gradient_accumulation_steps={config['gradient_accumulation_steps']} is not divisible "
                            f"by the {world_size} processes: make it a multiple of --nproc_per_node")
    device = pick_device(config["device"])
    if ddp and device.startswith("cuda"):
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)  # NCCL's object collectives use the current device
    master = rank == 0
    log = print if master and not config["quiet"] else (lambda *a, **k: None)
    out_dir = config["out_dir"]
    checkpoint_path = os.path.join(out_dir, "ckpt.pt")
    if config["init_from"] == "resume":
        checkpoint = load_checkpoint(checkpoint_path)  # before anything is prepared or written
    else:
        checkpoint = None
        if os.path.exists(checkpoint_path) and not config["overwrite"]:
            raise UserError(f"{out_dir} already holds a checkpoint: --init_from=resume to continue it, "
                            f"--overwrite=True to start over, or another --out_dir")

    if ddp and not master:
        dist.barrier()  # let rank 0 prepare the dataset first
    try:
        splits, meta = load_dataset(config["dataset"], config["block_size"], prepare_if_missing=master)
    finally:
        if ddp and master:
            dist.barrier()
    specials = objectives.Specials.from_meta(meta)
    if checkpoint is not None:
        check_resume(config, checkpoint, meta)

    device_type = "cuda" if device.startswith("cuda") else device
    dtype = config["dtype"]
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    autocast = (torch.autocast(device_type=device_type, dtype=getattr(torch, dtype))
                if dtype != "float32" and device_type == "cuda" else nullcontext())

    torch.manual_seed(config["seed"])  # the same initial weights on every process
    model = Transformer(model_config(config, meta["vocab_size"])).to(device)
    torch.manual_seed(config["seed"] + 100 * rank)  # dropout differs between processes
    random.seed(config["seed"] + rank)
    data_rng = np.random.default_rng(config["seed"] + rank)  # different windows per process
    objective_rng = torch.Generator().manual_seed(config["seed"] + 1 + rank)
    optimizer = model.configure_optimizer(config["weight_decay"], config["learning_rate"],
                                          (config["beta1"], config["beta2"]), device_type)
    iter_num, best_val_loss, flops_done = 0, float("inf"), 0.0
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
        flops_done = checkpoint["flops_done"]
        states = checkpoint["rng"]  # one per process
        if len(states) != world_size:
            raise UserError(f"the checkpoint was written by {len(states)} process(es), this run has {world_size}: "
                            f"resume with the same --nproc_per_node")
        restore_rng(states[rank], data_rng, objective_rng)
        checkpoint = None  # free memory
    scaler = torch.amp.GradScaler(enabled=(dtype == "float16"))
    raw_model = model
    if config["compile"]:
        model = torch.compile(model)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, device_ids=[int(os.environ["LOCAL_RANK"])]
                                        if device_type == "cuda" else None)

    from bench import matmul_flops_per_second  # measured, not a datasheet number
    peak_flops = matmul_flops_per_second(device, torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    log(f"{describe(raw_model)}; objective {config['objective']}; device {device} ({dtype}); "
        f"measured matmul peak {peak_flops / 1e12:.3f} TFLOP/s")
    log_file, error = None, None
    if master:
        try:
            os.makedirs(out_dir, exist_ok=True)
            # a resumed run continues its log; a new run starts its own
            log_file = open(os.path.join(out_dir, "log.jsonl"), "a" if config["init_from"] == "resume" else "w")
        except OSError as e:
            error = f"cannot write to --out_dir={out_dir} ({e.strerror}): choose another folder"
    if ddp:  # every process learns about rank 0's failure, rather than waiting for it forever
        shared = [error]
        dist.broadcast_object_list(shared, src=0)
        error = shared[0]
    if error:
        raise UserError(error)

    # Ctrl-C (SIGINT), or torchrun/a cluster stopping us (SIGTERM): finish the step, save, exit cleanly
    interrupted = []

    def on_signal(signum, frame):
        if interrupted:  # a second Ctrl-C: stop now, without saving
            raise KeyboardInterrupt
        interrupted.append(True)
        if master:
            print("stopping after this step to save a checkpoint (Ctrl-C again to quit without saving)", flush=True)

    handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    pending_losses = []  # (iteration, loss tensor): read back only at log/save time, to avoid a sync per step

    def last_good():
        return checkpoint_path if os.path.exists(checkpoint_path) else "none written yet"

    def check_losses():
        """Read back the pending losses; stop every process at the first non-finite one."""
        values = torch.stack([loss for _, loss in pending_losses]).tolist() if pending_losses else []
        bad = [it for (it, _), value in zip(pending_losses, values) if not math.isfinite(value)]
        first_bad = float(bad[0]) if bad else math.inf
        if ddp:  # one process's divergence stops them all, at the same point
            flag = torch.tensor([first_bad], dtype=torch.float64, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            first_bad = flag.item()
        if math.isfinite(first_bad):
            raise TrainingDiverged(f"the loss became non-finite at iteration {int(first_bad)}; stopped without "
                                   f"saving. Last good checkpoint: {last_good()} (lower --learning_rate and resume)")
        if log_file:
            for (it, _), value in zip(pending_losses, values):
                log_file.write(json.dumps({"iter": it, "loss": value}) + "\n")
        pending_losses.clear()

    def save(val_loss=None):
        """Every process takes part (its RNG state goes into the checkpoint); rank 0 writes."""
        states = rng_state(data_rng, objective_rng)
        if ddp:
            gathered = [None] * world_size
            dist.all_gather_object(gathered, states)
            states = gathered
        else:
            states = [states]
        if not all(torch.isfinite(p).all() for p in raw_model.parameters()):  # never write corrupt weights
            raise TrainingDiverged(f"the weights became non-finite before iteration {iter_num}; stopped without "
                                   f"saving. Last good checkpoint: {last_good()} (lower --learning_rate and resume)")
        if not master:
            return
        state = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "config": config,
                 "model_config": asdict(raw_model.config), "meta": meta, "iter_num": iter_num,
                 "best_val_loss": best_val_loss, "flops_done": flops_done, "rng": states}
        save_checkpoint(state, os.path.join(out_dir, "ckpt.pt"))
        if val_loss is not None and val_loss <= best_val_loss:
            save_checkpoint(state, os.path.join(out_dir, "best.pt"))

    tokens_seen = supervised_seen = 0
    last_losses = {}
    t0, timed_iters = time.perf_counter(), 0
    try:
        while True:
            done = iter_num >= config["max_iters"] or (config["max_flops"] and flops_done >= config["max_flops"])
            if iter_num % config["eval_interval"] == 0 or done:  # every process reaches this point together
                check_losses()  # a divergence is reported at the iteration where it happened
                diverged = None
                if master:
                    losses = last_losses = estimate_loss(raw_model, config, splits, specials, device, autocast)
                    if not all(math.isfinite(v) for v in losses.values()):
                        diverged = (f"the validation loss is {losses['val']} at iteration {iter_num}; stopped "
                                    f"without saving. Last good checkpoint: {last_good()} (lower --learning_rate "
                                    f"and resume)")
                if master and diverged is None:
                    log(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                        + loss_in_bits(config["objective"], losses["val"]))
                    log_file.write(json.dumps({"iter": iter_num, "train_loss": losses["train"],
                                               "val_loss": losses["val"]}) + "\n")
                    improved = losses["val"] < best_val_loss
                    best_val_loss = min(best_val_loss, losses["val"])
                    save_now = iter_num > 0 and not config["eval_only"] and \
                        (improved or config["always_save_checkpoint"] or done)
                else:
                    save_now, losses = False, {"val": None}
                if ddp:  # rank 0 decides; everyone joins the save (or stops)
                    decision = [save_now, diverged]
                    dist.broadcast_object_list(decision, src=0)
                    save_now, diverged = decision
                if diverged:
                    raise TrainingDiverged(diverged)
                if save_now:
                    save(losses["val"])
                t0, timed_iters = time.perf_counter(), 0  # evaluation and saving are not training time
            if done or config["eval_only"]:
                break

            lr = learning_rate_at(iter_num, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            steps = config["gradient_accumulation_steps"] // world_size
            step_tokens = step_supervised = step_flops = 0
            for micro_step in range(steps):
                windows = get_windows(splits["train"], config["batch_size"], config["block_size"], data_rng)
                batch = batch_for(config, windows, specials, objective_rng)
                step_tokens += batch.processed_positions()
                step_supervised += batch.supervised_positions()
                dec_len = batch.decoder_inputs.size(1) if batch.decoder_inputs is not None else 0
                step_flops += batch.inputs.size(0) * raw_model.training_flops(batch.inputs.size(1), dec_len)
                batch = batch.to(device)
                if ddp:
                    model.require_backward_grad_sync = micro_step == steps - 1
                with autocast:
                    _, loss = model(**batch.model_inputs())
                    loss = loss / steps
                scaler.scale(loss).backward()
            if config["grad_clip"] > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), config["grad_clip"])
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            pending_losses.append((iter_num, loss.detach() * steps))
            counts = [float(step_flops), float(step_tokens), float(step_supervised), float(bool(interrupted))]
            if ddp:  # sum over processes: the same budget, counts and stop decision everywhere
                counts = torch.tensor(counts, dtype=torch.float64, device=device)
                dist.all_reduce(counts)
                counts = counts.tolist()
            step_flops, step_tokens, step_supervised, stop = counts
            flops_done += step_flops
            tokens_seen += int(step_tokens)
            supervised_seen += int(step_supervised)
            timed_iters += 1

            if iter_num % config["log_interval"] == 0 or stop:
                loss_value = pending_losses[-1][1].item()  # one sync per log line
                check_losses()
                t1 = time.perf_counter()
                dt = (t1 - t0) / timed_iters  # mean over the iterations since the last log line
                t0, timed_iters = t1, 0
                log(f"iter {iter_num}: loss {loss_value:.4f}, {dt * 1000:.1f} ms/iter, "
                    f"{step_tokens / dt:,.0f} tok/s, {step_supervised / dt:,.0f} supervised tok/s, "
                    f"mfu {100 * step_flops / world_size / dt / peak_flops:.1f}%")
            iter_num += 1
            if stop:
                check_losses()
                save()
                log(f"interrupted: saved {os.path.join(out_dir, 'ckpt.pt')} at iteration {iter_num}; resume with "
                    f"the same command plus --init_from=resume")
                break
        check_losses()
        if ddp:  # the proof that gradients were averaged: every process holds the same weights
            checksum = torch.stack([p.detach().double().sum() for p in raw_model.parameters()]).cpu()
            gathered = [None] * world_size
            dist.all_gather_object(gathered, checksum)
            log(f"parameters identical on all {world_size} processes: "
                f"{all(torch.equal(gathered[0], c) for c in gathered)}")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if log_file:
            log_file.close()
    return {"model": raw_model, "iter_num": iter_num, "val_loss": last_losses.get("val"),
            "train_loss": last_losses.get("train"), "flops": flops_done, "tokens_seen": tokens_seen,
            "supervised_seen": supervised_seen, "interrupted": bool(interrupted), "meta": meta}


def loss_in_bits(objective, loss):
    """The two losses that are (bounds on) a log-likelihood, in bits per token (claim C4)."""
    if objective == "clm":
        return f" = {loss / math.log(2):.4f} bits/token (exact NLL)"
    if objective == "diffusion":
        return f" = {loss / math.log(2):.4f} bits/token (ELBO: an upper bound on the NLL)"
    return ""


class TrainingDiverged(Exception):
    pass


def main():
    config = resolve_config(sys.argv[1:])
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        from torch.distributed import init_process_group, destroy_process_group
        init_process_group(backend="nccl" if torch.cuda.is_available() and config["device"] != "cpu" else "gloo")
    try:
        train(config)
    except TrainingDiverged as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("train.py: interrupted; nothing saved since the last checkpoint", file=sys.stderr)
        sys.exit(130)
    finally:
        if ddp:
            destroy_process_group()


if __name__ == "__main__":
    run_main(main)
