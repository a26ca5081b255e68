"""
The checks of the exercises (exercises/README.md): each tests what the change must do, not how it is written.

    python exercises/check.py 3          # exit 0: solved; exit 1 and one line: what is still missing or wrong
    python exercises/check.py 1 2 3      # several, one line each; exit 0 only if all are solved

A check fails on the untouched tree (the feature is missing) and passes for any correct solution: it compares
against an explicit reference computation, an invariant, or a measured effect with a wide margin. Most run in
seconds on a CPU (tiny models, no downloads); a check that trains a model (5's, for one) takes up to a minute or
two on a busy laptop, says so when it starts and prints its progress every 10 seconds.
"""
import contextlib
import copy
import io
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python exercises/check.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import torch  # noqa: E402

from infra.configurator import UserError, run_main  # noqa: E402

TITLES = {
    1: "sliding-window attention", 2: "break the cache on purpose", 3: "BERT at 40% and 100% masking",
    4: "ALiBi positions", 5: "a new objective in 15 lines: the right-to-left LM", 6: "grouped-query attention",
    7: "an unmasking order of your own: lowest entropy first", 8: "break the reversal curse with data",
    9: "echo embeddings", 10: "CLM then MLM", 11: "speculative decoding", 12: "the prefix-LM as a chat",
}


class Unsolved(Exception):
    """What is still missing or wrong, in one line."""


def expect(condition, message):
    if not condition:
        raise Unsolved(message)


def tiny(arch="gpt", vocab=20, block=24, seed=0, **options):
    from model import ModelConfig, Transformer
    torch.manual_seed(seed)
    return Transformer(ModelConfig(arch=arch, vocab_size=vocab, block_size=block, n_layer=2, n_head=4, n_embd=32,
                                   dropout=0.0, **options)).eval()


def noisy(model, scale, seed):
    """The model with Gaussian noise of std `scale` added to every weight. A tiny model at initialisation writes one
    token again and again when greedy, and then a wrong decoder cannot be told from a right one; noise makes the
    greedy text vary."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    return model


def cached_equals_recomputed(model, ids, tolerance=1e-4):
    """Every position's logits, decoded one token at a time with the KV cache, against one full forward."""
    import kvcache
    cache = kvcache.KVCache(model, ids.size(0), model.config.block_size)
    kvcache.prefill(model, ids[:, :2], cache)
    steps = [kvcache.forward_with_cache(model, ids[:, i:i + 1], cache)[:, -1] for i in range(2, ids.size(1))]
    full = model(ids)[0][:, 2:]
    return (torch.stack(steps, 1) - full).abs().max().item() < tolerance


def training_config(*argv):
    import train
    try:
        return train.resolve_config(list(argv))
    except UserError as e:
        raise Unsolved(f"train.py refuses {' '.join(argv)}: {e}") from None


def char_dataset(folder, text):
    from data.prepare_common import write_dataset
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    os.makedirs(folder, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):  # its "prepared" line is not the check's
        write_dataset(folder, [stoi[c] for c in text], {"tokenizer": "char", "num_ordinary": len(chars),
                                                        "stoi": stoi, "itos": chars})
    return folder


# ----------------------------------------------------------------------------- the checks

