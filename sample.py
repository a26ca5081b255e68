"""
Generate from a checkpoint written by train.py.

    python sample.py --out_dir=out-gpt --start="ROMEO:" --max_new_tokens=240
    python sample.py --out_dir=out-gpt --no_cache          # full recomputation each token, for comparison
    python sample.py --out_dir=out-bert --steps=16         # mask-predict: N [MASK]s filled over 16 forward passes

gpt, prefixlm and t5 decode left to right with a KV cache (kvcache.py). bert cannot (claim D4): its conditionals
do not chain into a left-to-right density (claim C4), so it fills [MASK] placeholders by iterative unmasking,
which is also the sampler of a masked-diffusion model (--objective=diffusion). Every run prints the text, the
number of forward passes and the decode speed.
"""
import math
import os
import sys
import time

import torch

from configurator import UserError, apply_overrides, run_main
from kvcache import generate, sample_next
from model import Transformer, ModelConfig
from objectives import Specials
from train import load_checkpoint, pick_device

DEFAULTS = dict(
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
    order="confident",        # bert / diffusion: reveal the most confident positions, or random ones
    block_length=0,           # bert / diffusion: > 0 = semi-autoregressive blocks left to right
)


# ----------------------------------------------------------------------------- tokenizer from meta.pkl

class Tokenizer:
    def __init__(self, meta):
        self.meta = meta
        self.names = {i: name for name, i in meta["specials"].items()}
        if meta["tokenizer"] == "char":
            self.stoi, self.itos = meta["stoi"], meta["itos"]
        else:
            import tiktoken
            try:
                self.encoding = tiktoken.get_encoding(meta["tokenizer"])
            except Exception as e:
                raise UserError(f"tiktoken could not load the {meta['tokenizer']} encoding ({type(e).__name__}); "
                                "offline, set TIKTOKEN_CACHE_DIR to a folder holding its files") from None

    def encode(self, text):
        if self.meta["tokenizer"] != "char":
            return self.encoding.encode_ordinary(text)
        unknown = sorted(set(c for c in text if c not in self.stoi))
        if unknown:
            raise UserError(f"the prompt has characters outside the vocabulary: {''.join(unknown)!r}; "
                            f"use only characters of the training text")
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        out, ordinary = [], []
        for i in ids:
            if i in self.names:
                out.append(self._decode_ordinary(ordinary) + self.names[i])
                ordinary = []
            else:
                ordinary.append(i)
        return "".join(out) + self._decode_ordinary(ordinary)

    def _decode_ordinary(self, ids):
        if not ids:
            return ""
        return "".join(self.itos[i] for i in ids) if self.meta["tokenizer"] == "char" else self.encoding.decode(ids)


# ----------------------------------------------------------------------------- iterative unmasking

