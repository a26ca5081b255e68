"""
Published checkpoints in the project's own modules: GPT-2, BERT and T5 from the Hugging Face hub or from a folder
written by `save_pretrained`. `transformers` is used here only, and only to read the weights and the
config; the model that runs is model.Transformer, so every claim test and measurement runs unchanged on them.

    model, tokenizer = load_pretrained("gpt2")          # or "gpt2-medium", "bert-base-uncased", "t5-small", a folder

Each family is one config translation and one table of names, read top to bottom: our parameter name <- theirs
(with "{i}" for the layer). What BERT and T5 compute differently from model.py (BERT's post-norm, segment
embeddings, exact GELU and output transform; T5's RMSNorm, relative position bias, unscaled attention scores and
ReLU) is built on the same modules in infra/published_model.py.
"""
import os
import socket

import torch

from infra.configurator import UserError
from infra.dataset import Tokenizer, tiktoken_encoding
from infra.published_model import PublishedConfig, published_model
from model import Attention
from objectives import Specials

# Every table: our module <- their module (its weight and, where it has one, bias), "{i}" the layer. Two marks:
#   a tuple       their k and v, stacked into our one key_value projection
#   "conv1d:..."  GPT-2's Conv1D, weight stored (in, out), transposed against nn.Linear; ":q" / ":kv" take the
#                 rows of c_attn (which holds q, k, v side by side)

# ----------------------------------------------------------------------------- GPT-2

GPT2_LAYER = {
    "norm_1": "transformer.h.{i}.ln_1",
    "attention.query": "conv1d:transformer.h.{i}.attn.c_attn:q",
    "attention.key_value": "conv1d:transformer.h.{i}.attn.c_attn:kv",
    "attention.proj": "conv1d:transformer.h.{i}.attn.c_proj",
    "norm_2": "transformer.h.{i}.ln_2",
    "mlp.fc": "conv1d:transformer.h.{i}.mlp.c_fc", "mlp.proj": "conv1d:transformer.h.{i}.mlp.c_proj",
}
GPT2_MODEL = {"token_embedding": "transformer.wte", "position_embedding": "transformer.wpe", "final_norm": "transformer.ln_f"}


def gpt2_config(hf):
    if hf.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise UserError(f"GPT-2 with activation {hf.activation_function!r} is not supported (gelu_new only)")
    return PublishedConfig(family="gpt2", arch="gpt", vocab_size=hf.vocab_size, block_size=hf.n_positions,
                           n_layer=hf.n_layer, n_head=hf.n_head, n_embd=hf.n_embd, d_ff=hf.n_inner or 4 * hf.n_embd,
                           bias=True, norm_eps=hf.layer_norm_epsilon)


def conv1d_as_linear(theirs, name, n_embd):
    """GPT-2's Conv1D "conv1d:<module>[:q|:kv]" as our Linear's weight (out, in) and bias."""
    module, _, part = name.removeprefix("conv1d:").partition(":")
    rows = {"q": slice(0, n_embd), "kv": slice(n_embd, 3 * n_embd), "": slice(None)}[part]
    return {"weight": theirs[module + ".weight"].t()[rows], "bias": theirs[module + ".bias"][rows]}


# ----------------------------------------------------------------------------- BERT
# Separate q, k, v (nn.Linear): our key_value is k and v stacked. Post-norm: each LayerNorm follows its residual.

BERT_LAYER = {
    "attention.query": "bert.encoder.layer.{i}.attention.self.query",
    "attention.key_value": ("bert.encoder.layer.{i}.attention.self.key", "bert.encoder.layer.{i}.attention.self.value"),
    "attention.proj": "bert.encoder.layer.{i}.attention.output.dense",
    "norm_1": "bert.encoder.layer.{i}.attention.output.LayerNorm",
    "mlp.fc": "bert.encoder.layer.{i}.intermediate.dense", "mlp.proj": "bert.encoder.layer.{i}.output.dense",
    "norm_2": "bert.encoder.layer.{i}.output.LayerNorm",
}
BERT_MODEL = {
    "token_embedding": "bert.embeddings.word_embeddings",
    "position_embedding": "bert.embeddings.position_embeddings",
    "segment_embedding": "bert.embeddings.token_type_embeddings",
    "embedding_norm": "bert.embeddings.LayerNorm",
    "head_transform.0": "cls.predictions.transform.dense", "head_transform.2": "cls.predictions.transform.LayerNorm",
    "lm_head.bias": "cls.predictions.bias",
}


