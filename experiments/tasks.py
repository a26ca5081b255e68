"""
The fine-tuning tasks (experiments/finetune.py), made from the text of the prepared char-level Tiny Shakespeare: the labels
come from the text itself, nothing is downloaded, and each task's training and evaluation examples come from
disjoint parts of the text (tests/test_finetune.py). With them, what a trivial rule reaches under the same scoring.

  speaker    a speech without its "NAME:" header -> which of the 8 most frequent characters said it (one
             character under two headers counts once: SAME_CHARACTER). Speeches from every fifth
             20,000-character chunk of the training split are evaluation, the rest training (the validation
             split's plays have other speakers). The backbones read this text, unlabelled, in pretraining.
  tampered   consecutive lines of one speech; in half the examples (exactly) one line, not the first, is replaced
             by a line of about the same length from another speech -> intact or tampered (claim F3: a judgement
             over the whole input), built so that character statistics cannot tell (the n-gram baseline measures
             how far they get). Training passages from the training split, evaluation passages from the
             validation split (never seen by any backbone).
  retrieval  a line and the line that follows it in the same speech (claim E3): the query must find its next
             line among 100 candidates. Training pairs from the training split, evaluation from the validation
             split.
Baselines: the majority class of the training examples and a character 1-3-gram logistic regression (numpy, its
steps and L2 chosen on held-out training examples), which measures how far character statistics get; for
retrieval chance and the cosine similarity of character n-gram counts.
"""
import sys

if __name__ == "__main__":  # beside the commands, but not one: one line, not an import error
    sys.exit("tasks.py: a helper of finetune.py, not a command: "
             "experiments/README.md lists the commands")

import numpy as np

from infra.configurator import UserError
from infra.dataset import load_dataset
from infra.progress import Progress

TASKS = ("speaker", "tampered", "retrieval")
NUM_SPEAKERS, CANDIDATES, CHUNK, EVAL_EVERY = 8, 100, 20_000, 5
# one character under two speaker headers: Richard of Gloucester becomes King Richard III (Henry VI part 3 calls
# him RICHARD at first), Caius Marcius becomes Coriolanus. Kept apart, those labels would measure the place in
# the play, not the speaker
SAME_CHARACTER = {"KING RICHARD III": "GLOUCESTER", "RICHARD": "GLOUCESTER", "MARCIUS": "CORIOLANUS"}


# ----------------------------------------------------------------------------- tasks from the text

def speeches(text, offset=0):
    """[(start offset, speaker, [lines of the speech])] for every "NAME:" block of the text."""
    found, position = [], 0
    for block in text.split("\n\n"):
        lines = block.strip("\n").split("\n")
        header = lines[0]
        if len(lines) >= 2 and header.endswith(":") and header[:-1].strip() and header.upper() == header:
            found.append((offset + position + block.index(header), header[:-1], lines[1:]))
        position += len(block) + 2
    return found


