"""UL2's mixture of denoisers (claim F2) and masked diffusion as an ELBO (claim C4)."""
import itertools
import math

import pytest
import torch

import objectives
import train
from conftest import run_script, tiny_args
from model import IGNORE_INDEX, ModelConfig, Transformer
from test_objectives import reconstruct, windows_of


@pytest.mark.parametrize("name", [n for n in objectives.UL2_DENOISERS if n != "S"])
def test_each_denoiser_matches_its_noise_rate_and_mean_span(specials, name):
    mode, mean_span, density = objectives.UL2_DENOISERS[name]
    L = 4096 if mean_span == 64 else 512  # long enough for the requested spans (at most 100 sentinels)
    g = torch.Generator().manual_seed(0)
    noise_total = spans_total = 0
    for w in windows_of(20, L, specials):
        source, target = objectives.ul2_example(w, name, specials, g, "t5", budget=L)
        assert source[0] == specials.modes[mode]
        n_spans = sum(1 for t in target.tolist() if t in specials.sentinels)
        noise = len(target) - n_spans - 1
        text_length = noise + len(source) - 1 - n_spans - 1  # minus mode token, sentinels, EOS
        assert reconstruct(source[1:], target, specials) == w[:text_length].tolist()
        noise_total += noise / text_length
        spans_total += noise / n_spans
    print(f"{name}: noise fraction {noise_total / 20:.3f} (setting {density}), mean span {spans_total / 20:.2f} "
          f"(setting {mean_span})")
    assert abs(noise_total / 20 - density) / density < 0.1
    assert abs(spans_total / 20 - mean_span) / mean_span < 0.1


@pytest.mark.parametrize("arch", ["t5", "prefixlm"])
def test_mixture_mode_tokens_and_reconstruction(specials, arch):
    T = 128
    w = windows_of(400, T, specials)
    b = objectives.ul2(w, specials, torch.Generator().manual_seed(0), arch)
    first = b.inputs[:, 0].tolist()
    share = {mode: first.count(token) / len(first) for mode, token in specials.modes.items()}
    print(f"{arch}: denoiser shares {share}")
    assert abs(share["S"] - 0.5) < 0.08 and abs(share["R"] - 0.25) < 0.08 and abs(share["X"] - 0.25) < 0.08
    for row in range(40):  # inputs + targets give back the window
        target = b.targets[row][b.targets[row] != IGNORE_INDEX]
        if arch == "t5":
            length = b.lengths[row] if b.lengths is not None else b.inputs.size(1)
            source = b.inputs[row, :length]
        else:
            source = b.inputs[row, :b.prefix_length[row]]
        if first[row] == specials.modes["S"]:
            recovered = torch.cat([source[1:], target]).tolist()
        else:
            recovered = reconstruct(source[1:], target, specials)
        assert recovered == w[row, :len(recovered)].tolist() and len(recovered) > 1


def test_mixture_weights_are_configurable(specials):
    b = objectives.ul2(windows_of(50, 64, specials), specials, torch.Generator().manual_seed(0), "t5", mixture=(0, 0, 1))
    assert (b.inputs[:, 0] == specials.modes["X"]).all()


@pytest.mark.parametrize("arch", ["t5", "prefixlm"])
def test_short_windows_never_crash_or_produce_empty_spans(specials, arch):
    g = torch.Generator().manual_seed(0)
    for T in range(2, 12):
        for _ in range(10):
            w = windows_of(6, T, specials, seed=T)
            b = objectives.ul2(w, specials, g, arch)
            assert b.inputs.size(1) <= T and b.targets.size(1) <= T
            for name in objectives.UL2_DENOISERS:
                source, target = objectives.ul2_example(w[0], name, specials, g, arch, T)
                spans, current = [], None  # the target split at its sentinels
                for t in target.tolist():
                    if t in specials.sentinels:
                        current = []
                        spans.append(current)
                    elif t != specials.eos and current is not None:
                        current.append(t)
                if source[0] == specials.modes["S"]:
                    assert not spans and len(target) >= 1  # a continuation, never empty
                else:
                    assert spans and all(len(span) >= 1 for span in spans), (name, T, target)
    with pytest.raises(ValueError, match="at least 2 positions"):  # not even the mode token and one token
        objectives.ul2_example(windows_of(1, 2, specials)[0], "R-3", specials, g, arch, 1)


# ----------------------------------------------------------------------------- masked diffusion

def test_diffusion_masking_rate_and_weights(specials):
    w = windows_of(400, 250, specials)
    for rate in (0.1, 0.5, 0.9):
        b = objectives.diffusion(w, specials, torch.Generator().manual_seed(0), rate=rate)
        masked = b.inputs == specials.mask
        assert abs(masked.float().mean().item() - rate) < 0.005
        assert torch.equal(masked, b.targets != IGNORE_INDEX)  # only [MASK], no 80/10/10
        assert torch.allclose(b.loss_weights[masked], torch.tensor(1 / rate)) and (b.loss_weights[~masked] == 0).all()
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):  # t = 0: the 1/t weight would be 0/0
        objectives.diffusion(w, specials, torch.Generator().manual_seed(0), rate=0)
    t = objectives.diffusion(w, specials, torch.Generator().manual_seed(0))
    rates = (t.inputs == specials.mask).float().mean(dim=1)
    assert rates.min() < 0.1 and rates.max() > 0.9  # t ~ U(eps, 1) per sequence