def bert_config(hf):
    activation = {"gelu": "gelu", "gelu_new": "gelu_tanh", "relu": "relu"}.get(hf.hidden_act)
    positions = getattr(hf, "position_embedding_type", "absolute")
    if activation is None or positions != "absolute":
        raise UserError(f"BERT with activation {hf.hidden_act!r} and positions {positions!r} is not "
                        f"supported (gelu or relu, absolute positions)")
    return PublishedConfig(family="bert", arch="bert", vocab_size=hf.vocab_size,
                           block_size=hf.max_position_embeddings, n_layer=hf.num_hidden_layers,
                           n_head=hf.num_attention_heads, n_embd=hf.hidden_size, d_ff=hf.intermediate_size,
                           bias=True, norm_eps=hf.layer_norm_eps, activation=activation,
                           segment_vocab_size=hf.type_vocab_size)


# ----------------------------------------------------------------------------- T5
# No biases anywhere; RMSNorm weights only; one relative-position table per stack, held by its first block.

T5_ENCODER_LAYER = {
    "norm_1": "encoder.block.{i}.layer.0.layer_norm",
    "attention.query": "encoder.block.{i}.layer.0.SelfAttention.q",
    "attention.key_value": ("encoder.block.{i}.layer.0.SelfAttention.k", "encoder.block.{i}.layer.0.SelfAttention.v"),
    "attention.proj": "encoder.block.{i}.layer.0.SelfAttention.o",
    "norm_2": "encoder.block.{i}.layer.1.layer_norm",
    "mlp.fc": "encoder.block.{i}.layer.1.DenseReluDense.wi", "mlp.proj": "encoder.block.{i}.layer.1.DenseReluDense.wo",
}
T5_DECODER_LAYER = {
    "norm_1": "decoder.block.{i}.layer.0.layer_norm",
    "attention.query": "decoder.block.{i}.layer.0.SelfAttention.q",
    "attention.key_value": ("decoder.block.{i}.layer.0.SelfAttention.k", "decoder.block.{i}.layer.0.SelfAttention.v"),
    "attention.proj": "decoder.block.{i}.layer.0.SelfAttention.o",
    "norm_cross": "decoder.block.{i}.layer.1.layer_norm",
    "cross_attention.query": "decoder.block.{i}.layer.1.EncDecAttention.q",
    "cross_attention.key_value": ("decoder.block.{i}.layer.1.EncDecAttention.k",
                                  "decoder.block.{i}.layer.1.EncDecAttention.v"),
    "cross_attention.proj": "decoder.block.{i}.layer.1.EncDecAttention.o",
    "norm_2": "decoder.block.{i}.layer.2.layer_norm",
    "mlp.fc": "decoder.block.{i}.layer.2.DenseReluDense.wi", "mlp.proj": "decoder.block.{i}.layer.2.DenseReluDense.wo",
}
T5_MODEL = {
    "token_embedding": "shared",
    "relative_bias.bias": "encoder.block.0.layer.0.SelfAttention.relative_attention_bias",
    "decoder_relative_bias.bias": "decoder.block.0.layer.0.SelfAttention.relative_attention_bias",
    "final_norm": "encoder.final_layer_norm", "decoder_norm": "decoder.final_layer_norm",
}