@torch.inference_mode()
def iterative_unmask(model, prompt, num_new, steps, mask_id, num_samples=1, temperature=1.0, top_k=None,
                     order="confident", block_length=0, generator=None, banned=None):
    """Append num_new [MASK]s after the prompt and fill them over `steps` bidirectional forward passes. Each pass
    predicts every masked position; a share of them is revealed (the most confident, or random ones) and the rest
    stay masked for the next pass. With block_length > 0 the masks are filled block by block, left to right
    (semi-autoregressive), the steps split evenly between blocks. This is mask-predict for bert and the standard
    sampler of masked diffusion; revealed tokens stay fixed. Returns (tokens, forward passes)."""
    model.eval()
    if steps < 1:
        raise ValueError("steps must be at least 1")
    P = prompt.size(1)
    x = torch.cat([prompt, torch.full((1, num_new), mask_id, device=prompt.device)], dim=1).repeat(num_samples, 1)
    block_length = block_length or num_new
    blocks = [(s, min(s + block_length, P + num_new)) for s in range(P, P + num_new, block_length)]
    steps_per_block = max(1, steps // len(blocks))
    passes = 0
    for start, end in blocks:
        for step in range(steps_per_block):
            masked = x[:, start:end] == mask_id  # (S, n)
            remaining = int(masked.sum(dim=1).max())
            if remaining == 0:
                break
            logits, _ = model(x)
            passes += 1
            logits = logits[:, start:end]  # (S, n, V)
            S, n, V = logits.shape
            candidates = sample_next(logits.reshape(S * n, V), temperature, top_k, generator, banned).view(S, n)
            if order == "confident":
                probs = torch.softmax(logits.float(), dim=-1)
                score = probs.gather(-1, candidates[..., None])[..., 0]
            else:
                score = torch.rand(S, n, generator=generator, device=logits.device)
            score = score.masked_fill(~masked, -1.0)  # only masked positions compete
            # reveal an even share of what is left, everything on the block's last step
            reveal = math.ceil(remaining / (steps_per_block - step))
            chosen = torch.zeros_like(masked)
            chosen.scatter_(1, score.topk(min(reveal, n), dim=1).indices, True)
            chosen &= masked
            x[:, start:end] = torch.where(chosen, candidates, x[:, start:end])
    return x, passes


# ----------------------------------------------------------------------------- the command

def load_model(out_dir, checkpoint_name, device):
    checkpoint = load_checkpoint(os.path.join(out_dir, checkpoint_name), device)
    model = Transformer(ModelConfig(**checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"])
    return model.to(device).eval(), checkpoint


def read_prompt(start):
    if start.startswith("FILE:"):
        path = start[5:]
        if not os.path.isfile(path):
            raise UserError(f"prompt file {path} not found")
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except UnicodeDecodeError:
            raise UserError(f"prompt file {path} is not UTF-8 text") from None
    return start


def main():
    config = apply_overrides(DEFAULTS, sys.argv[1:])
    for key in ("num_samples", "max_new_tokens", "steps"):
        if config[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {config[key]}")
    if config["temperature"] < 0 or config["top_k"] < 0 or config["block_length"] < 0:
        raise UserError("--temperature, --top_k and --block_length must not be negative")
    if 0 < config["temperature"] < 1e-3:
        raise UserError(f"--temperature={config['temperature']} is too small to sample with: use 0 for greedy")
    if config["order"] not in ("confident", "random"):
        raise UserError(f"--order={config['order']}: choose confident or random")
    device = pick_device(config["device"])
    model, checkpoint = load_model(config["out_dir"], config["checkpoint"], device)
    arch, objective, meta = model.config.arch, checkpoint["config"]["objective"], checkpoint["meta"]
    specials, tokenizer = Specials.from_meta(meta), Tokenizer(meta)
    text = read_prompt(config["start"])
    if not text:
        raise UserError("the prompt is empty: pass --start=<text> (or FILE:path)")
    ids = tokenizer.encode(text)
    block_size = model.config.block_size
    extra = 1 if objective == "ul2" else 2 if (arch, objective) == ("t5", "span_corruption") else 0  # mode/sentinel
    if len(ids) + extra > block_size:
        raise UserError(f"the prompt has {len(ids)} tokens but the model's context is {block_size}: shorten it")
    if arch == "bert" and len(ids) + config["max_new_tokens"] > block_size:
        raise UserError(f"bert fills masks inside its context: prompt ({len(ids)}) + --max_new_tokens "
                        f"({config['max_new_tokens']}) must be at most {block_size}")
    torch.manual_seed(config["seed"])
    generator = torch.Generator(device=device).manual_seed(config["seed"])
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
    all_specials = torch.arange(specials.num_ordinary, meta["vocab_size"], device=device)
    top_k = config["top_k"] or None
    n, N = config["num_samples"], config["max_new_tokens"]

    t0 = time.perf_counter()
    if arch == "bert":
        tokens, passes = iterative_unmask(model, prompt, N, config["steps"], specials.mask, n, config["temperature"],
                                          top_k, config["order"], config["block_length"], generator, all_specials)
        how = f"iterative unmasking ({config['order']}, {passes} full forward passes for {N} tokens)"
        outputs = [tokenizer.decode(row) for row in tokens.tolist()]
    elif arch == "t5":
        # what the encoder reads depends on how it was trained: span filling, UL2's [S2S] mode, or a prefix
        if objective == "span_corruption":
            source = ids + [specials.sentinels[0], specials.eos]
            banned = torch.tensor([specials.pad, specials.mask, *specials.modes.values()], device=device)
        else:
            source = ([specials.modes["S"]] if objective == "ul2" else []) + ids
            banned = all_specials
        tokens = generate(model, None, N, n, config["temperature"], top_k, not config["no_cache"], generator,
                          banned, encoder_inputs=torch.tensor([source], device=device), start_token=specials.pad)
        passes = N
        how = "encoder once, cached decoder" if not config["no_cache"] else "encoder + decoder recomputed per token"
        outputs = [text + " => " + tokenizer.decode(row[1:]).split("[EOS]")[0] for row in tokens.tolist()]
    else:
        if objective == "ul2":  # UL2's sequential denoiser reads [S2S] first
            prompt = torch.cat([torch.tensor([[specials.modes["S"]]], device=device), prompt], dim=1)
        tokens = generate(model, prompt, N, n, config["temperature"], top_k, not config["no_cache"], generator,
                          all_specials)
        passes = N
        how = "KV cache (one shared prefill, one position per step)" if not config["no_cache"] else \
            "full recomputation per token"
        outputs = [tokenizer.decode(row[prompt.size(1):]) for row in tokens.tolist()]
        outputs = [text + out for out in outputs]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    for out in outputs:
        print(out)
        print("---------------")
    print(f"{arch} ({objective}): {n} x {N} tokens in {seconds:.2f} s = {n * N / seconds:,.1f} tokens/s; "
          f"{how}; {passes} forward passes per sample")


if __name__ == "__main__":
    run_main(main)
