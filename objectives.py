"""
Training objectives: each turns windows of token ids into a Batch (model inputs, targets with
IGNORE_INDEX where there is no loss). Objectives know nothing about the model; the model knows
nothing about objectives.

    clm              next token, every position supervised         gpt (claim C1: ~100% supervised)
    mlm              BERT: 15% chosen, of those 80% [MASK] /       bert (C1: ~15%; C2, C3)
                     10% random / 10% kept
    prefix_lm        random split, prefix bidirectional, loss on   prefixlm, t5
                     the suffix
    span_corruption  T5: spans of mean length 3 covering 15%,      t5, prefixlm (F1)
                     sentinels
    ul2              UL2's mixture of R / X / S denoisers with a   t5, prefixlm (F2)
                     mode token
    diffusion        masked diffusion: rate t ~ U(eps, 1), loss    bert (C4: an ELBO)
                     weighted 1/t

Every batch knows its `supervised_fraction`: positions that carry a loss / positions the model
computes (C1). Windows arrive as (B, T+1) int64 tensors; clm uses all T+1 (input and shifted
target), the others use as much of the window as fits in T input positions. Every batch maker takes
(windows, specials, generator, arch, knobs...), in that order; the knobs keep the published values
as defaults (BERT's 15% and 80/10/10, T5's 15% and spans of 3).

    python objectives.py     # claims C1, C2 and C4 on random tokens and random weights, in seconds
"""
from dataclasses import dataclass, fields
from typing import Optional

import torch

from model import IGNORE_INDEX

OBJECTIVES_FOR_ARCH = {  # first = default
    "gpt": ("clm",),
    "bert": ("mlm", "diffusion"),
    "prefixlm": ("prefix_lm", "span_corruption", "ul2"),
    "t5": ("span_corruption", "ul2", "prefix_lm"),
}


@dataclass
class Specials:
    """Special-token ids, read from the dataset's meta.pkl (defined once, in
    data/prepare_common.py)."""
    num_ordinary: int   # ids below this are text; ids from here on are special tokens
    pad: int
    eos: int
    mask: int
    sentinels: list     # <S0>, <S1>, ... for span corruption
    modes: dict         # UL2 mode tokens: {"R": [NLU], "X": [NLG], "S": [S2S]}
    never_sampled: Optional[list] = None  # published vocabularies (pretrained.py): their special
                                          # ids, wherever they sit
    tokenizer_size: Optional[int] = None  # published: ids from here to the model's vocab_size
                                          # are padding (T5: 28)

    def banned(self, vocab_size, device=None):
        """The ids a sampler must never emit (the samplers' `banned`): ours are everything from
        num_ordinary on; a published vocabulary's are its special ids (never_sampled) and the
        padding rows past its tokenizer."""
        if self.never_sampled is not None:
            unused = list(range(self.tokenizer_size or vocab_size, vocab_size))
            return torch.tensor(self.never_sampled + unused, dtype=torch.long, device=device)
        return torch.arange(self.num_ordinary, vocab_size, device=device)

    @classmethod
    def from_meta(cls, meta):
        """Ours (data/prepare_common.py), or a published tokenizer's ids under our names
        (pretrained.dataset_meta: BERT's [MASK], T5's <extra_id_k> as <Sk>; no UL2 mode tokens, no
        [MASK] in T5)."""
        s = meta["specials"]
        sentinels = [s[f"<S{i}>"] for i in range(meta["num_sentinels"])]
        modes = {mode: s[name] for mode, name in (("R", "[NLU]"), ("X", "[NLG]"), ("S", "[S2S]"))
                 if name in s}
        published = meta.get("never_sampled") is not None
        return cls(meta["num_ordinary"], s["[PAD]"], s["[EOS]"], s["[MASK]"], sentinels, modes,
                   meta.get("never_sampled"), meta["vocab_size"] if published else None)


