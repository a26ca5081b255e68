"""Published checkpoints load into the project's own modules exactly: tiny random GPT-2, BERT and T5
built with `transformers` and saved with save_pretrained give the same logits and the same greedy generations in
our Transformer; the full-size configs have exactly the published parameter counts; offline, a hub name fails
with one line. Skipped where transformers is not installed (.ci/run installs it)."""
import os

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.optional_packages
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

import sample  # noqa: E402
from infra import pretrained  # noqa: E402
from conftest import run_script  # noqa: E402
from infra.published_model import published_model  # noqa: E402
from model import Transformer  # noqa: E402

VOCAB = 97


def tiny_gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=128, initializer_range=0.2,
        bos_token_id=0, eos_token_id=0))


def tiny_bert():
    return transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64, vocab_size=VOCAB,
        max_position_embeddings=64, initializer_range=0.2))


def tiny_t5(decoder_layers=3):
    # few buckets and a short max_distance: offsets in the test cross into the log-spaced buckets; a decoder
    # deeper than the encoder checks the two stacks are mapped separately
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        num_layers=2, num_decoder_layers=decoder_layers, num_heads=2, d_model=32, d_kv=16, d_ff=64, vocab_size=VOCAB,
        relative_attention_num_buckets=8, relative_attention_max_distance=20, initializer_factor=3.0,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))


def needs_gpt2_bpe():
    """GPT-2 folders sample and train with tiktoken's BPE: skip where its files are missing offline."""
    tiktoken = pytest.importorskip("tiktoken")
    try:
        tiktoken.get_encoding("gpt2")
    except Exception:
        pytest.skip("tiktoken's gpt2 files are not available offline (CI sets TIKTOKEN_CACHE_DIR)")


def saved(hf_model, tmp_path, name):
    torch.manual_seed(0)
    folder = tmp_path / name
    hf_model.eval().save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("family", ["gpt2", "bert", "t5"])
def test_logits_equal_transformers(family, tmp_path):
    torch.manual_seed(0)
    theirs = {"gpt2": tiny_gpt2, "bert": tiny_bert, "t5": tiny_t5}[family]().eval()
    ours = pretrained.load_pretrained(saved(theirs, tmp_path, family))[0]
    ids = torch.randint(0, VOCAB, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if family == "t5":
            decoder_ids = torch.randint(0, VOCAB, (3, 30), generator=torch.Generator().manual_seed(2))
            expected = theirs(input_ids=ids, decoder_input_ids=decoder_ids).logits
            got = ours(ids, decoder_inputs=decoder_ids)[0]
        else:
            expected, got = theirs(ids).logits, ours(ids)[0]
    assert expected.abs().max() > 0.5  # the comparison is not between near-zero numbers
    assert (expected - got).abs().max().item() <= 1e-4
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())


def test_greedy_generation_equals_transformers_generate(tmp_path):
    """50 greedy tokens, our KV-cached sampler vs transformers' generate, for GPT-2 (a prompt) and T5 (an
    encoder input, decoding from the pad token). Relative positions and the cache must agree at every step."""
    torch.manual_seed(0)
    prompt = torch.randint(2, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    gpt2 = tiny_gpt2().eval()
    ours, _ = pretrained.load_pretrained(saved(gpt2, tmp_path, "gpt2"))
    expected = gpt2.generate(prompt, max_new_tokens=50, do_sample=False, eos_token_id=None, pad_token_id=0,
                             attention_mask=torch.ones_like(prompt))
    got = sample.generate(ours, prompt, 50, sample.Sampling(top_k=1))
    assert expected.shape == got.shape == (1, 62) and torch.equal(expected, got)
    assert len(set(got[0, 12:].tolist())) > 3  # not a degenerate repetition of one token

    t5 = tiny_t5(decoder_layers=2).eval()  # (transformers' own cache fails on unequal depths)
    ours, _ = pretrained.load_pretrained(saved(t5, tmp_path, "t5"))
    expected = t5.generate(prompt, max_new_tokens=50, do_sample=False, eos_token_id=None,
                           attention_mask=torch.ones_like(prompt))
    got = sample.generate(ours, sample.T5Prompt(prompt, None, 0), 50, sample.Sampling(top_k=1))
    assert expected.shape == got.shape == (1, 51) and torch.equal(expected, got)
    uncached = sample.generate_uncached(ours, sample.T5Prompt(prompt, None, 0), 50, sample.Sampling(top_k=1))
    assert torch.equal(got, uncached)


# Parameter counts of the published checkpoints (Hugging Face GPT2LMHeadModel, BertForMaskedLM,
# T5ForConditionalGeneration; tied embeddings counted once)
PUBLISHED = {
    "gpt2": (124_439_808, lambda: transformers.GPT2Config()),
    "gpt2-medium": (354_823_168, lambda: transformers.GPT2Config(n_layer=24, n_head=16, n_embd=1024)),
    "gpt2-large": (774_030_080, lambda: transformers.GPT2Config(n_layer=36, n_head=20, n_embd=1280)),
    "gpt2-xl": (1_557_611_200, lambda: transformers.GPT2Config(n_layer=48, n_head=25, n_embd=1600)),
    "bert-base-uncased": (109_514_298, lambda: transformers.BertConfig()),
    "bert-large-uncased": (335_174_458, lambda: transformers.BertConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)),
    "t5-small": (60_506_624, lambda: transformers.T5Config()),
    "t5-base": (222_903_552, lambda: transformers.T5Config(d_model=768, d_ff=3072, num_layers=12, num_heads=12)),
}