def t5_config(hf):
    if hf.feed_forward_proj != "relu" or hf.d_kv * hf.num_heads != hf.d_model or not hf.tie_word_embeddings:
        raise UserError(f"T5 with {hf.feed_forward_proj!r} feed-forward, heads of {hf.d_kv} x {hf.num_heads} for "
                        f"width {hf.d_model}, tied={hf.tie_word_embeddings} is not supported: the original T5 "
                        f"(t5-small/base/large: relu, d_kv * heads = d_model, tied embeddings) is")
    return PublishedConfig(family="t5", arch="t5", vocab_size=hf.vocab_size,
                           block_size=hf.n_positions if hasattr(hf, "n_positions") else 512, n_layer=hf.num_layers,
                           n_decoder_layer=hf.num_decoder_layers, n_head=hf.num_heads, n_embd=hf.d_model,
                           d_ff=hf.d_ff, bias=False, position="relative", norm_eps=hf.layer_norm_epsilon,
                           activation="relu", relative_buckets=hf.relative_attention_num_buckets,
                           relative_max_distance=hf.relative_attention_max_distance)


# ----------------------------------------------------------------------------- the loader

FAMILIES = {  # model_type in config.json -> (config translation, per-layer tables, whole-model table)
    "gpt2": (gpt2_config, {"blocks": GPT2_LAYER}, GPT2_MODEL),
    "bert": (bert_config, {"blocks": BERT_LAYER}, BERT_MODEL),
    "t5": (t5_config, {"blocks": T5_ENCODER_LAYER, "decoder_blocks": T5_DECODER_LAYER}, T5_MODEL),
}


def their_tensors(theirs, name, n_embd):
    """{"weight": ..., "bias": ...} for one of our modules/parameters from their name (see the tables)."""
    if isinstance(name, tuple):  # k and v stacked into our key_value
        parts = [their_tensors(theirs, n, n_embd) for n in name]
        return {kind: torch.cat([p[kind] for p in parts]) for kind in parts[0]}
    if name.startswith("conv1d:"):
        return conv1d_as_linear(theirs, name, n_embd)
    if name in theirs:  # a single parameter (BERT's output bias)
        return {"": theirs[name]}
    return {kind: theirs[f"{name}.{kind}"] for kind in ("weight", "bias") if f"{name}.{kind}" in theirs}


def convert_state_dict(family, config, theirs):
    """Our state dict from theirs, by the family's tables; every one of our parameters must be filled."""
    _, layer_tables, model_table = FAMILIES[family]
    pairs = list(model_table.items())
    for stack, table in layer_tables.items():
        layers = config.n_layer if stack == "blocks" else config.n_decoder_layer
        pairs += [(f"{stack}.{i}.{ours}", tuple(t.format(i=i) for t in their) if isinstance(their, tuple)
                   else their.format(i=i)) for i in range(layers) for ours, their in table.items()]
    ours = {}
    for our_name, their_name in pairs:
        for kind, tensor in their_tensors(theirs, their_name, config.n_embd).items():
            ours[f"{our_name}.{kind}" if kind else our_name] = tensor
    return ours


def load_weights_into(model, state_dict, source):
    expected = {k for k in model.state_dict() if k != "lm_head.weight"}  # tied to token_embedding
    missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise UserError(f"{source}: the weights do not match the model (missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}): is it a GPT-2, BERT or T5 checkpoint?")
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name in state_dict:
                if tensor.shape != state_dict[name].shape:
                    raise UserError(f"{source}: {name} has shape {tuple(state_dict[name].shape)}, the model "
                                    f"expects {tuple(tensor.shape)}")
                tensor.copy_(state_dict[name])


def hub_reachable(seconds=5.0):
    """One quick connection attempt, instead of the hub client's minute of retries with a message each."""
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host.split(":")[0], 443), timeout=seconds).close()
        return True
    except OSError:
        return False


