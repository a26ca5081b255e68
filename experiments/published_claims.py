"""
Question: do the chapter's measurable claims hold on the published models it is about? GPT-2 and BERT as
released, loaded into the project's own modules by infra/pretrained.py, measured with the same functions as our
small models.

    python experiments/published_claims.py                # gpt2 + bert-base-uncased from the hub: ~10 minutes, a CPU
                                                          # -> results/study/published-claims.{md,json}
    python experiments/published_claims.py --gpt=gpt2-medium --device=cuda
    python experiments/published_claims.py --gpt=FOLDER --bert=FOLDER   # save_pretrained folders (the tests)

It needs `transformers` and, for hub names, a network the first time (then the hub's cache). It has not been run
on the real models here: the machines that measured this project have no network (docs/published-models.md).

    C4     are the conditionals a joint distribution? Over a small vocabulary W (the most frequent words of the
           text, every conditional renormalised to W), GPT-2's chain rule p(x) p(y | x) sums to 1 over W x W by
           construction (an illustration, and a check of the code); BERT's pseudo-likelihood p(x | y) p(y | x)
           need not, but a joint's own conditionals need not either, so that sum proves nothing. The measurement:
           a joint's two conditionals multiply to 1 around every cycle (x,y) -> (x',y) -> (x',y') -> (x,y') ->
           (x,y); the worst |log| of that product, for GPT-2's (0 to rounding: a positive control) and BERT's.
           Also bits per character of the same text: GPT-2's is a likelihood, BERT's pseudo-likelihood is not (it
           sees both sides of each token, so it is lower and means something else).
    D3     effective rank of every layer's attention matrices on windows of the text (causal: lower triangular
           with a positive diagonal, full numerical rank by construction; bidirectional: measured)
    B1/D1  cloze on words that are one token for both tokenizers: BERT with both sides vs GPT-2 from the left
           only, beside always answering the most frequent blanked word
    D4     GPT-2 decoding on this device with the KV cache vs recomputing, tokens/s, and the share of the
           bandwidth floor (every weight read once per token)
"""
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/published_claims.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import torch

import sample
from infra.configurator import UserError, apply_overrides, pick_device, read_text_file, run_main
from infra.pretrained import load_for_sampling
from infra.progress import Progress, StopSignals, check_writable, format_duration, write_atomically
from experiments.study import attention_ranks
from infra.timing import copy_bandwidth, machine_name, median_time
from infra.dataset import DATA_DIR

DEFAULTS = dict(gpt="gpt2", bert="bert-base-uncased", text="", device="auto", windows=8, window_tokens=64,
                vocabulary_words=40, cloze_blanks=200, decode_tokens=32, out_dir="results/study", seed=1337)
LN2 = math.log(2)
FALLBACK_TEXTS = [os.path.join(DATA_DIR, "shakespeare_char", "input.txt"), os.path.join(DATA_DIR, "shakespeare", "input.txt")]


def read_text(path):
    """--text (read as every script reads a text file: one line if it is missing, binary, a folder), else the
    Tiny Shakespeare a prepare script downloaded (prepare.py --input=... copies no text there: pass --text)."""
    if path:
        return read_text_file(path, "--text")[:200_000]
    for candidate in FALLBACK_TEXTS:
        if os.path.isfile(candidate):
            return read_text_file(candidate, "text")[:200_000]
    raise UserError("no text: pass --text=<a UTF-8 file> (for example your copy of Tiny Shakespeare's input.txt)")


# ----------------------------------------------------------------------------- C4