HEAD_MODELS = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "t5": "T5ForConditionalGeneration"}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_full_size_parameter_counts_are_the_published_ones(name):
    """Claim B3 (BERT-base: about 110M): our modules built from each published config hold exactly the parameters
    of transformers' model of that config (counted here too, not only written down)."""
    count, make_config = PUBLISHED[name]
    hf_config = make_config()
    with torch.device("meta"):  # shapes only, no memory
        model = published_model(pretrained.FAMILIES[hf_config.model_type][0](hf_config))
        theirs = getattr(transformers, HEAD_MODELS[hf_config.model_type])(hf_config)
    assert model.num_parameters() == count == sum(p.numel() for p in theirs.parameters())  # a tied tensor once


def test_defaults_unchanged_by_the_pretrained_options():
    """Our own gpt/bert/prefixlm/t5 keep their layout: pre-norm LayerNorm (eps 1e-5), tanh GELU, scores scaled by
    1/sqrt(head size), no extra modules, and one block computes exactly what that layout says."""
    from model import Block, ModelConfig
    for arch in ("gpt", "bert", "prefixlm", "t5"):
        model = Transformer(ModelConfig(arch=arch, vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16))
        names = set(dict(model.named_parameters()))
        assert not any(n.startswith(("segment_embedding", "head_transform", "relative_bias", "decoder_relative_bias"))
                       for n in names)
        assert "lm_head.bias" not in names and not hasattr(model, "embedding_norm")  # no norm after embedding
        norms = [m for m in model.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))]
        assert norms and all(isinstance(m, torch.nn.LayerNorm) and m.eps == 1e-5 for m in norms)
    torch.manual_seed(0)
    block, inputs = Block(ModelConfig(n_embd=16, n_head=2, block_size=8)).eval(), torch.randn(2, 8, 16)
    a, m = block.attention, block.mlp
    h = block.norm_1(inputs)
    q, k, v = a.query(h), *a.key_value(h).split(16, dim=-1)
    heads = lambda t: t.view(2, 8, 2, 8).transpose(1, 2)  # noqa: E731  (B, nh, T, hs)
    weights = torch.softmax(heads(q) @ heads(k).transpose(-1, -2) / 8 ** 0.5, dim=-1)  # no mask given
    x = inputs + a.proj((weights @ heads(v)).transpose(1, 2).reshape(2, 8, 16))
    h = m.fc(block.norm_2(x))
    gelu_tanh = 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h ** 3)))
    with torch.no_grad():
        assert torch.allclose(block(inputs), x + m.proj(gelu_tanh), atol=1e-5)


def test_t5_padded_batch_equals_transformers(tmp_path):
    """Encoder inputs of different lengths: our lengths padding (folded into T5's position bias) against
    transformers' attention_mask, on every real position."""
    torch.manual_seed(0)
    theirs = tiny_t5().eval()
    ours, _ = pretrained.load_pretrained(saved(theirs, tmp_path, "t5"))
    lengths = torch.tensor([40, 25, 33])
    ids = torch.randint(2, VOCAB, (3, 40), generator=torch.Generator().manual_seed(4))
    ids[torch.arange(40)[None, :] >= lengths[:, None]] = 0
    decoder_ids = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        attention_mask = (torch.arange(40)[None, :] < lengths[:, None]).long()
        expected = theirs(input_ids=ids, attention_mask=attention_mask, decoder_input_ids=decoder_ids).logits
        got = ours(ids, decoder_inputs=decoder_ids, lengths=lengths)[0]
    assert (expected - got).abs().max().item() <= 1e-4