def check_1():
    """masks.attention_mask("window", Tq, Tk, window=W): query i (bottom-right aligned) sees keys j with
    i - W < j <= i; a gpt with ModelConfig(window=W) uses it, and cached decoding equals recomputation."""
    import masks
    from infra.attention_maps import attention_maps
    from model import ModelConfig
    expect("window" in getattr(masks, "ATTENTION_KINDS", ()), "masks.ATTENTION_KINDS has no \"window\" kind yet")
    for Tq, Tk, W in ((6, 6, 2), (3, 8, 3), (1, 9, 4), (5, 5, 9)):
        mask, is_causal = masks.attention_mask("window", Tq, Tk, window=W)
        queries = torch.arange(Tk - Tq, Tk)[:, None]
        keys = torch.arange(Tk)[None, :]
        reference = (keys <= queries) & (keys > queries - W)
        if mask is None:  # what SDPA then computes: the top-left triangle, or everything
            got = torch.ones(Tq, Tk).tril().bool() if is_causal else torch.ones(Tq, Tk, dtype=torch.bool)
        else:  # boolean (True: may attend) or additive (0 or -inf), both of which SDPA takes
            got = mask.reshape(Tq, Tk)
            got = got == 0 if got.is_floating_point() else got
        expect(torch.equal(got, reference), f"the window mask for Tq={Tq}, Tk={Tk}, window={W} is not i-W < j <= i")
    expect("window" in ModelConfig.__dataclass_fields__, "ModelConfig has no window field yet")
    model = tiny("gpt", window=3)
    ids = torch.randint(0, 20, (2, 12), generator=torch.Generator().manual_seed(1))
    probabilities = attention_maps(model, ids)[0]
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    expect(bool((probabilities[..., ~((j <= i) & (j > i - 3))] == 0).all()), "a window-3 gpt attends outside its window")
    expect(cached_equals_recomputed(model, ids), "cached decoding with a window differs from recomputation")
    far = ids.clone()
    far[:, 0] = (far[:, 0] + 1) % 20  # two layers of window 3 see 2 * (3 - 1) = 4 positions back, not 11
    expect(torch.allclose(model(ids)[0][:, -1], model(far)[0][:, -1]), "the last position depends on a token its "
                                                                        "windows cannot reach")


def check_2():
    """kvcache.bidirectional_cache_error(model, ids, prefix_length=P) for prefixlm: caching is exact when the new
    token comes after the prefix (P < len - 1), and wrong when the new token joins the prefix (P = len)."""
    import kvcache
    model = tiny("prefixlm")
    ids = torch.randint(0, 20, (2, 12), generator=torch.Generator().manual_seed(2))
    try:
        after = kvcache.bidirectional_cache_error(model, ids, prefix_length=6)
        inside = kvcache.bidirectional_cache_error(model, ids, prefix_length=12)
    except TypeError as e:
        if "prefix_length" not in str(e):  # a TypeError of the solution itself: its own line, below
            raise
        raise Unsolved("kvcache.bidirectional_cache_error takes no prefix_length yet") from None
    expect(after["logit_difference"] < 1e-5, f"appending after the prefix should be exact, differs by "
                                             f"{after['logit_difference']:.2e}")
    expect(inside["earlier_hidden_change"] > 1e-3 and inside["logit_difference"] > 1e-5,
           "appending inside the prefix must change the cached positions (a cache cannot be right there)")


def check_3():
    """train.py --mlm_rate (default 0.15): the share of positions bert's objective chooses."""
    import objectives
    import train
    from objectives import Specials
    from data.prepare_common import NUM_SENTINELS, special_token_ids
    expect("mlm_rate" in train.DEFAULTS, "train.py has no --mlm_rate option yet")
    expect(train.DEFAULTS["mlm_rate"] == 0.15, "--mlm_rate must default to BERT's 0.15")
    specials = Specials.from_meta({"specials": special_token_ids(60), "num_ordinary": 60,
                                   "num_sentinels": NUM_SENTINELS})
    windows = torch.randint(0, 60, (200, 101), generator=torch.Generator().manual_seed(3))
    for rate, mask_fraction, random_fraction in ((0.4, 0.8, 0.1), (1.0, 1.0, 0.0)):
        config = training_config("--arch=bert", f"--mlm_rate={rate}", f"--mlm_mask_fraction={mask_fraction}",
                                 f"--mlm_random_fraction={random_fraction}")
        batch = objectives.batch_for(config, windows, specials, torch.Generator().manual_seed(4))
        expect(abs(batch.supervised_fraction() - rate) < 0.01, f"--mlm_rate={rate} supervises "
                                                               f"{batch.supervised_fraction():.2f} of the positions")
        chosen = batch.targets != -100
        share = (batch.inputs[chosen] == specials.mask).float().mean().item()
        expect(abs(share - mask_fraction) < 0.03, f"[MASK] share {share:.2f}, expected {mask_fraction}")
    for bad in ("0", "1.5"):
        try:
            train.resolve_config(["--arch=bert", f"--mlm_rate={bad}"])
        except Exception as e:
            expect(type(e).__name__ == "UserError", f"--mlm_rate={bad} ends in {type(e).__name__}, not one line")
        else:
            raise Unsolved(f"--mlm_rate={bad} is accepted: it must be in (0, 1]")