@torch.no_grad()
def two_token_normalisation(gpt, gpt_tok, bert, bert_tok, words):
    """Sum over W x W of GPT-2's chain rule and of BERT's pseudo-likelihood, conditionals renormalised to W."""
    device = gpt.token_embedding.weight.device
    gpt_ids = torch.tensor([gpt_tok.encode(" " + w)[0] for w in words], device=device)
    bert_ids = torch.tensor([bert_tok.hf.convert_tokens_to_ids(w) for w in words], device=device)
    end = gpt_tok.encoding.eot_token  # GPT-2's text starts after <|endoftext|>
    first = torch.log_softmax(gpt(torch.tensor([[end]], device=device))[0][0, -1, gpt_ids], -1)  # log p_W(x)
    second = torch.log_softmax(gpt(torch.stack([torch.full_like(gpt_ids, end), gpt_ids], 1))[0][:, -1][:, gpt_ids], -1)
    gpt_sum = (first[:, None] + second).exp().sum().item()  # sum_x sum_y p_W(x) p_W(y | x)
    hf = bert_tok.hf
    n = len(words)
    cls, sep, mask = hf.cls_token_id, hf.sep_token_id, hf.mask_token_id
    column = lambda t: torch.full((n, 1), t, device=device)  # noqa: E731
    left = bert(torch.cat([column(cls), column(mask), bert_ids[:, None], column(sep)], 1))[0][:, 1, bert_ids]
    right = bert(torch.cat([column(cls), bert_ids[:, None], column(mask), column(sep)], 1))[0][:, 2, bert_ids]
    p_x_given_y = torch.softmax(left, -1)   # row y: p_W(x | y)
    p_y_given_x = torch.softmax(right, -1)  # row x: p_W(y | x)
    bert_sum = (p_x_given_y.t() * p_y_given_x).sum().item()  # sum_x sum_y p_W(x | y) p_W(y | x)
    joint = (first[:, None] + second).exp()  # GPT-2's p_W(x, y); its two conditionals, for the same check as BERT's
    gpt_cycle = worst_cycle_inconsistency((joint / joint.sum(0, keepdim=True)).log(),
                                          (joint / joint.sum(1, keepdim=True)).log())
    bert_cycle = worst_cycle_inconsistency(p_x_given_y.t().log(), p_y_given_x.log())
    return gpt_sum, bert_sum, gpt_cycle, bert_cycle


def worst_cycle_inconsistency(log_x_given_y, log_y_given_x):
    """Two conditionals, both indexed [x, y], come from one joint only if log p(x | y) - log p(y | x) = u(x) + v(y)
    (the ratio of the two is p(x) / p(y)); equivalently every cycle (x,y) -> (x',y) -> (x',y') -> (x,y') -> (x,y) of
    conditional ratios multiplies to 1. Returns the largest |log| of that product over all x, x', y, y' (0 for a
    joint; tests/test_claims.py applies it to every pair of positions of the small models)."""
    D = (log_x_given_y - log_y_given_x).double()  # (W, W)
    # the cycle's log product is D[x',y] - D[x,y] + D[x,y'] - D[x',y']: a double difference of D
    cycles = D[None, :, :, None] - D[:, None, :, None] + D[:, None, None, :] - D[None, :, None, :]  # [x, x', y, y']
    return cycles.abs().max().item()


@torch.no_grad()
def bits_per_character(gpt, gpt_tok, bert, bert_tok, passages):
    """GPT-2's chain-rule bits/char and BERT's pseudo-log-likelihood bits/char (one [MASK] at a time)."""
    gpt_nll = bert_nll = characters = 0.0
    device = gpt.token_embedding.weight.device
    progress = Progress("passages", len(passages))  # bert: one forward pass per token of each passage
    for number, text in enumerate(passages):
        progress.update(number)
        ids = torch.tensor([[gpt_tok.encoding.eot_token] + gpt_tok.encode(text)], device=device)
        logp = torch.log_softmax(gpt(ids[:, :-1])[0].float(), -1)
        gpt_nll -= logp.gather(-1, ids[:, 1:, None]).sum().item()
        hf = bert_tok.hf
        tokens = torch.tensor([hf.cls_token_id] + hf.encode(text, add_special_tokens=False) + [hf.sep_token_id],
                              device=device)
        masked = tokens.repeat(len(tokens) - 2, 1)
        positions = torch.arange(1, len(tokens) - 1, device=device)
        masked[torch.arange(len(positions)), positions] = hf.mask_token_id
        logp = torch.log_softmax(bert(masked)[0][torch.arange(len(positions)), positions].float(), -1)
        bert_nll -= logp.gather(-1, tokens[positions, None]).sum().item()
        characters += len(text)
    return gpt_nll / characters / LN2, bert_nll / characters / LN2