def local_folder(name_or_folder):
    """True for a folder written by save_pretrained, False for what can only be a hub name; one line for a path
    that is neither (no package is needed to say so)."""
    if os.path.isdir(name_or_folder):
        if os.path.exists(os.path.join(name_or_folder, "config.json")):
            return "folder"
        if os.path.exists(os.path.join(name_or_folder, "ckpt.pt")):
            raise UserError(f"{name_or_folder} is a train.py out_dir, not published weights: pass "
                            f"--out_dir={name_or_folder} instead (with train.py's --init_from=resume to continue it)")
        raise UserError(f"{name_or_folder} holds no config.json (published weights, written by save_pretrained) "
                        f"and no ckpt.pt (a train.py run's folder, once its first checkpoint is saved; train.py "
                        f"--init_from adapts a gpt from one): pass a save_pretrained folder or a hub name such as "
                        f"gpt2, bert-base-uncased, t5-small")
    if name_or_folder.startswith((".", "/", "~")) or os.path.exists(name_or_folder):
        raise UserError(f"{name_or_folder} is not a folder: pass a folder written by save_pretrained, or a hub "
                        f"name such as gpt2, bert-base-uncased, t5-small")
    return False


def where_from(name_or_folder):
    """"folder", "cache" (downloaded before: no network needed) or "hub"; one line when it can be none of them."""
    if local_folder(name_or_folder):
        return "folder"
    from huggingface_hub import try_to_load_from_cache
    try:
        cached = isinstance(try_to_load_from_cache(name_or_folder, "config.json"), str)
    except ValueError:  # not even a valid hub name
        cached = False
    if cached:
        return "cache"
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "")
    if offline or not hub_reachable():
        raise UserError(f"could not load {name_or_folder!r}: it is not a folder, and the Hugging Face hub cannot "
                        f"be reached to download it (no network?): pass a folder written by save_pretrained")
    return "hub"


def open_with_transformers(name_or_folder):
    """(transformers, the name with ~ expanded, where it comes from, its config): the cheap first step of every
    load, so a wrong family or arch is refused before any weights are downloaded."""
    name_or_folder = os.path.expanduser(name_or_folder)
    folder = local_folder(name_or_folder)  # a wrong path is refused before any package is asked for
    try:
        import transformers
    except ImportError:
        raise UserError(f"could not load {name_or_folder!r}: " + (
            "reading a save_pretrained folder" if folder else "it is not a folder, and a Hugging Face hub name")
            + " needs the optional package transformers: pip install transformers") from None
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    source = where_from(name_or_folder)
    try:
        hf_config = transformers.AutoConfig.from_pretrained(name_or_folder, local_files_only=source != "hub")
    except (OSError, ValueError) as e:
        raise could_not_load(name_or_folder, source, e) from None
    if hf_config.model_type not in FAMILIES:
        raise UserError(f"{name_or_folder} is a {hf_config.model_type!r} model: only GPT-2, BERT and T5 load")
    return transformers, name_or_folder, source, hf_config


def could_not_load(name_or_folder, source, error):
    where = "the folder" if source == "folder" else f"the Hugging Face {source}"
    return UserError(f"could not load {name_or_folder!r} from {where}: {str(error).splitlines()[0][:200]}")


def read_hugging_face(name_or_folder, opened=None):
    """(their config, their state dict, their tokenizer or None) through transformers, with one-line errors.
    opened: what open_with_transformers(name_or_folder) returned, when the caller already asked."""
    transformers, name_or_folder, source, hf_config = opened or open_with_transformers(name_or_folder)
    local = dict(local_files_only=source != "hub")
    model_class = {"gpt2": transformers.GPT2LMHeadModel, "bert": transformers.BertForMaskedLM,
                   "t5": transformers.T5ForConditionalGeneration}[hf_config.model_type]
    try:
        hf_model, info = model_class.from_pretrained(name_or_folder, dtype=torch.float32, output_loading_info=True,
                                                     **local)
    except (OSError, ValueError) as e:
        raise could_not_load(name_or_folder, source, e) from None
    missing = sorted(info["missing_keys"])
    if missing:  # e.g. a BertModel without the masked-LM head: transformers would fill it randomly
        raise UserError(f"{name_or_folder} lacks {len(missing)} weights of a "
                        f"{model_class.__name__} (e.g. {missing[0]}): it was saved from another head "
                        f"(GPT-2 with its LM head, BERT with its masked-LM head, the whole T5 are needed)")
    tokenizer = None if hf_config.model_type == "gpt2" else their_tokenizer(transformers, name_or_folder, source)
    return hf_config, hf_model.state_dict(), tokenizer