def test_a_checkpoint_saved_without_its_head_is_refused(tmp_path):
    """A BertModel folder (no masked-LM head): transformers would invent a random head; we refuse, one line."""
    folder = tmp_path / "bert-no-head"
    transformers.BertModel(transformers.BertConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=16,
                                                   intermediate_size=32, vocab_size=VOCAB)).save_pretrained(folder)
    with pytest.raises(pretrained.UserError, match="lacks .* weights of a BertForMaskedLM"):
        pretrained.load_pretrained(str(folder))


@pytest.mark.parametrize("name, message", [
    ("gpt2-not-downloaded-xyz", "could not load 'gpt2-not-downloaded-xyz': it is not a folder, and the Hugging Face "
                                "hub cannot be reached"),
    ("./no-such-folder", "./no-such-folder is not a folder"),
])
def test_hub_name_offline_is_one_line(name, message):
    result = run_script("sample.py", f"--init_from={name}", "--max_new_tokens=5",
                        env={**os.environ, "HF_HUB_OFFLINE": "1"})  # as on a machine without network, at once
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0]


def test_a_folder_that_is_not_a_checkpoint_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(pretrained.UserError, match="holds no config.json"):
        pretrained.load_pretrained(str(tmp_path / "empty"))


def test_sample_from_a_published_gpt2_folder(tmp_path):
    """sample.py --init_from=<folder>: GPT-2 with its BPE (tiktoken) decodes left to right with the cache."""
    needs_gpt2_bpe()
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64))
    gpt2_folder = saved(gpt2, tmp_path, "gpt2-bpe")  # the full 50257-token vocabulary: tiktoken's ids
    result = run_script("sample.py", f"--init_from={gpt2_folder}", "--start=The king", "--max_new_tokens=8",
                        "--num_samples=2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("The king") == 2 and "gpt (pretrained): 2 x 8 tokens" in result.stdout


def test_sample_from_a_published_bert_folder(tmp_path):
    """BERT with the WordPiece tokenizer saved beside it fills [MASK]s; the text has no special token."""
    torch.manual_seed(0)
    words = "[PAD] [UNK] [CLS] [SEP] [MASK] the king and queen of england speak to their people".split()
    tokenizer = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(words)})
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=16, intermediate_size=32, vocab_size=len(words),
        max_position_embeddings=32))
    bert_folder = saved(bert, tmp_path, "bert-wordpiece")
    tokenizer.save_pretrained(bert_folder)
    result = run_script("sample.py", f"--init_from={bert_folder}", "--start=the king", "--max_new_tokens=6",
                        "--steps=3", "--num_samples=1")
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout.splitlines()[0]
    assert text.startswith("the king") and len(text.split()) == 2 + 6  # six words filled in
    assert not any(w in text for w in ("[MASK]", "[UNK]", "[PAD]", "[CLS]", "[SEP]"))