@dataclass
class Batch:
    inputs: torch.Tensor                          # (B, T) ids; t5: the encoder's input
    targets: torch.Tensor                         # (B, T) or (B, T_dec) for t5;
                                                  # IGNORE_INDEX = no loss
    prefix_length: Optional[torch.Tensor] = None  # (B,) prefixlm: bidirectional prefix per example
    decoder_inputs: Optional[torch.Tensor] = None # (B, T_dec) t5: targets shifted right
    lengths: Optional[torch.Tensor] = None        # (B,) t5: each encoder input's real
                                                  # length (rows padded)
    loss_weights: Optional[torch.Tensor] = None   # (B, T) diffusion's 1/t

    def model_inputs(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to(self, device):
        return Batch(**{k: (v.to(device, non_blocking=True) if v is not None else None)
                        for k, v in self.model_inputs().items()})

    def supervised_positions(self):
        return int((self.targets != IGNORE_INDEX).sum())

    def processed_positions(self):
        """Positions every stack computes
        (claim C1: unsupervised positions cost full compute too)."""
        return self.inputs.numel() + (self.decoder_inputs.numel()
                                      if self.decoder_inputs is not None else 0)

    def supervised_fraction(self):
        return self.supervised_positions() / self.processed_positions()


# ----------------------------------------------------------------------------- next token (gpt)

def clm(windows, specials=None, generator=None, arch="gpt"):
    """Causal LM: the target of position i is token i+1, every position supervised."""
    return Batch(inputs=windows[:, :-1], targets=windows[:, 1:])


# ----------------------------------------------------------------------------- BERT's masked LM

def mlm(windows, specials, generator, arch="bert", rate=0.15, mask_fraction=0.8,
        random_fraction=0.1):
    """BERT: choose round(rate * n) of the n non-special positions of each row (at least one); of
    those, mask_fraction become [MASK], random_fraction a random text token, the rest stay unchanged
    (claim C2's patch). Loss only on the chosen positions (claim C1), each predicted by its own
    softmax (claim C3)."""
    x = windows[:, :-1]
    B, T = x.shape
    eligible = x < specials.num_ordinary  # special tokens are never chosen
    scores = torch.rand(B, T, generator=generator).masked_fill(~eligible, 2.0)
    rank = scores.argsort(dim=1).argsort(dim=1)  # rank of each position's score in its row
    n_eligible = eligible.sum(dim=1, keepdim=True)
    n_chosen = torch.where(n_eligible > 0, (rate * n_eligible).round().clamp(min=1), 0)
    chosen = (rank < n_chosen) & eligible
    kind = torch.rand(B, T, generator=generator)
    to_mask = chosen & (kind < mask_fraction)
    to_random = chosen & (kind >= mask_fraction) & (kind < mask_fraction + random_fraction)
    random_tokens = torch.randint(0, specials.num_ordinary, (B, T), generator=generator)
    inputs = torch.where(to_mask, specials.mask, torch.where(to_random, random_tokens, x))
    targets = torch.where(chosen, x, IGNORE_INDEX)
    return Batch(inputs=inputs, targets=targets)


# ----------------------------------------------------------------------------- masked diffusion

def diffusion(windows, specials, generator, arch="bert", eps=1e-3, rate=None, stratified=True,
              keep_first=False):
    """Masked diffusion (MDLM/LLaDA style): per sequence draw t ~ U(eps, 1), replace each text token
    by [MASK] with probability t (no 80/10/10), and weight the cross-entropy of masked positions by
    1/t, averaged over all positions. In expectation that is the ELBO, an upper bound on -log p(x)
    (claim C4). `rate` fixes t (tests); stratified=False draws each row's t independently
    (experiments/plateau.py measures what stratifying saves). keep_first: position 0 is never masked
    (a model adapted from gpt reads token i off position i - 1: nothing before position 0 can
    predict it; DiffuGPT never scores the first token either)."""
    x = windows[:, :-1]
    B, T = x.shape
    if rate is not None:
        if not 0 < rate <= 1:  # the 1/t weight: t = 0 would divide by zero
            raise ValueError(f"diffusion's masking rate must be in (0, 1], got {rate}")
        t = torch.full((B, 1), float(rate))
    else:
        # stratified over the batch (MDLM's low-discrepancy sampler): same expectation,
        # less gradient noise
        u = ((torch.rand(1, generator=generator) + torch.arange(B)[:, None] / B) % 1.0 if stratified
             else torch.rand(B, 1, generator=generator))  # (B, 1)
        t = eps + (1 - eps) * u
    masked = (torch.rand(B, T, generator=generator) < t) & (x < specials.num_ordinary)
    if keep_first:
        masked[:, 0] = False
    return Batch(inputs=torch.where(masked, specials.mask, x),
                 targets=torch.where(masked, x, IGNORE_INDEX), loss_weights=masked.float() / t)


# --------------------------------------------------------------------- sequence-to-sequence layouts

def seq2seq_batch(sources, targets, arch, specials):
    """Lay out (source, target) pairs for either architecture that can read a source
    and write a target:
    t5:       encoder <- source; decoder <- [PAD] + target[:-1] (T5 starts decoding from PAD);
              loss on target.
    prefixlm: one sequence source + target[:-1], the source as the bidirectional prefix (claim A2:
              the same pattern as t5, flattened into one stack); loss on the target
              positions only."""
    B = len(sources)
    if arch == "t5":
        lengths = torch.tensor([len(s) for s in sources])
        inputs = torch.full((B, int(lengths.max())), specials.pad)
        T_dec = max(len(target) for target in targets)
        decoder_inputs = torch.full((B, T_dec), specials.pad)
        labels = torch.full((B, T_dec), IGNORE_INDEX)
        for i, (source, target) in enumerate(zip(sources, targets)):
            inputs[i, :len(source)] = source
            decoder_inputs[i, 1:len(target)] = target[:-1]
            labels[i, :len(target)] = target
        padded = bool((lengths != lengths.max()).any())
        return Batch(inputs=inputs, targets=labels, decoder_inputs=decoder_inputs,
                     lengths=lengths if padded else None)
    if arch == "prefixlm":
        length = max(len(source) + len(target) - 1 for source, target in zip(sources, targets))
        inputs = torch.full((B, length), specials.pad)
        labels = torch.full((B, length), IGNORE_INDEX)
        for i, (source, target) in enumerate(zip(sources, targets)):
            n = len(source) + len(target) - 1
            inputs[i, :n] = torch.cat([source, target[:-1]])
            labels[i, len(source) - 1:n] = target  # the last source position predicts the
                                                   # first target token
        # padding sits after every real token, and real tokens never attend forward past the prefix:
        # harmless
        return Batch(inputs=inputs, targets=labels,
                     prefix_length=torch.tensor([len(s) for s in sources]))
    raise ValueError(f"arch {arch!r} has no source/target layout")


def prefix_lm(windows, specials, generator, arch):
    """Prefix LM: a random split point P in [1, T-1] per example; the prefix is seen
    bidirectionally, the loss is on the suffix only (predicting tokens P..T)."""
    B, T = windows.shape[0], windows.shape[1] - 1
    if T < 2:
        raise ValueError("prefix_lm needs windows of at least 3 tokens")
    split = torch.randint(1, T, (B,), generator=generator)
    sources = [w[:p] for w, p in zip(windows, split.tolist())]
    targets = [w[p:] for w, p in zip(windows, split.tolist())]
    return seq2seq_batch(sources, targets, arch, specials)


# ----------------------------------------------------------------------------- T5 span corruption

def span_counts(length, noise_density=0.15, mean_span=3.0, max_spans=None):
    """T5's counts: num_noise = round(L * density) within [1, L-1]; num_spans = max(1,
    round(num_noise / mean)). The span count adapts (never an empty span): at most num_noise,
    num_nonnoise and the number of sentinels."""
    if length < 2:
        raise ValueError("span corruption needs at least 2 tokens")
    num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
    num_spans = max(1, int(round(num_noise / mean_span)))
    num_spans = min(num_spans, num_noise, length - num_noise, max_spans or num_spans)
    return num_noise, num_spans


def random_segmentation(num_items, num_segments, generator):
    """A uniformly random split of num_items into num_segments non-empty, ordered parts (T5's
    _random_segmentation)."""
    cuts = torch.randperm(num_items - 1, generator=generator)[:num_segments - 1].sort().values + 1
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([num_items])])
    return bounds.diff().tolist()