def their_tokenizer(transformers, name_or_folder, source):
    """The transformers tokenizer saved with a BERT or T5 checkpoint, or None (a folder of weights only, as the
    tests' tiny models). GPT-2's BPE comes from tiktoken, as everywhere in the project."""
    files = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model")
    if source == "folder" and not any(os.path.exists(os.path.join(name_or_folder, f)) for f in files):
        return None
    try:
        return transformers.AutoTokenizer.from_pretrained(name_or_folder, local_files_only=source != "hub")
    except (OSError, ValueError, TypeError):
        return None


def read_tokenizer(name_or_folder):
    """(family, transformers tokenizer) of a published BERT or T5 checkpoint, without its weights: for
    data/shakespeare/prepare.py --tokenizer=... and for sampling from a model fine-tuned on such a dataset."""
    transformers, name_or_folder, source, hf_config = open_with_transformers(name_or_folder)
    if hf_config.model_type == "gpt2":
        raise UserError(f"{name_or_folder} is a GPT-2: its tokens are tiktoken's gpt2 BPE (--tokenizer=gpt2)")
    tokenizer = their_tokenizer(transformers, name_or_folder, source)
    if tokenizer is None:
        raise UserError(f"{name_or_folder} has no tokenizer files: save the tokenizer beside the weights "
                        f"(tokenizer.save_pretrained(folder))")
    return hf_config.model_type, tokenizer


def dataset_meta(name_or_folder, family, hf):
    """meta.pkl of a text tokenized with a published BERT or T5 tokenizer: *their* special ids under the
    project's names, so objectives.py masks with BERT's own [MASK] and corrupts spans with T5's own
    <extra_id_k> sentinels (as they were pre-trained), and pads / ends with their [PAD] / [SEP] or </s>.
    T5 has no [MASK]: its unknown token stands in (only the samplers' banned list reads it). Neither has UL2's
    mode tokens, so --objective=ul2 is refused on these datasets (train.py)."""
    sentinels = []
    while True:  # <extra_id_0>, <extra_id_1>, ... where they sit (T5 counts them down from the top)
        token_id = hf.convert_tokens_to_ids(f"<extra_id_{len(sentinels)}>")
        if token_id is None or token_id == hf.unk_token_id:
            break
        sentinels.append(token_id)
    if family == "t5" and not sentinels:
        raise UserError(f"{name_or_folder}'s tokenizer has no <extra_id_0>: span corruption needs T5's sentinels")
    vocab_size = len(hf)
    top_block = sorted(sentinels) == list(range(vocab_size - len(sentinels), vocab_size))
    specials = {"[PAD]": hf.pad_token_id, "[EOS]": hf.eos_token_id if family == "t5" else hf.sep_token_id,
                "[MASK]": hf.mask_token_id if family == "bert" else hf.unk_token_id,
                **{f"<S{i}>": token_id for i, token_id in enumerate(sentinels)}}
    missing = [name for name, token_id in specials.items() if token_id is None]
    if missing:
        raise UserError(f"{name_or_folder}'s tokenizer has no {', '.join(missing)} token")
    return {"tokenizer": name_or_folder, "tokenizer_family": family, "vocab_size": vocab_size,
            # ids below num_ordinary are text (what MLM may mask or draw at random): all of BERT's vocabulary, as
            # BERT drew its random replacements; T5's text is everything below its sentinels
            "num_ordinary": vocab_size - len(sentinels) if sentinels and top_block else vocab_size,
            "specials": specials, "num_sentinels": len(sentinels),
            "never_sampled": sorted(i for i in hf.all_special_ids if i not in sentinels)}