def speaker_task(train_text, max_chars, rng):
    """(train, eval, class names): speech bodies labelled by speaker, the NUM_SPEAKERS most frequent ones."""
    all_speeches = [(start, SAME_CHARACTER.get(speaker, speaker), lines) for start, speaker, lines in speeches(train_text)]
    counts = {}
    for _, speaker, _ in all_speeches:
        counts[speaker] = counts.get(speaker, 0) + 1
    names = sorted(counts, key=lambda s: (-counts[s], s))[:NUM_SPEAKERS]
    train, evaluation = [], []
    for start, speaker, lines in all_speeches:
        body = "\n".join(lines)[:max_chars]
        if speaker in names and len(body) >= 16:
            is_eval = (start // CHUNK) % EVAL_EVERY == EVAL_EVERY - 1
            (evaluation if is_eval else train).append({"text": body, "label": names.index(speaker), "start": start})
    rng.shuffle(train)
    return train, evaluation, names


def tampered_examples(text, offset, max_chars, rng):
    """Passages of >= 2 consecutive lines of one speech (as many as fit in max_chars, one starting at every line,
    so they overlap); every second one gets a line (not the first) replaced by a line from another speech of length
    within 2 characters. At 64 characters nearly every passage is two lines: "does line 2 follow line 1?"."""
    passages, pool = [], []
    for start, _, lines in speeches(text, offset):
        pool += [(start, line) for line in lines]
        i = 0
        while i < len(lines) - 1:
            j = i + 1
            while j < len(lines) and len("\n".join(lines[i:j + 1])) <= max_chars:
                j += 1
            if j - i >= 2:
                passages.append((start, lines[i:j]))
            i += 1  # passages may overlap: more examples from a short validation split
    by_length = {}
    for start, line in pool:
        by_length.setdefault(len(line), []).append((start, line))
    order = rng.permutation(len(passages))
    examples = []
    for number, index in enumerate(order):
        start, lines = passages[index]
        lines, label = list(lines), number % 2  # exactly balanced: 0 intact, 1 tampered
        if label:
            k = int(rng.integers(1, len(lines)))
            budget = max_chars - len("\n".join(lines)) + len(lines[k])
            candidates = [c for d in range(-2, 3) for c in by_length.get(len(lines[k]) + d, [])
                          if c[0] != start and len(c[1]) <= budget and c[1] != lines[k]]
            if not candidates:
                continue
            lines[k] = candidates[int(rng.integers(len(candidates)))][1]
        examples.append({"text": "\n".join(lines), "label": label, "start": start})
    # a skipped tampering would unbalance the labels: keep equal numbers of each
    per_label = min(sum(e["label"] == 0 for e in examples), sum(e["label"] == 1 for e in examples))
    kept, seen = [], [0, 0]
    for e in examples:
        if seen[e["label"]] < per_label:
            kept.append(e)
            seen[e["label"]] += 1
    return kept


def retrieval_pairs(text, offset, max_chars):
    """(line, the line that follows it in the same speech) pairs."""
    pairs = []
    for start, _, lines in speeches(text, offset):
        pairs += [{"text": a[:max_chars], "next": b[:max_chars], "start": start} for a, b in zip(lines, lines[1:])
                  if len(a) >= 8 and len(b) >= 8]
    return pairs


def make_task(task, texts, max_chars, seed, limits):
    """{"train": [...], "eval": [...], "classes": [...]} for a task; texts = {"train": str, "val": str} with the
    validation split's offset in texts["val_offset"]. limits: the most training / evaluation examples to keep, and
    the fewest evaluation examples worth a number ("min_eval")."""
    rng = np.random.default_rng(seed)
    if task == "speaker":
        train, evaluation, classes = speaker_task(texts["train"], max_chars, rng)
        rng.shuffle(evaluation)
    elif task == "tampered":
        train = tampered_examples(texts["train"], 0, max_chars, rng)
        evaluation = tampered_examples(texts["val"], texts["val_offset"], max_chars, rng)
        classes = ["intact", "tampered"]
    else:
        train = retrieval_pairs(texts["train"], 0, max_chars)
        evaluation = retrieval_pairs(texts["val"], texts["val_offset"], max_chars)
        classes = []
    if task == "retrieval":
        rng.shuffle(train)
        rng.shuffle(evaluation)
    if not train or len(evaluation) < max(limits.get("min_eval", 100), CANDIDATES + 1 if task == "retrieval" else 2):
        if not speeches(texts["train"]):  # no "NAME:" blocks at all: no longer context would help
            raise UserError(f"--task={task} is made from speeches (\"NAME:\" headers over blocks of lines), and the "
                            f"dataset's text has none: use Tiny Shakespeare (shakespeare_char)")
        raise UserError(f"--task={task} has {len(train)} training and {len(evaluation)} evaluation examples of at most "
                        f"{max_chars} characters: too few; use a model with a longer context")
    data = {"train": train[:limits["train"]], "eval": evaluation[:limits["eval"]], "classes": classes}
    if task == "retrieval":  # drawn once: every reader and the baselines rank the same candidates
        data["candidates"] = candidate_sets(data["eval"])
    return data


def read_texts(dataset):
    """The training and validation text of a prepared char-level dataset (decoded from its .bin files)."""
    splits, meta = load_dataset(dataset, 8, prepare_if_missing=True)
    if meta["tokenizer"] != "char":
        raise UserError(f"--dataset={dataset} is {meta['tokenizer']}-level: the tasks are made from a character-level "
                        f"dataset's text (shakespeare_char)")
    texts = {split: "".join(meta["itos"][i] for i in np.fromfile(path, dtype=np.uint16))
             for split, path in splits.items()}
    texts["val_offset"] = len(texts["train"])  # offsets of validation examples count from the start of the text
    return texts


# ----------------------------------------------------------------------------- baselines (numpy, no model)

def ngram_features(texts, dimension=4096):
    """Hashed counts of character 1-, 2- and 3-grams, each row scaled to unit length (a bag: order-blind beyond
    three characters)."""
    rows = np.zeros((len(texts), dimension), dtype=np.float32)
    for r, text in enumerate(texts):
        for n in (1, 2, 3):
            for i in range(len(text) - n + 1):
                rows[r, hash_ngram(text[i:i + n]) % dimension] += 1.0
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-9)


def hash_ngram(ngram):
    """A hash that is the same in every process (Python's hash() of a str is salted per run)."""
    value = 2166136261
    for ch in ngram:
        value = ((value ^ ord(ch)) * 16777619) % 2 ** 32
    return value


