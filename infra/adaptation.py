"""
train.py --init_from=<a gpt run's out_dir>: start another architecture from a trained gpt's weights (claim G1,
experiments/adaptation.py), as recent work builds encoders, diffusion models and encoder-decoders from decoders.

    bert, prefixlm, a diffusion bert   every module is gpt's, unchanged: only the mask differs (claim A1); a
                                       diffusion model also shifts its outputs (--shift_logits: DiffusionFromGpt,
                                       below) and opens its mask step by step (--anneal_steps: `training_batch`
                                       gives each training batch its step's masks.annealed_mask), DiffuGPT's
                                       recipe
    t5                                 each stack starts as gpt's lowest blocks (the encoder's n_layer, the
                                       decoder's n_decoder_layer); each decoder block's new cross-attention starts
                                       as a copy of its self-attention, its norm as a copy of the self-attention's
                                       norm (T5Gemma's rule); both stacks' final norms start as gpt's

T5Gemma (arXiv 2504.06225) copies the whole decoder into each stack, doubling the parameters. A t5 with the
parameter count of the one it is compared with has half of gpt's layers in each stack, so each stack is gpt cut to
its lower half: each stack's first block reads embeddings, as the gpt block it starts from did. (The other way,
the encoder gpt's lower blocks and the decoder its upper ones, keeps every weight but feeds the decoder's first
block embeddings where its gpt block read the middle of the stack.)
"""
import re
from dataclasses import dataclass
from typing import Optional

import torch

import masks
from infra.configurator import UserError
from infra.train_config import model_config
from model import ModelConfig, Transformer
from objectives import Batch, batch_for

SHARED_SHAPE = ("n_head", "n_embd", "block_size", "bias", "position", "d_ff")  # what the two must agree on


def weight_map(source, target):
    """{target parameter name: source (gpt) parameter name} for every parameter of `target`."""
    names = {name for name, _ in target.named_parameters(remove_duplicate=False)}
    if target.config.arch != "t5":
        return {name: name for name in names}

    def source_of(name):
        decoder = re.match(r"decoder_blocks\.(\d+)\.(\w+)\.(.+)", name)
        if decoder:  # decoder block j <- gpt block j; its cross-attention <- that block's self-attention
            block, module, rest = decoder.groups()
            module = {"cross_attention": "attention", "norm_cross": "norm_1"}.get(module, module)
            return f"blocks.{block}.{module}.{rest}"
        if name.startswith("decoder_norm."):
            return "final_norm." + name[len("decoder_norm."):]
        return name  # embeddings, encoder block i <- gpt block i, the encoder's final norm

    return {name: source_of(name) for name in names}