def corrupt_spans(tokens, specials, generator, noise_density=0.15, mean_span=3.0):
    """One sequence -> (source, target) with T5's algorithm: noise and non-noise lengths each a
    random segmentation, the sequence starting with non-noise; span k replaced by sentinel <Sk>.
        source: kept0 <S0> kept1 <S1> ... kept_{n-1} <S_{n-1}> EOS
        target: <S0> span0 <S1> span1 ... <S_{n-1}> span_{n-1} EOS"""
    L = len(tokens)
    num_noise, num_spans = span_counts(L, noise_density, mean_span, len(specials.sentinels))
    noise_lengths = random_segmentation(num_noise, num_spans, generator)
    kept_lengths = random_segmentation(L - num_noise, num_spans, generator)
    source, target, position = [], [], 0
    for k, (kept, noise) in enumerate(zip(kept_lengths, noise_lengths)):
        sentinel = torch.tensor([specials.sentinels[k]])
        source += [tokens[position:position + kept], sentinel]
        position += kept
        target += [sentinel, tokens[position:position + noise]]
        position += noise
    eos = torch.tensor([specials.eos])
    return torch.cat(source + [eos]), torch.cat(target + [eos])


def seq2seq_lengths(length, noise_density, mean_span, max_spans):
    num_noise, num_spans = span_counts(length, noise_density, mean_span, max_spans)
    # source, target (with EOS)
    return length - num_noise + num_spans + 1, num_noise + num_spans + 1