def check_4():
    """ModelConfig(position="alibi"): head h adds -slope_h * (i - j) to the score of query i and key j, slopes
    2^(-8 (h + 1) / n_head); no position parameters; cached decoding equals recomputation."""
    from infra.attention_maps import attention_maps, explicit_attention_probabilities
    from model import POSITION_KINDS
    expect("alibi" in POSITION_KINDS, "model.POSITION_KINDS has no \"alibi\" yet")
    model = tiny("gpt", position="alibi")
    nope = tiny("gpt", position="none")
    expect(model.num_parameters() == nope.num_parameters(), "ALiBi has parameters; it must have none")
    ids = torch.randint(0, 20, (2, 10), generator=torch.Generator().manual_seed(5))
    attention = model.blocks[0].attention
    x = model.blocks[0].norm_1(model.embed(ids))
    q, k = attention.split_heads(attention.query(x)), attention.keys_and_values(x)[0]
    slopes = torch.tensor([2 ** (-8 * (h + 1) / 4) for h in range(4)])[None, :, None, None]
    i, j = torch.arange(10)[:, None], torch.arange(10)[None, :]
    bias = -slopes * (i - j).float()
    mask = (j <= i)[None, None]
    reference = explicit_attention_probabilities(q, k, bias.masked_fill(~mask, float("-inf")))
    got = attention_maps(model, ids)[0]
    expect(torch.allclose(got, reference, atol=1e-5), "layer 0's attention is not softmax(q.k/sqrt(d) - slope*(i-j))")
    expect(cached_equals_recomputed(model, ids), "cached decoding with ALiBi differs from recomputation")


def check_5():
    """objectives: "rclm" for gpt, next-token prediction on the window read backwards; every position supervised;
    it trains (train.py --objective=rclm: validation loss below the characters' entropy)."""
    import objectives
    import train
    expect("rclm" in objectives.OBJECTIVES_FOR_ARCH.get("gpt", ()), "gpt has no \"rclm\" objective yet")
    expect("rclm" in objectives.BATCH_MAKERS, "\"rclm\" is an objective of gpt but objectives.BATCH_MAKERS has no "
                                              "function that makes its batch yet")
    windows = torch.arange(24).view(2, 12)
    batch = objectives.batch_for({"objective": "rclm", "arch": "gpt"}, windows, None, torch.Generator())
    backwards = windows.flip(1)
    expect(torch.equal(batch.inputs, backwards[:, :-1]) and torch.equal(batch.targets, backwards[:, 1:]),
           "rclm's inputs and targets are not the reversed window, shifted by one")
    expect(batch.supervised_fraction() == 1.0, "rclm must supervise every position")
    with tempfile.TemporaryDirectory() as folder:
        text = "".join(("abcde fgh " * 3 + "ij, kl.\n") for _ in range(400))  # structure that predicts itself
        char_dataset(folder, text)
        config = training_config(f"--dataset={folder}", f"--out_dir={folder}/out", "--objective=rclm", "--n_layer=1",
                                 "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=8", "--max_iters=100",
                                 "--lr_decay_iters=100", "--eval_interval=50", "--eval_iters=4", "--device=cpu",
                                 "--dropout=0.0", "--quiet=True", "--learning_rate=1e-2")
        print("exercise 5: training a tiny gpt on rclm for 100 iterations (about a minute on a busy laptop)",
              flush=True)
        result = train.train(config)
    counts = torch.bincount(torch.tensor([ord(c) for c in text])).float()
    entropy = -(counts[counts > 0] / counts.sum() * torch.log(counts[counts > 0] / counts.sum())).sum().item()
    expect(result["val_loss"] < entropy - 0.3, f"rclm's validation loss {result['val_loss']:.2f} is not below the "
                                               f"character entropy {entropy:.2f}: it does not train")


