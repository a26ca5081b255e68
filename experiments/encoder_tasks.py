"""
The tasks of experiments/encoders.py and experiments/rerankers.py, made from the text (as experiments/tasks.py makes
finetune.py's): lines, documents decided by their last line (a flag naming their topic line), candidate sets
(encoders.py's hits@1), groups of near duplicates (rerankers.py's interaction task), windows whose label sits in
their second half, pairs of lines that agree or differ by one whole word, and lines that may hold a misspelt
word (experiments/fewlabels.py). Training examples come from the
training split, evaluation examples from the validation split, and none of these is read twice; the items a
fine-tuning rate is chosen on are held out of the training ones.
"""
import re

import numpy as np

from infra.configurator import UserError

FLAGS = "AB"  # a document's flag line: A = it is about its first line, B = about its second


def text_lines(text, count, length, rng, exclude=(), or_fewer=False):
    """`count` distinct fragments of `length` characters, newlines as spaces, from non-overlapping places of the
    text (overlapping ones would be near-duplicate queries); or_fewer: as many as there are, up to count."""
    places = rng.permutation(len(text) // length)
    lines, seen = [], set(exclude)
    for place in places:
        line = text[place * length:(place + 1) * length].replace("\n", " ")
        if line not in seen and line.strip():
            lines.append(line)
            seen.add(line)
            if len(lines) == count:
                return lines
    if or_fewer:
        return lines
    raise UserError(f"the text holds only {len(lines)} distinct lines of {length} characters, {count} wanted: "
                    f"use a longer text or a smaller scale")


def document(topic, distractor, topic_second, flag_at="end"):
    """Two lines and a flag line that says which of them the document is about."""
    first, second = (distractor, topic) if topic_second else (topic, distractor)
    flag = FLAGS[int(topic_second)]
    return f"{first}\n{second}\n{flag}" if flag_at == "end" else f"{flag}\n{first}\n{second}"


def documents(lines, rng, flag_at="end"):
    """Document i is about lines[i], with lines[i + 1] (cyclically) as its other line: every line is the topic of
    one document and the distractor of the one before it (document i - 1, query i's hard negative)."""
    n, sides = len(lines), rng.integers(0, 2, len(lines))
    return [document(lines[i], lines[(i + 1) % n], sides[i], flag_at) for i in range(n)]


def flagged_line(doc, flag_at="end"):
    """What a rule told the format reads: the line the flag names."""
    parts = doc.split("\n")
    first, second, flag = (parts[0], parts[1], parts[2]) if flag_at == "end" else (parts[1], parts[2], parts[0])
    return second if flag == FLAGS[1] else first


def candidate_sets(n, queries, size, rng):
    """For each of the first `queries` queries: its document, its hard negative, then size - 2 other documents."""
    sets = np.zeros((queries, size), dtype=np.int64)
    for i in range(queries):
        others = np.setdiff1d(np.arange(n), [i, (i - 1) % n])
        sets[i] = [i, (i - 1) % n] + list(rng.choice(others, size - 2, replace=False))
    return sets


def split_windows(text, count, half, rng):
    """The structural part's windows: `count` // 2 first halves, each twice, followed once by a second half that
    holds a capital letter (label 1) and once by one that does not (label 0): the label is decided by the second
    half alone. Returns (texts, labels), the two windows of a first half next to each other."""
    n, firsts, with_capital, without = count // 2, [], [], []
    for place in rng.permutation(len(text) // half):  # non-overlapping pieces, in random order
        piece = text[place * half:(place + 1) * half].replace("\n", " ")
        kind = firsts if len(firsts) < n else with_capital if any(c.isupper() for c in piece) else without
        if len(kind) < n:
            kind.append(piece)
        if len(without) == len(with_capital) == n:
            break
    else:
        raise UserError(f"the text has too few {half}-character pieces with and without a capital letter")
    texts, labels = [], []
    for k, first in enumerate(firsts):
        texts += [first + with_capital[k], first + without[k]]
        labels += [1, 0]
    return texts, np.array(labels)


def word_shape(word):
    """(length, case pattern): what a replacement word keeps, so that spelling statistics cannot tell."""
    return len(word), "upper" if word.isupper() else "title" if word[0].isupper() else "lower"


def agreement_examples(text, count, length, rng, exclude=()):
    """Two lines: a fragment and either the same fragment (label 1, agree) or the fragment with one whole word of
    three letters or more (not cut by the line's edges) replaced by a different word of the same length and case
    pattern from elsewhere in the text (0), alternately. exclude: lines neither line may be (another part's)."""
    words = {}
    for word in set(re.findall(r"[A-Za-z]{3,}", text)):
        words.setdefault(word_shape(word), []).append(word)
    words = {k: sorted(v) for k, v in words.items() if len(v) > 1}
    examples, labels = [], []
    for line in text_lines(text, 6 * count, length, rng, exclude, or_fewer=True):
        label = len(examples) % 2
        if label:
            examples.append(f"{line}\n{line}")
        else:
            spans = [m.span() for m in re.finditer(r"[A-Za-z]{3,}", line)
                     if 0 < m.start() and m.end() < len(line) and word_shape(m.group()) in words]
            if not spans:
                continue
            a, b = spans[int(rng.integers(len(spans)))]
            choices = [w for w in words[word_shape(line[a:b])] if w != line[a:b]]
            changed = f"{line[:a]}{choices[int(rng.integers(len(choices)))]}{line[b:]}"
            if changed in exclude:
                continue
            examples.append(f"{line}\n{changed}")
        labels.append(label)
        if len(examples) == count:
            return examples, np.array(labels)
    raise UserError(f"the text gave only {len(examples)} agreement examples, {count} wanted: use a longer text")


def make_tasks(texts, s, seed):
    """Every part's examples: training ones from the training split, evaluation ones from the validation split."""
    rng = np.random.default_rng(seed)
    train_lines = text_lines(texts["train"], s["train_lines"], s["line"], rng)
    eval_lines = text_lines(texts["val"], s["eval_lines"], s["line"], rng, exclude=train_lines)
    task = {"train_lines": train_lines, "eval_lines": eval_lines, "docs": documents(eval_lines, rng),
            "first_seed": seed}
    task["docs_flag_first"] = [f"{d[-1]}\n{d[:-2]}" for d in task["docs"]]  # the same documents, flag first
    task["candidate_sets"] = candidate_sets(len(eval_lines), s["rerank_queries"], s["candidates"], rng)
    task["train"], task["train_labels"] = split_windows(texts["train"], s["probe_windows"], s["half"], rng)
    task["eval"], task["eval_labels"] = split_windows(texts["val"], s["probe_windows"], s["half"], rng)
    task["judge_train"], task["judge_train_labels"] = agreement_examples(texts["train"], s["judge_examples"],
                                                                         s["judge_line"], rng)
    seen = {line for t in task["judge_train"] for line in t.split("\n")}  # no evaluation line among the training ones
    task["judge_eval"], task["judge_eval_labels"] = agreement_examples(texts["val"], s["judge_examples"] // 3,
                                                                       s["judge_line"], rng, exclude=seen)
    # The tuning items each fine-tuning rate is chosen on: held out of the training ones (never evaluation
    # items), split off last so that the evaluation items stay those the seed drew before.
    n, m = s["tune_lines"], s["judge_tune"]
    if not (0 < n < len(train_lines) and 0 < m < len(task["judge_train"]) and s["tune_queries"] <= n):
        raise UserError(f"the scale's tuning sizes ({n} lines, {s['tune_queries']} queries, {m} agreement "
                        f"examples) must be positive and smaller than its training sets")
    task["train_lines"], task["tune_lines"] = train_lines[:-n], train_lines[-n:]
    task["tune_docs"] = documents(task["tune_lines"], rng)
    task["tune_docs_flag_first"] = [f"{d[-1]}\n{d[:-2]}" for d in task["tune_docs"]]
    task["tune_sets"] = candidate_sets(n, s["tune_queries"], s["candidates"], rng)
    for key in ("judge_train", "judge_train_labels"):
        task[key], task[key.replace("train", "tune")] = task[key][:-m], task[key][-m:]
    return task


def near_duplicates(text, groups, size, length, fragment, rng, exclude=()):
    """The reranking task built for interaction: `groups` groups of `size` near-duplicate documents, each a line of
    `length` characters with one letter changed (to another of the same case), at a different place in each
    document of a group; document j's query is a `fragment`-character piece of it that holds its changed letter.
    Every document of the group holds the query's other characters in the same places, so the one character the
    query names decides: a reader that squeezed the document into a vector before it saw the query must have kept
    every character's place. Returns (documents, queries, group of each document)."""
    docs, queries, group_of = [], [], []
    for g, line in enumerate(text_lines(text, groups, length, rng, exclude)):
        letters = [i for i, ch in enumerate(line) if ch.isalpha()]
        if len(letters) < size:
            raise UserError(f"a line of {length} characters holds fewer than {size} letters: use longer lines")
        for place in rng.choice(letters, size, replace=False):
            pool = "abcdefghijklmnopqrstuvwxyz" if line[place].islower() else "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
            new = rng.choice([ch for ch in pool if ch != line[place]])
            doc = line[:place] + new + line[place + 1:]
            start = int(rng.integers(max(0, place - fragment + 1), min(place, length - fragment) + 1))
            docs.append(doc)
            queries.append(doc[start:start + fragment])
            group_of.append(g)
    return docs, queries, np.array(group_of)


def misspelt_lines(text, count, length, rng, words, exclude=()):
    """`count` lines of `length` characters, alternately as written (label 0) and with one misspelling (1): two
    neighbouring letters inside a whole word of four letters or more (not cut by the line's edges) swapped, where
    the result is no word of `words` (a set: the training text's). Both kinds hold the same letters, the same
    words' lengths and the same spaces; what tells them apart is knowing how the text's words are spelt. Returns
    (lines, labels)."""
    lines, labels = [], []
    for line in text_lines(text, 4 * count, length, rng, exclude, or_fewer=True):
        label = len(lines) % 2
        if label:
            misspelt = []
            for match in whole_words(line):
                word = match.group()
                for i in range(1, len(word) - 2):  # (the first and last letters kept, as in a typical typo)
                    swapped = word[:i] + word[i + 1] + word[i] + word[i + 2:]
                    if swapped != word and swapped not in words:
                        misspelt.append(line[:match.start()] + swapped + line[match.end():])
            if not misspelt:
                continue
            line = misspelt[int(rng.integers(len(misspelt)))]
        lines.append(line)
        labels.append(label)
        if len(lines) == count:
            return lines, np.array(labels)
    raise UserError(f"the text gave only {len(lines)} lines for the misspelling task, {count} wanted: use a longer "
                    f"text or a smaller scale")


def whole_words(line):
    """The words of four letters or more of a line that its edges do not cut (regex matches): those a misspelling
    may change, and those the rule told the task checks."""
    return [m for m in re.finditer(r"[A-Za-z]{4,}", line) if 0 < m.start() and m.end() < len(line)]


def words_of(text):
    """The set of words (runs of letters) of a text."""
    return set(re.findall(r"[A-Za-z]+", text))