def fitting_text_length(budget, arch, noise_density, mean_span, max_spans, extra_source_tokens=0):
    """The longest text whose corrupted layout fits in `budget` input positions: t5 needs source <=
    budget and target <= budget; prefixlm puts source + target - 1 in one sequence."""
    for length in range(budget + 1, 1, -1):
        source, target = seq2seq_lengths(length, noise_density, mean_span, max_spans)
        source += extra_source_tokens
        used = max(source, target) if arch == "t5" else source + target - 1
        if used <= budget:
            return length
    return None  # not even 2 tokens of text fit


def span_corruption(windows, specials, generator, arch, noise_density=0.15, mean_span=3.0):
    T = windows.shape[1] - 1
    L = fitting_text_length(T, arch, noise_density, mean_span, len(specials.sentinels))
    if L is None:
        raise ValueError(f"span corruption needs a longer block than {T} for arch {arch}")
    pairs = [corrupt_spans(w[:L], specials, generator, noise_density, mean_span) for w in windows]
    return seq2seq_batch([source for source, _ in pairs], [target for _, target in pairs], arch,
                         specials)


# ---------------------------------------------------------------------- UL2: a mixture of denoisers

UL2_DENOISERS = {  # name: (mode, mean span, noise density); S is prefix LM
    "R-3": ("R", 3, 0.15), "R-8": ("R", 8, 0.15),                     # regular span corruption
    "X-3": ("X", 3, 0.5), "X-8": ("X", 8, 0.5),                       # extreme: high rate ...
    "X-64-0.15": ("X", 64, 0.15), "X-64-0.5": ("X", 64, 0.5),         # ... or long spans
    "S": ("S", None, None),                                           # sequential: prefix LM
}