SYMBOLS, LENGTH, MASK = 3, 4, 3


def conditionals(model, x, masked):
    """log p(x_i | x with `masked` positions replaced by [MASK]) for every i, over the 3 symbols. (N, LENGTH)"""
    inputs = torch.where(masked, MASK, x)
    logp = torch.log_softmax(model(inputs)[0][..., :SYMBOLS].double(), dim=-1)
    return logp.gather(-1, x[..., None])[..., 0]


@torch.no_grad()
def test_diffusion_elbo_is_never_below_the_exact_nll():
    """Claim C4: the masked-diffusion loss is an ELBO. Its generative model reveals tokens in a uniformly random
    order, so -log p(x) = -log mean_orders prod p(x_k | revealed), computed exactly here over all 24 orders for
    all 81 sequences; the ELBO is sum_m (1/m) E_{|S|=m} sum_{i in S} -log p(x_i | x outside S), the exact value of
    the 1/t-weighted loss integrated over t. Jensen: ELBO >= NLL, for every sequence."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch="bert", vocab_size=SYMBOLS + 1, block_size=LENGTH, n_layer=2, n_head=2,
                                    n_embd=16, dropout=0.0))
    with torch.enable_grad():  # a little training on a Markov chain so the model is not uniform
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
        specials = objectives.Specials(SYMBOLS, 0, 0, MASK, [], {})
        g = torch.Generator().manual_seed(0)
        for _ in range(100):
            x = torch.randint(0, SYMBOLS, (32, LENGTH + 1), generator=g)
            for i in range(1, LENGTH + 1):
                x[:, i] = torch.where(torch.rand(32, generator=g) < 0.8, x[:, i - 1], x[:, i])
            b = objectives.diffusion(x, specials, g)
            _, loss = model(b.inputs, b.targets, loss_weights=b.loss_weights)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.eval()
    x = torch.tensor(list(itertools.product(range(SYMBOLS), repeat=LENGTH)))  # (81, 4)
    nll_orders = []
    for order in itertools.permutations(range(LENGTH)):
        log_p = torch.zeros(len(x), dtype=torch.double)
        masked = torch.ones(len(x), LENGTH, dtype=torch.bool)
        for position in order:
            log_p += conditionals(model, x, masked)[:, position]
            masked[:, position] = False
        nll_orders.append(log_p)
    exact_nll = -(torch.logsumexp(torch.stack(nll_orders), dim=0) - math.log(len(nll_orders)))
    elbo = torch.zeros(len(x), dtype=torch.double)
    for m in range(1, LENGTH + 1):
        subsets = list(itertools.combinations(range(LENGTH), m))
        for subset in subsets:
            masked = torch.zeros(len(x), LENGTH, dtype=torch.bool)
            masked[:, list(subset)] = True
            elbo += -(conditionals(model, x, masked) * masked).sum(-1) / m / len(subsets)
    print(f"sum of p(x) over all 81 sequences: {exact_nll.neg().exp().sum():.6f}; mean ELBO {elbo.mean():.4f} "
          f">= mean NLL {exact_nll.mean():.4f} nats")
    assert abs(exact_nll.neg().exp().sum().item() - 1) < 1e-6  # the diffusion model's density is normalised
    assert (elbo >= exact_nll - 1e-9).all()
    assert (elbo - exact_nll).max() > 1e-3  # a bound, not an equality
    # the training loss (random t, 1/t weights, averaged over positions) estimates ELBO / LENGTH
    one = x[40:41].expand(20000, -1)
    b = objectives.diffusion(torch.cat([one, one[:, :1]], 1), objectives.Specials(SYMBOLS, 0, 0, MASK, [], {}),
                    torch.Generator().manual_seed(1), eps=1e-4)
    _, loss = model(b.inputs, b.targets, loss_weights=b.loss_weights)
    assert abs(loss.item() * LENGTH - elbo[40].item()) / elbo[40].item() < 0.05


def test_diffusion_training_and_sampling_leave_no_mask(char_dataset, tmp_path):
    out = str(tmp_path / "diffusion")
    train.train(train.resolve_config(tiny_args(char_dataset, out, "bert", objective="diffusion", max_iters=10)))
    for extra in (["--order=confident"], ["--order=random"], ["--block_length=8"]):
        result = run_script("sample.py", f"--out_dir={out}", "--start=KING", "--max_new_tokens=24", "--steps=6",
                            "--num_samples=2", *extra)
        assert result.returncode == 0, result.stderr
        assert "[MASK]" not in result.stdout and "forward passes" in result.stdout
        assert result.stdout.count("KING") == 2