# ----------------------------------------------------------------------------- B1 / D1

@torch.no_grad()
def cloze(gpt, gpt_tok, bert, bert_tok, text, blanks, rng):
    """Blank single words (one token in both vocabularies, with 30 words of context before and after)."""
    words = text.split()
    hf = bert_tok.hf
    usable = [i for i in range(30, len(words) - 30) if words[i].isalpha() and words[i].islower()
              and len(gpt_tok.encode(" " + words[i])) == 1 and hf.convert_tokens_to_ids(words[i]) != hf.unk_token_id]
    if not usable:
        raise UserError("no word of the text is a single token for both tokenizers: pass a longer English --text")
    chosen = [usable[i] for i in torch.randperm(len(usable), generator=rng)[:blanks].tolist()]
    both = left = 0
    answers, device = [], gpt.token_embedding.weight.device
    progress = Progress("cloze blanks", len(chosen))  # two real models per blank: minutes on a CPU
    for number, i in enumerate(chosen):
        progress.update(number)
        before, after, word = " ".join(words[i - 30:i]), " ".join(words[i + 1:i + 31]), words[i]
        ids = [hf.cls_token_id] + hf.encode(before, add_special_tokens=False) + [hf.mask_token_id]
        position = len(ids) - 1
        ids += hf.encode(after, add_special_tokens=False) + [hf.sep_token_id]
        both += int(bert(torch.tensor([ids], device=device))[0][0, position].argmax() == hf.convert_tokens_to_ids(word))
        gpt_ids = torch.tensor([gpt_tok.encode(before)], device=device)
        left += int(gpt(gpt_ids)[0][0, -1].argmax() == gpt_tok.encode(" " + word)[0])
        answers.append(word)
    most_frequent = max(set(answers), key=answers.count)
    return {"blanks": len(chosen), "bert, both sides": both / len(chosen), "gpt-2, left only": left / len(chosen),
            f"always {most_frequent!r} (the most frequent blanked word)": answers.count(most_frequent) / len(chosen)}


# ----------------------------------------------------------------------------- D4

def decoding_speed(gpt, gpt_tok, text, new_tokens, device):
    prompt = torch.tensor([gpt_tok.encode(text)[:64]], device=device)
    samplers = {"cached": sample.generate, "recomputed": sample.generate_uncached}
    seconds = {mode: median_time(lambda: samplers[mode](gpt, prompt, new_tokens, sample.Sampling(top_k=1)),
                                 device, repeats=3, warmup=1) for mode in samplers}
    weight_bytes = sum(p.numel() * p.element_size() for p in gpt.parameters())
    floor = weight_bytes / (copy_bandwidth(device) / 2)  # seconds to read every weight once
    return {mode: new_tokens / s for mode, s in seconds.items()} | {
        "bandwidth floor tokens/s": 1 / floor, "cached share of the floor": (new_tokens / seconds["cached"]) * floor}


# ----------------------------------------------------------------------------- the command