def ul2_example(tokens, name, specials, generator, arch, budget):
    """One example through one UL2 denoiser; the source starts with the denoiser's mode token.
    `tokens` holds at least budget + 1 ids; span lengths adapt to what fits in `budget` positions
    (never an empty span)."""
    if budget < 2:
        raise ValueError("a UL2 example needs a budget of at least 2 positions (the mode token "
                         "and a token)")
    mode, mean_span, density = UL2_DENOISERS[name]
    if mode != "S":
        L = fitting_text_length(budget, arch, density, mean_span, len(specials.sentinels),
                                extra_source_tokens=1)
        if L is None:  # a window too short for any span: fall back to the sequential denoiser
            mode = "S"
    mode_token = torch.tensor([specials.modes[mode]])
    if mode == "S":
        # prefixlm: mode token + text - 1 <= budget
        L = budget if arch == "prefixlm" else budget + 1
        split = int(torch.randint(1, L - 1, (1,), generator=generator)) if L > 2 else 1
        source, target = tokens[:split], tokens[split:L]
    else:
        source, target = corrupt_spans(tokens[:L], specials, generator, density, mean_span)
    return torch.cat([mode_token, source]), target


def ul2(windows, specials, generator, arch, mixture=(0.5, 0.25, 0.25)):
    """UL2 (claim F2): each example draws a denoiser, S / R / X with the mixture's weights (a
    family's weight is shared evenly by its members), and its source starts with the mode token
    ([S2S], [NLU], [NLG])."""
    T = windows.shape[1] - 1
    weights = {"S": mixture[0], "R": mixture[1], "X": mixture[2]}
    names = list(UL2_DENOISERS)
    family_size = {m: sum(1 for n in names if UL2_DENOISERS[n][0] == m) for m in weights}
    probs = torch.tensor([weights[UL2_DENOISERS[n][0]] / family_size[UL2_DENOISERS[n][0]]
                          for n in names])
    choice = torch.multinomial(probs, len(windows), replacement=True, generator=generator)
    pairs = [ul2_example(w, names[c], specials, generator, arch, T)
             for w, c in zip(windows, choice.tolist())]
    return seq2seq_batch([source for source, _ in pairs], [target for _, target in pairs], arch,
                         specials)


# ----------------------------------------------------------------------------- the one switch

# the knobs a settings dict may hold (a training config holds the first two groups' train.py keys),
# and the argument of the batch maker each one sets; a knob that is absent keeps the batch maker's
# default, the published value
KNOBS = {"mlm": {"mlm_rate": "rate", "mlm_mask_fraction": "mask_fraction",
                 "mlm_random_fraction": "random_fraction"},
         "span_corruption": {"noise_density": "noise_density", "mean_span": "mean_span"},
         "ul2": {"ul2_mixture": "mixture"}, "diffusion": {"shift_logits": "keep_first"}}
BATCH_MAKERS = {"clm": clm, "mlm": mlm, "diffusion": diffusion, "prefix_lm": prefix_lm,
                "span_corruption": span_corruption, "ul2": ul2}


def batch_for(settings, windows, specials, generator):
    """The one place where the objective enters: windows (B, T+1) -> the Batch of
    settings["objective"] for settings["arch"]. `settings` is a training config (train.py) or any
    dict with those two keys."""
    objective, arch = settings["objective"], settings["arch"]
    if objective not in OBJECTIVES_FOR_ARCH.get(arch, ()):
        allowed = ", ".join(OBJECTIVES_FOR_ARCH.get(arch, ()))
        raise ValueError(f"objective {objective!r} does not fit arch {arch!r}: choose one of "
                         f"{allowed}")
    knobs = {argument: settings[key] for key, argument in KNOBS.get(objective, {}).items()
             if key in settings}
    return BATCH_MAKERS[objective](windows, specials, generator, arch, **knobs)


# ----------------------------------------------------------------------------- python objectives.py

def synthetic_specials(vocab_size):
    """The special ids of a vocabulary of vocab_size, laid out as data/prepare_common.py lays them
    after the text ids: [PAD] [EOS] [MASK], UL2's three mode tokens, 100 sentinels (this demo's and
    bench.py's random tokens)."""
    num_ordinary = vocab_size - 106
    pad, eos, mask = num_ordinary, num_ordinary + 1, num_ordinary + 2
    modes = {"R": num_ordinary + 3, "X": num_ordinary + 4, "S": num_ordinary + 5}
    return Specials(num_ordinary, pad, eos, mask, list(range(num_ordinary + 6, num_ordinary + 106)),
                    modes)


