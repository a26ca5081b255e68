"""One Transformer: presets match the published parameter counts, shapes for every arch, config errors."""
import pytest
import torch

from model import ARCHS, ModelConfig, Transformer, config_from_preset, IGNORE_INDEX
from objectives import Batch

# parameter counts of the reference implementations (Hugging Face GPT2LMHeadModel, BertModel, T5Model)
PUBLISHED = {"gpt2": 124_439_808, "bert-base": 109_482_240, "t5-small": 60_506_624}


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_preset_parameter_counts_within_one_percent(preset):
    with torch.device("meta"):
        n = Transformer(config_from_preset(preset)).num_parameters()
    print(f"{preset}: {n:,} vs published {PUBLISHED[preset]:,}")
    assert abs(n - PUBLISHED[preset]) / PUBLISHED[preset] < 0.01


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("position", ["learned", "rope", "none"])
def test_shapes_and_loss_for_every_arch(arch, position):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch=arch, vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=16,
                                    position=position))
    B, T = 3, 12
    inputs = torch.randint(0, 30, (B, T))
    kwargs = {}
    if arch == "t5":
        kwargs["decoder_inputs"] = torch.randint(0, 30, (B, 5))
    if arch == "prefixlm":
        kwargs["prefix_length"] = torch.tensor([1, 4, 11])
    logits, loss = model(inputs, **kwargs)
    T_out = 5 if arch == "t5" else T
    assert logits.shape == (B, T_out, 30) and loss is None
    targets = torch.randint(0, 30, (B, T_out))
    targets[0, :2] = IGNORE_INDEX
    _, loss = model(inputs, targets, **kwargs)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 30), targets.reshape(-1), ignore_index=-100)
    assert torch.allclose(loss, expected)
    loss.backward()


def test_tied_embeddings_and_weighted_loss():
    model = Transformer(ModelConfig(arch="bert", vocab_size=30, block_size=8, n_layer=1, n_head=1, n_embd=8))
    assert model.lm_head.weight is model.token_embedding.weight
    logits = torch.randn(2, 4, 30)
    targets = torch.randint(0, 30, (2, 4))
    weights = torch.rand(2, 4)
    per = torch.nn.functional.cross_entropy(logits.view(-1, 30), targets.view(-1), reduction="none")
    assert torch.allclose(model.loss(logits, targets, weights), (per * weights.view(-1)).sum() / 8)


@pytest.mark.parametrize("bad, message", [
    (dict(n_embd=30, n_head=4), "divisible"), (dict(arch="rnn"), "unknown arch"),
    (dict(position="fractal"), "unknown position"), (dict(dropout=1.5), "dropout"), (dict(n_layer=0), "n_layer"),
    (dict(init_std=0.0), "init_std"),
])
def test_config_errors(bad, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**bad).validate()


@pytest.mark.parametrize("init_std", [0.01, 0.02, 0.04])
def test_init_std_sets_the_spread_of_every_weight(init_std):
    """GPT-2's initialisation at a chosen scale (experiments/plateau.py varies it): embeddings and the Linear
    layers at init_std, the layers that write into the residual stream at init_std / sqrt(2 * layers)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch="bert", vocab_size=500, block_size=64, n_layer=2, n_head=2, n_embd=128,
                                    init_std=init_std))
    assert model.token_embedding.weight.std().item() == pytest.approx(init_std, rel=0.02)
    assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(init_std, rel=0.02)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(init_std / 2, rel=0.02)  # sqrt(2 * 2)


def test_longer_than_block_size_is_an_error():
    model = Transformer(ModelConfig(arch="gpt", vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8))
    with pytest.raises(ValueError, match="longer than block_size"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_training_flops_match_the_6n_plus_attention_rule():
    model = Transformer(ModelConfig(arch="gpt", vocab_size=100, block_size=64, n_layer=2, n_head=2, n_embd=32))
    n = model.num_parameters(exclude_positions=True) - 2 * 32  # final norm does no matmul
    batch = Batch(inputs=torch.zeros(3, 64, dtype=torch.long), targets=torch.zeros(3, 64, dtype=torch.long))
    assert model.training_flops(batch) == 3 * (6 * 64 * n + 12 * 2 * 64 * 64 * 32)