def check_6():
    """ModelConfig(n_kv_head=k): k key/value heads shared by n_head / k query heads each; the KV cache holds k
    heads (n_head / k times smaller); decoding with it equals recomputation; n_kv_head must divide n_head."""
    import kvcache
    from model import ModelConfig
    expect("n_kv_head" in ModelConfig.__dataclass_fields__, "ModelConfig has no n_kv_head field yet")
    full, grouped = tiny("gpt"), tiny("gpt", n_kv_head=1)
    cache_full, cache_grouped = kvcache.KVCache(full, 1, 24), kvcache.KVCache(grouped, 1, 24)
    expect(cache_full.keys.numel() == 4 * cache_grouped.keys.numel(), "the cache of n_kv_head=1 is not 4x smaller")
    expect(grouped.num_parameters() < full.num_parameters(), "n_kv_head=1 should need fewer key/value weights")
    ids = torch.randint(0, 20, (2, 12), generator=torch.Generator().manual_seed(6))
    expect(cached_equals_recomputed(grouped, ids), "cached decoding with grouped K/V differs from recomputation")
    for config in (dict(n_kv_head=3),):
        try:
            tiny("gpt", **config)
        except ValueError:
            continue
        raise Unsolved("n_kv_head=3 with 4 heads is accepted: it must divide n_head")


def check_7():
    """sample.unmask(order="entropy"): the position whose predicted distribution has the lowest entropy goes
    first; every mask is filled (sample.py's --order takes the names of UNMASK_ORDERS)."""
    import sample
    expect("entropy" in sample.UNMASK_ORDERS, "sample.UNMASK_ORDERS has no \"entropy\" yet")

    class StandIn:  # three masked positions: lowest entropy at 0, most confident at 1, uniform at 2
        config = type("Config", (), {"arch": "bert", "vocab_size": 12})()
        seen = []

        def eval(self):
            return self

        def __call__(self, x, **_):
            self.seen.append(x.clone())
            logits = torch.full((*x.shape, 12), -30.0)
            logits[:, 0, :2] = 0.0                                   # two tokens at 1/2: entropy ln 2
            logits[:, 1, 0], logits[:, 1, 1:11] = math.log(0.6), math.log(0.04)  # 0.6 and ten at 0.04: entropy 1.6
            logits[:, 2, :11] = 0.0                                  # uniform over 11: entropy ln 11
            return logits, None

    model, x = StandIn(), torch.full((1, 3), 11)
    sample.unmask(model, x, x == 11, 3, sample.Sampling(0, order="entropy"))
    expect(bool((x != 11).all()), "unmask(order=\"entropy\") left masks")
    first = (model.seen[1] != 11).nonzero()[:, 1].tolist() if len(model.seen) > 1 else []
    expect(first == [0], f"the lowest-entropy position (0) should be revealed first, not {first} (\"confident\" "
                         f"would take 1)")


def check_8():
    """experiments/reversal.py: a model "gpt-entity-reversed" trained on a text that also states every fact
    backwards at the entity level ("MZRT:kxqb" beside "kxqb:MZRT"), and still no evaluation question in it."""
    import numpy as np
    from experiments import reversal
    expect("gpt-entity-reversed" in reversal.MODEL_NAMES, "reversal.MODEL_NAMES has no \"gpt-entity-reversed\" yet")
    entities = reversal.make_entities(20, np.random.default_rng(0))
    lines, train_half, eval_half = reversal.training_lines(entities)
    try:
        text = reversal.stream(lines, 2, np.random.default_rng(1), entity_reversed=True)
    except TypeError as e:
        if "entity_reversed" not in str(e):  # a TypeError of the solution itself: its own line, below
            raise
        raise Unsolved("reversal.stream takes no entity_reversed option yet") from None
    for k, v in entities:
        expect(f"{v}:{k}\n" in text and f"{k}:{v}\n" in text, f"the fact {k}:{v} is not stated both ways")
    for k, v in eval_half:
        expect(f">{k}:" not in text and f"<{v}:" not in text, "an evaluation question leaked into the training text")