@torch.no_grad()
def demo_density():
    """Claim C4 on every sequence of 3 symbols out of 3, with random (sharpened) weights: gpt's
    chain of conditionals is one distribution; bert's conditionals, chained in two
    orders, give two."""
    from itertools import product
    from model import ModelConfig, Transformer
    sequences = torch.tensor(list(product(range(3), repeat=3)))  # (27, 3)
    mask = 3
    models = {}
    for arch in ("gpt", "bert"):
        torch.manual_seed(0)
        models[arch] = Transformer(ModelConfig(arch=arch, vocab_size=4, block_size=4, n_layer=2,
                                               n_head=2, n_embd=16)).eval()
        for p in models[arch].parameters():
            p.mul_(20)  # sharpened: random weights far from uniform, so that differences show
    # gpt: log p(x) = sum_i log p(x_i | x_<i), the first symbol read after a start token
    # (the mask id here)
    inputs = torch.cat([torch.full((27, 1), mask), sequences[:, :-1]], dim=1)
    log_p = torch.log_softmax(models["gpt"](inputs)[0][..., :3], dim=-1)  # (27, 3, 3)
    gpt_joint = log_p.gather(-1, sequences[..., None]).sum(dim=(1, 2)).exp()

    def chain(order):  # bert: fill the masks one at a time in this order, each from its own softmax
        x, total = torch.full((27, 3), mask), torch.zeros(27)
        for i in order:
            log_p = torch.log_softmax(models["bert"](x)[0][:, i, :3], dim=-1)
            total += log_p.gather(-1, sequences[:, i:i + 1])[:, 0]
            x[:, i] = sequences[:, i]
        return total.exp()

    left, right = chain((0, 1, 2)), chain((2, 1, 0))
    print(f"C4: gpt's p(x) = p(x1) p(x2|x1) p(x3|x1,x2) sums to {gpt_joint.sum().item():.6f} over "
          "all 27 sequences: one normalised distribution, sampled left to right")
    print("C4: bert's conditionals chained left to right and right to left: two distributions "
          f"(each sums to {left.sum().item():.3f}, {right.sum().item():.3f}) that differ by up to "
          f"{(left - right).abs().max().item():.3f} in p(x); the conditionals of one joint would "
          "agree (0)")


def demo():
    """What `python objectives.py` prints: claims C1, C2, C4 on random tokens and weights, in
    a second or two."""
    specials, generator = synthetic_specials(65 + 106), torch.Generator().manual_seed(0)
    # 64 windows of 256 tokens (+1 for clm)
    windows = torch.randint(0, 65, (64, 257), generator=generator)
    fractions = {}
    for name, make in (("clm", lambda: clm(windows)),
                       ("mlm", lambda: mlm(windows, specials, generator)),
                       ("prefix_lm", lambda: prefix_lm(windows, specials, generator, "prefixlm")),
                       ("span_corruption",
                        lambda: span_corruption(windows, specials, generator, "t5")),
                       ("diffusion", lambda: diffusion(windows, specials, generator))):
        fractions[name] = make().supervised_fraction()
        print(f"C1: {name:16s} supervises {100 * fractions[name]:5.1f}% of the positions the model "
              "computes")
    print(f"C1: clm / mlm = {fractions['clm'] / fractions['mlm']:.2f}x more supervised positions "
          "at the same compute")
    batch = mlm(windows, specials, generator)
    chosen = batch.targets != IGNORE_INDEX
    shown = batch.inputs[chosen]
    masked = (shown == specials.mask).float().mean().item()
    kept = (shown == batch.targets[chosen]).float().mean()
    print(f"C2: of the {chosen.float().mean().item():.1%} of positions mlm chose: {masked:.1%} "
          f"became [MASK], {1 - masked - kept.item():.1%} a random token, {kept.item():.1%} kept "
          "(BERT's 80/10/10; a random token can be the same one)")
    demo_density()


if __name__ == "__main__":
    import masks  # its run_demo: every chapter file's demo starts the same way
    masks.run_demo(demo, "objectives.py")