def copy_weights(source, target):
    """Copy gpt `source`'s weights into `target` by weight_map; a shape that does not fit is a UserError."""
    sources = dict(source.named_parameters(remove_duplicate=False))
    targets = dict(target.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name, from_name in weight_map(source, target).items():
            if from_name not in sources or sources[from_name].shape != targets[name].shape:
                raise UserError(f"cannot start {target.config.arch}'s {name} from gpt's {from_name}: the two models' "
                                f"shapes differ")
            targets[name].copy_(sources[from_name])


def adapted_model(config, meta, checkpoint, source):
    """The model train.py's config describes, its weights copied from `source`, the gpt of config["init_from"]
    (`checkpoint`: its checkpoint, read by infra/checkpoint.py)."""
    target = model_for(model_config(config, meta["vocab_size"]))
    s, t = source.config, target.config
    if s.arch != "gpt" or "family" in checkpoint["model_config"]:
        raise UserError(f"--init_from={config['init_from']} holds a {s.arch} run: adaptation starts from a gpt trained "
                        f"by train.py")
    if any(checkpoint["meta"].get(k) != meta.get(k) for k in ("vocab_size", "tokenizer", "itos")):
        raise UserError(f"--init_from={config['init_from']} was trained on another vocabulary "
                        f"({checkpoint['meta'].get('vocab_size')} tokens, here {meta['vocab_size']}): train on its "
                        f"dataset")
    differ = [f"{k} {getattr(s, k)} (here {getattr(t, k)})" for k in SHARED_SHAPE if getattr(s, k) != getattr(t, k)]
    fixes = [f"--{k}={getattr(s, k)}" for k in SHARED_SHAPE  # d_ff is 4 x n_embd: it follows --n_embd
             if getattr(s, k) != getattr(t, k) and k != "d_ff"]
    layers = lambda n: f"{n} layer{'s' if n != 1 else ''}"  # noqa: E731
    if t.arch == "t5" and max(t.n_layer, t.n_decoder_layer) > s.n_layer:
        differ.append(f"{layers(s.n_layer)} (here a stack of {max(t.n_layer, t.n_decoder_layer)}: each t5 stack "
                      f"starts as gpt's lowest blocks)")
        fixes.append(f"--n_layer and --n_decoder_layer of at most {s.n_layer}")
    elif t.arch != "t5" and t.n_layer != s.n_layer:
        differ.append(f"{layers(s.n_layer)} (here {t.n_layer})")
        fixes.append(f"--n_layer={s.n_layer}")
    if differ:  # only what makes this run fit the gpt: continuing the gpt's own run would not adapt it
        raise UserError(f"--init_from={config['init_from']}: its gpt has {', '.join(differ)}; give this run the gpt's "
                        f"shape: {' '.join(fixes)}")
    copy_weights(source, target)
    return target


# ----------------------------------------------------------------------------- a gpt made into a diffusion model

class DiffusionFromGpt(Transformer):
    """model.py's Transformer (a bert: the bidirectional mask) whose weights come from a gpt and keep its outputs
    where they were (--shift_logits, DiffuGPT's recipe): gpt's head at position i - 1 goes on predicting token i, so
    the logits are realigned here, beside the chapter's model, so that row i scores token i as in every other model.
    Row 0 has no position before it: it is uniform, and the diffusion objective never masks position 0 of such a
    model (objectives.diffusion's keep_first)."""

    def forward(self, inputs, targets=None, prefix_length=None, decoder_inputs=None, lengths=None,
                loss_weights=None, attention=None):
        logits, _ = super().forward(inputs, prefix_length=prefix_length, lengths=lengths, attention=attention)
        if self.config.shift_logits:  # (B, T, V): row i <- row i - 1, row 0 zeros (uniform)
            logits = torch.cat([torch.zeros_like(logits[:, :1]), logits[:, :-1]], dim=1)
        return logits, (None if targets is None else self.loss(logits, targets, loss_weights))


def model_for(settings: ModelConfig):
    """The model of `settings`: a DiffusionFromGpt where its outputs are shifted, else model.py's Transformer."""
    return DiffusionFromGpt(settings) if settings.shift_logits else Transformer(settings)


@dataclass
class AnnealedBatch(Batch):
    """objectives.Batch with the attention mask of its training step (the model's `attention`, instead of the
    arch's mask)."""
    attention: Optional[torch.Tensor] = None  # (T, T) bool: True = may attend

    def to(self, device):
        return AnnealedBatch(**{k: (v.to(device, non_blocking=True) if v is not None else None)
                                for k, v in self.model_inputs().items()})


def training_batch(config, windows, specials, generator, iter_num):
    """The batch train.py's loop trains on at iteration iter_num: objectives.batch_for's, and for a gpt being
    opened into a masked-diffusion model (--anneal_steps) the attention mask of that step with it
    (masks.annealed_mask: causal at the first step, a random share of the future keys opened after it, drawn from
    `generator` after the batch's own draws); from the last annealing step on, none: bert's own mask."""
    batch = batch_for(config, windows, specials, generator)
    opened = masks.annealed_fraction(iter_num, config["anneal_steps"]) if config["anneal_steps"] else 1.0
    if opened < 1:
        attention = masks.annealed_mask(config["block_size"], opened, generator)  # (T, T)
        return AnnealedBatch(**batch.model_inputs(), attention=attention)
    return batch