def build(hf_config, theirs, source, device):
    family = hf_config.model_type
    config = FAMILIES[family][0](hf_config)
    model = published_model(config)  # random init first (a second or two for GPT-2 small), then overwritten
    load_weights_into(model, convert_state_dict(family, config, theirs), source)
    return model.to(device).eval(), family


def load_pretrained(name_or_folder, device="cpu", opened=None):
    """(Transformer with the published weights, in eval mode; their transformers tokenizer or None)."""
    hf_config, theirs, tokenizer = read_hugging_face(name_or_folder, opened)
    return build(hf_config, theirs, name_or_folder, device)[0], tokenizer


# ----------------------------------------------------------------------------- their tokenizers, for sample.py

class PublishedTokenizer:
    """sample.py's tokenizer interface (encode, decode) over GPT-2's BPE (tiktoken, as the rest of the project) or
    the transformers tokenizer that came with a BERT or T5 checkpoint."""

    def __init__(self, family, hf_tokenizer, as_prepared=False):
        # as_prepared: text ids only, as data/shakespeare/prepare.py wrote them (sample.py adds what the model's
        # objective needs); else as published: BERT's [CLS] first, T5's </s> last
        self.family, self.hf, self.as_prepared = family, hf_tokenizer, as_prepared
        if family == "gpt2":
            self.encoding = tiktoken_encoding("gpt2")
        elif hf_tokenizer is None:
            raise UserError(f"this {family} checkpoint has no tokenizer files: save the tokenizer beside the weights "
                            f"(tokenizer.save_pretrained(folder)) to sample from it")

    def encode(self, text):
        if self.family == "gpt2":
            return self.encoding.encode_ordinary(text)
        if self.as_prepared:
            return self.hf.encode(text, add_special_tokens=False)
        if self.family == "bert":  # [CLS] text; the [MASK]s to fill follow
            return [self.hf.cls_token_id] + self.hf.encode(text, add_special_tokens=False)
        return self.hf.encode(text)  # t5: text </s>, the encoder's input

    def decode(self, ids):
        if self.family == "gpt2":
            return self.encoding.decode(ids)
        if self.family == "t5" and self.hf.eos_token_id in ids:  # the decoder is done at </s>
            ids = ids[:ids.index(self.hf.eos_token_id)]
        if self.family == "t5":
            return self.hf.decode(ids)
        text = self.hf.decode(ids, skip_special_tokens=True)  # bert: words after the prompt's words get a space
        return " " + text if text and not self.hf.convert_ids_to_tokens(ids[0]).startswith("##") else text

    def specials(self, vocab_size):
        """Specials for the samplers: the mask id (BERT), pad as t5's decoder start, the ids never to sample."""
        if self.family == "gpt2":  # only <|endoftext|> is special, and never sampled
            end = self.encoding.eot_token
            return Specials(num_ordinary=end, pad=end, eos=end, mask=end, sentinels=[], modes={}, never_sampled=[end])
        hf = self.hf
        never = [hf.pad_token_id] if self.family == "t5" else list(hf.all_special_ids)  # t5 may write sentinels
        return Specials(num_ordinary=vocab_size, pad=hf.pad_token_id,
                        eos=hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id,
                        mask=hf.mask_token_id if hf.mask_token_id is not None else hf.unk_token_id,
                        sentinels=[], modes={}, never_sampled=[i for i in never if i is not None and i < vocab_size],
                        tokenizer_size=len(hf))


def load_for_sampling(name_or_folder, device):
    """(model, tokenizer, specials) for sample.py --init_from=..."""
    hf_config, theirs, hf_tokenizer = read_hugging_face(name_or_folder)
    model, _ = build(hf_config, theirs, name_or_folder, device)
    tokenizer = PublishedTokenizer(hf_config.model_type, hf_tokenizer)
    return model, tokenizer, tokenizer.specials(model.config.vocab_size)