def tuned_logistic_regression(x_train, y_train, x_eval, num_classes, seed=0, log=print):
    """The baseline at its best: steps and L2 strength chosen on a held-out fifth of the training examples, then
    refitted on all of them (ten fits; a line after each, with the time left). Returns predicted classes."""
    order = np.random.default_rng(seed).permutation(len(x_train))
    fit, held_out = order[len(order) // 5:], order[:len(order) // 5]
    candidates = [(steps, l2) for steps in (100, 300, 1000) for l2 in (1e-4, 1e-3, 1e-2)]
    progress = Progress("  n-gram baseline, steps of gradient descent", int(sum(s for s, _ in candidates) * 1.25), 10.0,
                        log)
    scores, done = {}, 0
    for steps, l2 in candidates:
        predicted = logistic_regression(x_train[fit], y_train[fit], x_train[held_out], num_classes, steps, l2)
        scores[(steps, l2)] = (predicted == y_train[held_out]).mean()
        done += steps
        progress.update(done)
    return logistic_regression(x_train, y_train, x_eval, num_classes, *max(candidates, key=scores.get))


def logistic_regression(x_train, y_train, x_eval, num_classes, steps=300, l2=1e-4, lr=0.5):
    """Multinomial logistic regression by full-batch gradient descent; returns predicted classes for x_eval. All in
    float32 like the features (a float64 weight would turn every product into a slow mixed one)."""
    x_train = x_train.astype(np.float32, copy=False)
    w = np.zeros((x_train.shape[1], num_classes), dtype=np.float32)
    b = np.zeros(num_classes, dtype=np.float32)
    one_hot = np.eye(num_classes, dtype=np.float32)[y_train]
    for _ in range(steps):
        logits = x_train @ w + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        gradient = (p - one_hot) / len(x_train)
        w -= np.float32(lr) * (x_train.T @ gradient + np.float32(l2) * w)
        b -= np.float32(lr) * gradient.sum(0)
    return (x_eval @ w + b).argmax(1)


def retrieval_scores(query, keys, candidates):
    """Recall@1 and MRR: query i's right answer is key i, ranked among candidates[i] (indices of keys, the
    right one first) by cosine similarity."""
    query = query / np.maximum(np.linalg.norm(query, axis=1, keepdims=True), 1e-9)
    keys = keys / np.maximum(np.linalg.norm(keys, axis=1, keepdims=True), 1e-9)
    similarity = np.einsum("nc,nkc->nk", query, keys[candidates])  # (N, CANDIDATES), column 0 the right one
    rank = (similarity[:, 1:] >= similarity[:, :1]).sum(1) + 1  # ties count against the model
    return {"recall@1": float((rank == 1).mean()), "mrr": float((1.0 / rank).mean())}


def candidate_sets(examples, seed=0, size=CANDIDATES):
    """For each query: its own next line first, then size - 1 next lines of other pairs, drawn at random
    among those whose text differs from the right answer and from the query itself (overlapping pairs (a, b) and
    (b, c) would otherwise offer query b its own text, and a common line like "My lord." would tie with the
    right answer)."""
    rng = np.random.default_rng(seed)
    n = len(examples)
    sets = np.zeros((n, size), dtype=np.int64)
    for i, e in enumerate(examples):
        allowed = [j for j, other in enumerate(examples) if other["next"] not in (e["next"], e["text"])]
        if len(allowed) < size - 1:
            raise UserError(f"only {len(allowed)} distinct candidate lines for retrieval: use more examples")
        sets[i] = [i] + list(rng.choice(allowed, size=size - 1, replace=False))
    return sets


def baselines(task, data):
    """What a trivial rule reaches under the task's own scoring."""
    if task == "retrieval":
        ngram = retrieval_scores(ngram_features([e["text"] for e in data["eval"]]),
                                 ngram_features([e["next"] for e in data["eval"]]), data["candidates"])
        harmonic = sum(1 / k for k in range(1, CANDIDATES + 1)) / CANDIDATES
        return {"chance": {"recall@1": 1 / CANDIDATES, "mrr": harmonic}, "character n-gram cosine": ngram}
    y_train = np.array([e["label"] for e in data["train"]])
    y_eval = np.array([e["label"] for e in data["eval"]])
    majority = np.bincount(y_train, minlength=len(data["classes"])).argmax()
    predicted = tuned_logistic_regression(ngram_features([e["text"] for e in data["train"]]), y_train,
                                          ngram_features([e["text"] for e in data["eval"]]), len(data["classes"]))
    return {"majority class": classification_scores(np.full_like(y_eval, majority), y_eval, len(data["classes"])),
            "character n-gram logistic regression": classification_scores(predicted, y_eval, len(data["classes"]))}


def classification_scores(predicted, truth, num_classes):
    """Accuracy, and balanced accuracy (the mean of per-class recalls): the fair score when the evaluation
    examples' classes are not balanced, or not distributed as the training examples' (the speaker task's
    evaluation chunks hold more of some plays). Always answering one class gets 1 / num_classes."""
    predicted, truth = np.asarray(predicted), np.asarray(truth)
    recalls = [(predicted[truth == c] == c).mean() for c in range(num_classes) if (truth == c).any()]
    return {"accuracy": float((predicted == truth).mean()), "balanced accuracy": float(np.mean(recalls))}