def test_fine_tune_published_gpt2_and_resume(tmp_path, char_dataset):
    """train.py --init_from=<GPT-2 folder> starts from the published weights and saves a checkpoint that
    --init_from=resume continues; a char-level dataset is refused with one line."""
    needs_gpt2_bpe()
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64))
    folder = saved(gpt2, tmp_path, "gpt2-bpe")
    text = open(char_dataset + "/source.txt", encoding="utf-8").read()[:20_000]
    (tmp_path / "bpe").mkdir()
    from conftest import load_prepare
    prepare = load_prepare("shakespeare")
    (tmp_path / "bpe" / "input.txt").write_text(text, encoding="utf-8")
    prepare.prepare(str(tmp_path / "bpe" / "input.txt"), str(tmp_path / "bpe"))
    common = ["--dataset=" + str(tmp_path / "bpe"), "--block_size=32", "--batch_size=4", "--eval_iters=2",
              "--eval_interval=5", f"--out_dir={tmp_path / 'out'}", "--quiet=True"]
    # at a learning rate of 1e-30 (no float32 weight moves) the checkpoint holds exactly the published weights
    result = run_script("train.py", f"--init_from={folder}", "--max_iters=5", "--learning_rate=1e-30", "--min_lr=0",
                        *common)
    assert result.returncode == 0, result.stderr[-2000:]
    checkpoint = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=False)
    assert checkpoint["model_config"]["vocab_size"] == 50257 and checkpoint["config"]["published_weights"] == folder
    theirs = pretrained.convert_state_dict("gpt2", pretrained.gpt2_config(gpt2.config), gpt2.state_dict())
    assert set(theirs) <= set(checkpoint["model"])
    # (zero-initialised biases move by ~1e-31; a different init would differ by ~0.02)
    assert max((checkpoint["model"][name] - tensor).abs().max().item() for name, tensor in theirs.items()) < 1e-20
    result = run_script("train.py", "--init_from=resume", "--max_iters=10", "--learning_rate=1e-30", "--min_lr=0",
                        *common)
    assert result.returncode == 0, result.stderr[-2000:]
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=False)["iter_num"] == 10

    refused = run_script("train.py", f"--init_from={folder}", f"--dataset={char_dataset}", "--block_size=32",
                         f"--out_dir={tmp_path / 'out2'}")
    assert refused.returncode == 2 and "reads GPT-2 BPE tokens" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "out2" / "ckpt.pt").exists()


def test_published_claims_command_on_local_folders(tmp_path, char_dataset):
    """published_claims.py end to end on tiny GPT-2 / BERT folders (the real run needs the hub): GPT-2's
    renormalised chain rule sums to 1 over W x W, BERT's pseudo-likelihood (non-uniform weights) does not."""
    needs_gpt2_bpe()
    import collections
    import json
    text = open(char_dataset + "/source.txt", encoding="utf-8").read()
    words = [w for w, _ in collections.Counter(w for w in text.split() if w.isalpha() and w.islower()).most_common(200)]
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    torch.manual_seed(0)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=16, intermediate_size=32, vocab_size=len(vocabulary),
        max_position_embeddings=512, initializer_range=1.0))  # far from uniform conditionals
    bert_folder = saved(bert, tmp_path, "bert")
    transformers.BertTokenizer(vocab={w: i for i, w in enumerate(vocabulary)}).save_pretrained(bert_folder)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=256,
                                                                initializer_range=1.0))
    gpt_folder = saved(gpt2, tmp_path, "gpt2")
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    result = run_script("experiments/published_claims.py", f"--gpt={gpt_folder}", f"--bert={bert_folder}",
                        f"--text={tmp_path / 'text.txt'}", f"--out_dir={tmp_path}", "--cloze_blanks=20",
                        "--decode_tokens=8", "--vocabulary_words=20", "--windows=4")
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads((tmp_path / "published-claims.json").read_text())
    sums = data["C4 sum over W x W"]
    # GPT-2's 1 holds by construction (the chain rule): it checks the code, not the claim. BERT's sum is the
    # measurement (a random net barely couples the two tokens, so near 1; still 1000x float error away from it)
    assert abs(sums["gpt-2 chain rule"] - 1) < 1e-6 and abs(sums["bert pseudo-likelihood"] - 1) > 1e-4
    # the check that can fail (as in tests/test_claims.py): GPT-2's two conditionals come from its joint (float32
    # rounding, ~3e-6 here); the random BERT's conditionals belong to no joint (~31 here)
    cycles = data["C4 worst cycle |log product| over W x W"]
    assert cycles["gpt-2 (conditionals of its joint)"] < 1e-4 and cycles["bert (its conditionals)"] > 1e-2
    assert len(data["D3 effective rank per layer (of T)"]["bert"]) == 1
    assert data["B1/D1 cloze accuracy"]["blanks"] == 20
    assert data["D4 decoding"]["cached"] > 0 and (tmp_path / "published-claims.md").exists()


def shakespeare_words(char_dataset, count=300):
    import collections
    text = open(char_dataset + "/source.txt", encoding="utf-8").read()
    return text, [w for w, _ in collections.Counter(w.lower() for w in text.split() if w.isalpha()).most_common(count)]


def tiny_bert_with_wordpiece(tmp_path, char_dataset):
    """A BERT folder with a WordPiece tokenizer of Shakespeare's commonest words (the rest is [UNK])."""
    text, words = shakespeare_words(char_dataset)
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    torch.manual_seed(0)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=16, intermediate_size=32, vocab_size=len(vocabulary),
        max_position_embeddings=64))
    folder = saved(bert, tmp_path, "bert-wordpiece")
    transformers.BertTokenizer(vocab={w: i for i, w in enumerate(vocabulary)}).save_pretrained(folder)
    return folder, bert, text