def check_9():
    """finetune.py --pooling=echo (gpt): the input read twice, the mean of the second copy's states (each of them
    has read the whole first copy); refused for the bidirectional readers."""
    from experiments import finetune
    model = tiny("gpt", block=32)
    ids = torch.randint(0, 20, (3, 8), generator=torch.Generator().manual_seed(9))
    lengths = torch.tensor([8, 5, 6])
    try:
        echo = finetune.pooled_features(model, ids, lengths, "echo")
    except Exception as e:
        raise Unsolved(f"pooled_features(..., \"echo\") fails: {type(e).__name__}: {e}") from None
    for row in range(3):
        n = int(lengths[row])
        twice = torch.cat([ids[row, :n], ids[row, :n]])[None]
        reference = model.run_stack(twice)[0, n:].mean(0)
        expect(torch.allclose(echo[row], reference, atol=1e-5), f"row {row}: not the mean of the second copy's states")
    try:
        finetune.resolve_pooling("echo", "bert")
    except UserError:
        pass
    else:
        raise Unsolved("--pooling=echo is accepted for bert: it is for causal models")
    expect(finetune.resolve_pooling("echo", "gpt") == "echo", "--pooling=echo is refused for gpt")


def check_10():
    """train.py --switch_at=N --switch_to=bert:mlm: gpt's clm until iteration N, then the same weights trained as
    bert with mlm (the bidirectional mask); a run stopped after the switch resumes exactly."""
    import json
    import train
    expect("switch_at" in train.DEFAULTS and "switch_to" in train.DEFAULTS, "train.py has no --switch_at/--switch_to")
    for wrong in (["--switch_to=bert:mlm"], ["--switch_at=6"], ["--switch_at=6", "--switch_to=bert"],
                  ["--switch_at=6", "--switch_to=bert:clm"], ["--switch_at=6", "--switch_to=t5:span_corruption"]):
        try:  # what the switch cannot do is refused in one line (infra/train_config.py), not a traceback later
            train.resolve_config(wrong)
        except UserError:
            continue
        expect(False, f"train.py accepts {' '.join(wrong)}: refuse it in infra/train_config.py's checks")
    with tempfile.TemporaryDirectory() as folder:
        char_dataset(os.path.join(folder, "data"), "".join(f"line {i % 97} of the text.\n" for i in range(800)))
        common = [f"--dataset={folder}/data", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=32",
                  "--batch_size=4", "--lr_decay_iters=12", "--eval_interval=4", "--eval_iters=2", "--device=cpu",
                  "--dropout=0.0", "--quiet=True", "--switch_at=6", "--switch_to=bert:mlm", "--log_interval=1"]
        straight = train.train(training_config(*common, f"--out_dir={folder}/a", "--max_iters=12"))
        expect(straight["model"].config.arch == "bert", "after --switch_at the model is not bert")
        train.train(training_config(*common, f"--out_dir={folder}/b", "--max_iters=8"))
        train.train(training_config(*common, f"--out_dir={folder}/b", "--max_iters=12", "--init_from=resume"))

        def losses(out):
            with open(os.path.join(folder, out, "log.jsonl")) as f:
                return [(r["iter"], r["loss"]) for r in map(json.loads, f) if "loss" in r]

        expect(losses("a") == losses("b"), "a run resumed after the switch does not repeat the straight run's losses")
        supervised = straight["supervised_seen"] / straight["tokens_seen"]
        expect(0.5 < supervised < 0.65, f"half clm (100% supervised), half mlm (15%): {supervised:.2f} supervised")