def measure(results, config, text, gpt, gpt_tok, bert, bert_tok, device, say):
    """Fill `results` claim by claim (in place: an interrupted run keeps the claims already measured)."""
    rng = torch.Generator().manual_seed(config["seed"])
    words = text.split()
    frequent = sorted(set(w for w in words if w.isalpha() and w.islower()), key=words.count, reverse=True)
    vocabulary = [w for w in frequent if len(gpt_tok.encode(" " + w)) == 1
                  and bert_tok.hf.convert_tokens_to_ids(w) != bert_tok.hf.unk_token_id][:config["vocabulary_words"]]
    say(f"C4: normalisation over {len(vocabulary)} x {len(vocabulary)} two-word texts")
    gpt_sum, bert_sum, gpt_cycle, bert_cycle = two_token_normalisation(gpt, gpt_tok, bert, bert_tok, vocabulary)
    results["C4 sum over W x W"] = {"gpt-2 chain rule": gpt_sum, "bert pseudo-likelihood": bert_sum}
    results["C4 worst cycle |log product| over W x W"] = {
        "gpt-2 (conditionals of its joint)": gpt_cycle, "bert (its conditionals)": bert_cycle}
    starts = torch.randint(0, max(1, len(text) - 400), (config["windows"],), generator=rng).tolist()
    passages = [" ".join(text[s:s + 400].split()[1:-1]) for s in starts]
    say("C4: bits per character")
    results["C4 bits per character"] = dict(zip(("gpt-2 (likelihood)", "bert (pseudo-likelihood, not a likelihood)"),
                                                bits_per_character(gpt, gpt_tok, bert, bert_tok, passages)))
    say("D3: attention ranks")
    T = config["window_tokens"]
    gpt_windows = torch.tensor([gpt_tok.encode(p)[:T] for p in passages if len(gpt_tok.encode(p)) >= T], device=device)
    bert_windows = torch.tensor([bert_tok.encode(p)[:T] for p in passages if len(bert_tok.encode(p)) >= T], device=device)
    results["D3 effective rank per layer (of T)"] = {
        "T": T, "gpt-2": [round(r["effective"], 1) for r in attention_ranks(gpt, gpt_windows)] if len(gpt_windows) else [],
        "bert": [round(r["effective"], 1) for r in attention_ranks(bert, bert_windows)] if len(bert_windows) else []}
    say("B1/D1: cloze")
    results["B1/D1 cloze accuracy"] = cloze(gpt, gpt_tok, bert, bert_tok, text, config["cloze_blanks"], rng)
    say("D4: decoding speed")
    results["D4 decoding"] = decoding_speed(gpt, gpt_tok, text, config["decode_tokens"], device)


def main():
    config = apply_overrides(DEFAULTS, sys.argv[1:])
    device = pick_device(config["device"])
    base = os.path.join(config["out_dir"], "published-claims")
    check_writable([base + ".md", base + ".json"])
    text = read_text(config["text"])
    t0 = time.perf_counter()
    say = lambda what: print(f"[{format_duration(time.perf_counter() - t0)}] {what}", flush=True)  # noqa: E731
    gpt, gpt_tok, _ = load_for_sampling(config["gpt"], device)  # (an error here is one line, nothing printed before)
    bert, bert_tok, _ = load_for_sampling(config["bert"], device)
    say(f"loaded {config['gpt']} and {config['bert']}")
    if gpt.config.arch != "gpt" or bert.config.arch != "bert":
        raise UserError(f"--gpt must be a GPT-2 and --bert a BERT (got {gpt.config.arch} and {bert.config.arch})")
    results = {"gpt": config["gpt"], "bert": config["bert"], "device": device}
    try:
        with StopSignals(immediate=True):  # SIGTERM too, as bench.py and study.py
            measure(results, config, text, gpt, gpt_tok, bert, bert_tok, device, say)
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM: write what is measured, say what is not
        results["interrupted"] = True
        print("interrupted: writing the claims measured so far", flush=True)
    lines = [f"Published models: {config['gpt']} and {config['bert']} on {machine_name(device)}, "
             f"{format_duration(time.perf_counter() - t0)}" + (" (interrupted: the claims below only)"
                                                             if results.get("interrupted") else ""), ""]
    for claim, value in results.items():
        if isinstance(value, dict):
            lines.append(f"- {claim}: " + ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}"
                                                    for k, v in value.items()))
    print("\n".join(lines))
    write_atomically(base + ".md", "\n".join(lines) + "\n", base + ".json", json.dumps(results, indent=1))
    print(f"wrote {base}.md and .json")
    if results.get("interrupted"):
        sys.exit(130)  # a stop, after writing what was measured (docs/reliability.md)


if __name__ == "__main__":
    run_main(main)