def tiny_t5_with_sentencepiece(tmp_path, char_dataset, extra_ids=10):
    """A T5 folder with a unigram SentencePiece-style tokenizer (tokenizers library, no download) whose
    <extra_id_k> sentinels sit at the top of the vocabulary, counted down as in t5-small."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    text, words = shakespeare_words(char_dataset)
    pieces = ["<pad>", "</s>", "<unk>"] + [f"\u2581{w}" for w in words] + list("abcdefghijklmnopqrstuvwxyz")
    pieces += [f"<extra_id_{k}>" for k in reversed(range(extra_ids))]
    backend = Tokenizer(models.Unigram([(p, -1.0 if p.startswith("\u2581") else -8.0) for p in pieces], unk_id=2))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tokenizer = transformers.T5TokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="<pad>",
                                             unk_token="<unk>", extra_ids=0,
                                             additional_special_tokens=[f"<extra_id_{k}>" for k in range(extra_ids)])
    torch.manual_seed(0)
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        num_layers=1, num_decoder_layers=1, num_heads=2, d_model=16, d_kv=8, d_ff=32, vocab_size=len(pieces),
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    folder = saved(t5, tmp_path, "t5-sentencepiece")
    tokenizer.save_pretrained(folder)
    return folder, t5, text


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_fine_tune_published_bert_and_t5_in_their_own_tokens(family, tmp_path, char_dataset):
    """data/shakespeare/prepare.py --tokenizer=<folder> writes the text in the checkpoint's own tokens with its
    own special ids; train.py --init_from=<folder> starts from exactly the published weights, masks with BERT's
    [MASK] / corrupts spans with T5's <extra_id_k>, resumes, and sample.py reads the fine-tuned checkpoint."""
    import pickle

    import objectives
    from conftest import load_prepare
    make = tiny_bert_with_wordpiece if family == "bert" else tiny_t5_with_sentencepiece
    folder, theirs, text = make(tmp_path, char_dataset)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    (tmp_path / "data").mkdir()
    (tmp_path / "input.txt").write_text(text[:30_000], encoding="utf-8")
    load_prepare("shakespeare").prepare(str(tmp_path / "input.txt"), str(tmp_path / "data"), tokenizer=folder)
    meta = pickle.load(open(tmp_path / "data" / "meta.pkl", "rb"))
    ids = list(np.fromfile(tmp_path / "data" / "train.bin", dtype=np.uint16)[:200])
    assert ids == hf_tokenizer.encode(text[:30_000], add_special_tokens=False)[:200]  # their tokens, no [CLS] / </s>
    specials = objectives.Specials.from_meta(meta)
    windows = torch.from_numpy(np.fromfile(tmp_path / "data" / "train.bin", dtype=np.uint16)[:8 * 33]
                               .astype(np.int64)).view(8, 33)
    generator = torch.Generator().manual_seed(0)
    if family == "bert":
        assert specials.mask == hf_tokenizer.mask_token_id == 4 and specials.pad == hf_tokenizer.pad_token_id
        batch = objectives.mlm(windows, specials, generator)
        assert (batch.inputs == hf_tokenizer.mask_token_id).sum() > 0  # BERT's own [MASK] id
    else:
        sentinels = hf_tokenizer.convert_tokens_to_ids([f"<extra_id_{k}>" for k in range(10)])
        assert specials.sentinels == sentinels and sentinels[0] == len(hf_tokenizer) - 1  # counted down from the top
        assert specials.eos == hf_tokenizer.eos_token_id and specials.num_ordinary == len(hf_tokenizer) - 10
        batch = objectives.span_corruption(windows, specials, generator, "t5")
        assert (batch.inputs == sentinels[0]).any(dim=1).all() and (batch.targets[:, 0] == sentinels[0]).all()

    common = [f"--arch={family}", f"--dataset={tmp_path / 'data'}", "--block_size=32", "--batch_size=4",
              "--eval_iters=2", "--eval_interval=5", f"--out_dir={tmp_path / 'out'}", "--quiet=True"]
    result = run_script("train.py", f"--init_from={folder}", "--max_iters=5", "--learning_rate=1e-30", "--min_lr=0",
                        *common)
    assert result.returncode == 0, result.stderr[-2000:]
    checkpoint = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=False)
    assert checkpoint["config"]["published_weights"] == folder
    config = pretrained.FAMILIES[family][0](theirs.config)
    published = pretrained.convert_state_dict(family, config, theirs.state_dict())
    assert max((checkpoint["model"][name] - tensor).abs().max().item() for name, tensor in published.items()) < 1e-20
    result = run_script("train.py", "--init_from=resume", "--max_iters=10", *common)  # now it learns
    assert result.returncode == 0, result.stderr[-2000:]
    checkpoint = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=False)
    assert checkpoint["iter_num"] == 10 and checkpoint["config"]["objective"] == {"bert": "mlm", "t5": "span_corruption"}[family]
    moved = max((checkpoint["model"][name] - tensor).abs().max().item() for name, tensor in published.items())
    assert moved > 1e-4

    extra = ["--steps=2"] if family == "bert" else []
    sampled = run_script("sample.py", f"--out_dir={tmp_path / 'out'}", "--start=the king", "--max_new_tokens=4",
                         "--num_samples=1", *extra)
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    header, samples = sampled.stdout.split("\n", 1)  # what trained the weights, then the samples
    assert f"{family} (" in header and samples.startswith("the king")
    # the default prompt, a newline, is no token of theirs: one line that says so, not a crash
    nothing = run_script("sample.py", f"--out_dir={tmp_path / 'out'}", "--start=\n", "--max_new_tokens=4", *extra)
    assert nothing.returncode == 2 and "encodes to no tokens" in nothing.stderr, nothing.stderr[-2000:]
    assert len(nothing.stderr.strip().splitlines()) == 1