def check_11():
    """kvcache.speculative_generate(target, draft, prompt, max_new_tokens, k): greedy speculative decoding. The
    tokens are exactly the target's greedy ones; with the target as its own draft every proposal is accepted, so
    the target's forward passes fall to about max_new_tokens / (k + 1)."""
    import kvcache
    expect(hasattr(kvcache, "speculative_generate"), "kvcache has no speculative_generate yet")
    target = noisy(tiny("gpt", vocab=20, block=40, seed=1), 0.1, 1)
    draft = noisy(copy.deepcopy(target), 0.02, 2)  # agrees with the target often, not always: rejections happen
    prompt = torch.randint(0, 20, (1, 5), generator=torch.Generator().manual_seed(11))
    import sample
    greedy = sample.generate(target, prompt, 24, sample.GREEDY)
    assert not torch.equal(sample.generate(draft, prompt, 24, sample.GREEDY), greedy)  # the check's own premise
    for helper in (draft, target):
        tokens, passes = kvcache.speculative_generate(target, helper, prompt, 24, k=4)
        expect(torch.equal(tokens, greedy), "speculative decoding changed the target's greedy tokens")
    expect(passes <= 24 // 5 + 2, f"with the target as its own draft it took {passes} target passes for 24 tokens")


def check_12():
    """kvcache.chat(model, turns, reply_tokens): prefixlm answers turn after turn; the first turn is the
    bidirectional prefix, every later turn and reply is appended to the one cache (never recomputed). Replies equal
    a full recomputation with the same prefix; positions computed grow linearly with the turns."""
    import kvcache
    expect(hasattr(kvcache, "chat"), "kvcache has no chat yet")
    model = noisy(tiny("prefixlm", vocab=20, block=64), 0.1, 12)  # replies that vary: a wrong prefix shows
    g = torch.Generator().manual_seed(12)
    turns = [torch.randint(0, 20, (1, n), generator=g) for n in (6, 4, 5, 3)]
    replies, computed = kvcache.chat(model, turns, 4)
    context = torch.cat([turns[0]], 1)
    for number, turn in enumerate(turns):
        if number:
            context = torch.cat([context, turn], 1)
        for _ in range(4):  # the reference: the whole history again, the first turn as the prefix
            logits = model(context, prefix_length=torch.tensor([turns[0].size(1)]))[0][:, -1]
            context = torch.cat([context, logits.argmax(-1, keepdim=True)], 1)
        expect(torch.equal(replies[number], context[:, -4:]), f"turn {number + 1}'s reply differs from recomputation")
    total = sum(t.size(1) for t in turns) + 4 * len(turns)
    expect(computed <= total, f"{computed} positions computed for {total} tokens: the history was recomputed")


CHECKS = {number: globals()[f"check_{number}"] for number in TITLES}


def main(argv):
    if argv in (["-h"], ["--help"]):
        print(__doc__.strip() + "\n\n" + "\n".join(f"  {n:2d}  {title}" for n, title in TITLES.items()))
        return
    numbers = list(dict.fromkeys(int(a) for a in argv if a.isascii() and a.isdigit() and int(a) in CHECKS))  # ²: no
    if not numbers or len(numbers) != len(set(argv)):
        raise UserError(f"pass the numbers of exercises, 1 to {len(CHECKS)} (python exercises/check.py 3, or 1 2 3; "
                        f"--help lists them), not {' '.join(argv) or 'nothing'}")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    solved = True
    for number in numbers:
        try:
            CHECKS[number]()
            print(f"exercise {number} ({TITLES[number]}): solved", flush=True)
        except Unsolved as e:
            solved = False
            print(f"exercise {number} ({TITLES[number]}): not solved: {e}", flush=True)
        except (KeyboardInterrupt, BrokenPipeError):
            raise
        except Exception as e:  # the feature half there: its error, as one line
            solved = False
            message = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            print(f"exercise {number} ({TITLES[number]}): not solved: {type(e).__name__}: {message}", flush=True)
    if not solved:
        sys.exit(1)


if __name__ == "__main__":
    run_main(lambda: main(sys.argv[1:]), interrupted="the checks finished are printed above; none changed a file")