ARCH_OF_FAMILY = {"gpt2": "gpt", "bert": "bert", "t5": "t5"}


def load_for_training(config, meta):
    """train.py --init_from=<published name or folder>: fine-tune GPT-2, BERT or T5 on a dataset written in that
    checkpoint's own tokens: GPT-2's BPE (data/shakespeare), BERT's WordPiece or T5's SentencePiece with their
    special ids (data/shakespeare/prepare.py --tokenizer=<name>), so MLM masks with BERT's [MASK] and span
    corruption uses T5's <extra_id_k>, as in their pre-training. The training config is updated to describe the
    loaded shape (so the checkpoint says what it holds, and --init_from=resume rebuilds it)."""
    name, arch = config["init_from"], config["arch"]
    prepare = f"python data/shakespeare/prepare.py --tokenizer={name}"
    # the cheap checks first (the name, its family against --arch, the dataset): no weights downloaded for a run
    # that cannot go (a hub name costs its config.json)
    if arch not in ARCH_OF_FAMILY.values():
        raise UserError(f"published checkpoints are GPT-2 (--arch=gpt), BERT (--arch=bert) or T5 (--arch=t5); "
                        f"there is no published {arch}")
    opened = open_with_transformers(name)
    family = opened[3].model_type
    if ARCH_OF_FAMILY[family] != arch:
        raise UserError(f"{name} is a {family} checkpoint: train it with --arch={ARCH_OF_FAMILY[family]} "
                        f"(not --arch={arch})")
    if arch == "gpt" and meta.get("tokenizer") != "gpt2":
        raise UserError(f"--init_from={name} reads GPT-2 BPE tokens but dataset {config['dataset']} is "
                        f"{meta.get('tokenizer')}-level: use --dataset=shakespeare (prepared with tiktoken's gpt2)")
    if arch != "gpt" and meta.get("tokenizer_family") != arch:
        raise UserError(f"--init_from={name} (--arch={arch}) reads the checkpoint's own tokens but dataset "
                        f"{config['dataset']} is {meta.get('tokenizer')}-level: prepare one with its tokenizer "
                        f"({prepare}) and pass the --dataset it prints")
    model, hf_tokenizer = load_pretrained(name, opened=opened)  # the config is not read (nor the hub asked) twice
    c = model.config
    if hf_tokenizer is not None:  # the same vocabulary, not only the same family
        theirs = dataset_meta(name, family, hf_tokenizer)
        if any(theirs[k] != meta.get(k) for k in ("vocab_size", "specials")):
            raise UserError(f"dataset {config['dataset']} was tokenized with another {family} vocabulary than "
                            f"{name}'s ({meta.get('tokenizer')}): prepare it again ({prepare})")
    needed = meta["num_ordinary"] if family == "gpt2" else meta["vocab_size"]  # clm reads no special token
    if needed > c.vocab_size:
        raise UserError(f"dataset {config['dataset']} has {needed} token ids, {name} knows {c.vocab_size}")
    if config["block_size"] > c.block_size:
        raise UserError(f"--block_size={config['block_size']} is longer than {name}'s {c.block_size} positions")
    c.dropout = config["dropout"]  # published models trained with 0.1; the flag decides for fine-tuning
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = c.dropout
        elif isinstance(module, Attention):
            module.dropout = c.dropout
    config.update(n_layer=c.n_layer, n_decoder_layer=c.n_decoder_layer, n_head=c.n_head, n_embd=c.n_embd,
                  bias=c.bias, position=c.position, published_weights=name)
    return model.train()


def tokenizer_for(meta):
    """The dataset's tokenizer: characters or tiktoken (meta.pkl), or the published BERT / T5 tokenizer it was
    prepared with (data/shakespeare/prepare.py --tokenizer=...; transformers needed)."""
    if meta.get("tokenizer_family") in ("bert", "t5"):
        family, hf = read_tokenizer(meta["tokenizer"])
        return PublishedTokenizer(family, hf, as_prepared=True)
    return Tokenizer(meta)