def test_published_fine_tuning_refuses_a_wrong_arch_or_dataset_in_one_line(tmp_path, char_dataset):
    from conftest import load_prepare
    bert_folder, _, text = tiny_bert_with_wordpiece(tmp_path, char_dataset)
    t5_folder, _, _ = tiny_t5_with_sentencepiece(tmp_path, char_dataset)
    (tmp_path / "input.txt").write_text(text[:5_000], encoding="utf-8")
    (tmp_path / "bert-data").mkdir()
    load_prepare("shakespeare").prepare(str(tmp_path / "input.txt"), str(tmp_path / "bert-data"), tokenizer=bert_folder)
    other_words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(40)]
    other = tmp_path / "bert-other-vocabulary"
    transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=16, intermediate_size=32,
        vocab_size=len(other_words))).save_pretrained(other)
    transformers.BertTokenizer(vocab={w: i for i, w in enumerate(other_words)}).save_pretrained(other)
    bert_data = f"--dataset={tmp_path / 'bert-data'}"
    for args, message in (
            ([f"--init_from={bert_folder}", f"--dataset={char_dataset}", "--arch=bert"],
             f"is char-level: prepare one with its tokenizer (python data/shakespeare/prepare.py --tokenizer={bert_folder})"),
            ([f"--init_from={bert_folder}", bert_data, "--arch=gpt"], "is a bert checkpoint: train it with --arch=bert"),
            ([f"--init_from={bert_folder}", bert_data, "--arch=prefixlm"], "there is no published prefixlm"),
            ([f"--init_from={t5_folder}", bert_data, "--arch=bert"], "is a t5 checkpoint: train it with --arch=t5"),
            ([f"--init_from={other}", bert_data, "--arch=bert"], "was tokenized with another bert vocabulary")):
        result = run_script("train.py", "--block_size=32", f"--out_dir={tmp_path / 'out'}", *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "out").exists()
    # from scratch on a published vocabulary: an objective needing tokens the vocabulary lacks is refused
    (tmp_path / "t5-data").mkdir()
    load_prepare("shakespeare").prepare(str(tmp_path / "input.txt"), str(tmp_path / "t5-data"), tokenizer=t5_folder)
    for args, message in (([bert_data, "--arch=t5"], "--objective=span_corruption needs sentinel tokens"),
                          ([f"--dataset={tmp_path / 't5-data'}", "--arch=bert"], "--objective=mlm needs a [MASK] token"),
                          ([f"--dataset={tmp_path / 't5-data'}", "--arch=t5", "--objective=ul2"],
                           "--objective=ul2 needs UL2's mode tokens")):
        result = run_script("train.py", "--block_size=32", f"--out_dir={tmp_path / 'out'}", *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
