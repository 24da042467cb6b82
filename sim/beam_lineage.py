"""Beam search's lineage, as a real beam search makes it: the record the core replays for every
request with beams (``sim/core/sched/beam.py``), so that which beams die and which fork, and so
how much of their sequences the beams share, is a beam search's own rather than a fitted model's.

The language model is an interpolated Kneser-Ney trigram model (discount 0.75) over words and
punctuation, trained on a text that ships with CPython itself (``pydoc_data.topics``, the
Python documentation's topics: no download). Beam search is the standard one: from a prompt,
the first step keeps the ``width`` best tokens (every beam a child of the prompt); each later
step scores every beam's every continuation by its cumulative log-probability and keeps the
``width`` best, ties broken by beam, then token (deterministic). Lengths are fixed by the trace
as the simulator's are (no end-of-sequence token stops a beam), so the first ``T`` steps of a
longer search are the search of ``T`` steps: one long record serves every shorter request.

The record: ``parents[t, j]`` is the index, among the beams after step ``t``, of the beam that
beam ``j`` after step ``t + 1`` continues (step 0: the first generated token, the prefill's). A
beam none continues dies; one continued by several forks. What the records say about sharing
is ``traces/beam_search.py``'s (``pagesim trace beam-search``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from functools import lru_cache
from typing import NamedTuple, Sequence

import numpy as np

#: Kneser-Ney's absolute discount at every order
DISCOUNT = 0.75
#: a word, a number or one mark of prose punctuation (the docs' markup and code symbols are left out:
#: runs of them, "* * *", trap a trigram model in loops)
TOKEN = re.compile(r"[A-Za-z_]+|\d+|[.,;:?!()\x27\x22]")


def builtin_corpus() -> str:
    """The Python documentation's topics (``pydoc_data.topics``, part of CPython), in key order."""
    from pydoc_data.topics import topics
    return "\n".join(topics[k] for k in sorted(topics))


def tokenize(text: str) -> list[str]:
    return TOKEN.findall(text)


class TrigramModel:
    """Interpolated Kneser-Ney trigram model over the tokens it was trained on.

    P3(w | u v) = max(c(u v w) - d, 0) / c(u v .) + d T3(u v) / c(u v .) P2(w | v)
    P2(w | v)   = max(N(. v w) - d, 0) / N(. v .) + d T2(v) / N(. v .) P1(w)
    P1(w)       = max(N(. w) - d, 0) / N(. .) + d T1 / N(. .) / V
    with c raw counts, N(. x) the number of distinct tokens seen before x, T the number of
    distinct tokens seen after the context; a context never seen falls to the order below.
    """

    def __init__(self, tokens: Sequence[str], discount: float = DISCOUNT):
        if len(tokens) < 3:
            raise ValueError(f"a trigram model needs at least 3 tokens, got {len(tokens)}")
        self.vocab = sorted(set(tokens))
        self.index = {w: i for i, w in enumerate(self.vocab)}
        ids = np.array([self.index[w] for w in tokens], dtype=np.int64)
        d = discount
        size = len(self.vocab)
        bigrams = set(zip(ids[:-1].tolist(), ids[1:].tolist()))
        trigrams: dict[tuple[int, int], dict[int, int]] = defaultdict(lambda: defaultdict(int))
        for u, v, w in zip(ids[:-2].tolist(), ids[1:-1].tolist(), ids[2:].tolist()):
            trigrams[(u, v)][w] += 1
        # continuation counts: N(. w) over bigram types, N(. v w) over trigram types
        before = np.bincount(np.array([w for _, w in bigrams]), minlength=size).astype(np.float64)
        total = before.sum()
        self.unigram = (np.maximum(before - d, 0) + d * np.count_nonzero(before) / size) / total
        middle: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        for (u, v), follow in trigrams.items():
            for w in follow:
                middle[v][w] += 1
        self.bigram = {v: self._level(follow, d) for v, follow in middle.items()}
        self.trigram = {uv: self._level(follow, d) for uv, follow in trigrams.items()}

    @staticmethod
    def _level(follow: dict[int, int], d: float) -> tuple[np.ndarray, np.ndarray, float]:
        """(token ids, their discounted share, the weight left to the order below)."""
        words = np.array(sorted(follow), dtype=np.int64)
        counts = np.array([follow[w] for w in words.tolist()], dtype=np.float64)
        total = counts.sum()
        return words, np.maximum(counts - d, 0) / total, d * words.size / total

    def ids(self, words: Sequence[str]) -> list[int]:
        return [self.index[w] for w in words]

    def probs(self, u: int, v: int) -> np.ndarray:
        """P(w | u v) for every token w (sums to 1)."""
        p = self.unigram.copy()
        for level in (self.bigram.get(v), self.trigram.get((u, v))):
            if level is not None:
                words, share, rest = level
                p *= rest
                p[words] += share
        return p


class BeamRecord(NamedTuple):
    """One beam search: ``prompt_tokens`` long, ``output_tokens`` generated per beam;
    ``parents`` is ``(output_tokens - 1, width)`` (module docstring); ``tokens`` the beams'
    sequences at the end, ``(width, output_tokens)`` (None where not kept)."""

    prompt_tokens: int
    output_tokens: int
    width: int
    parents: np.ndarray
    tokens: np.ndarray


def top(scores: np.ndarray, width: int) -> np.ndarray:
    """The flat indices of the ``width`` highest scores, best first, ties to the lower index."""
    width = min(width, scores.size)
    threshold = np.partition(scores, scores.size - width)[scores.size - width]
    candidates = np.flatnonzero(scores >= threshold)  # ascending: ties keep the lower index
    return candidates[np.argsort(-scores[candidates], kind="stable")[:width]]


def beam_search(model: TrigramModel, prompt: Sequence[int], width: int, output_tokens: int,
                keep_tokens: bool = True) -> BeamRecord:
    """Beam search of ``width`` beams generating ``output_tokens`` tokens after ``prompt``
    (at least two token ids, the trigram's context); ``keep_tokens`` off: the lineage alone (the
    beams' sequences, copied at every step, are not kept)."""
    if width < 1 or output_tokens < 1 or len(prompt) < 2:
        raise ValueError(f"beam search needs width >= 1, output_tokens >= 1 and a prompt of >= 2 tokens; got "
                         f"width={width}, output_tokens={output_tokens}, prompt of {len(prompt)}")
    size = len(model.vocab)
    start = np.log(model.probs(prompt[-2], prompt[-1]))
    first = top(start, width)
    scores = start[first]
    seqs = [[prompt[-1], int(w)] for w in first]  # each beam's last two tokens, then what it generated
    history = np.zeros((len(first), output_tokens), dtype=np.int64)
    history[:, 0] = first
    parents = np.zeros((output_tokens - 1, len(first)), dtype=np.int64)
    # Each beam's own best ``width`` continuations hold every one of its continuations that can be
    # among the step's best ``width`` (one that ``width`` others of its own beam outscore cannot),
    # so only those are scored, ties to the lower token as among all; a context's are found once
    # (beams revisit contexts)
    best_of: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def continuations(u: int, v: int) -> tuple[np.ndarray, np.ndarray]:
        if (u, v) not in best_of:
            log_p = np.log(model.probs(u, v))
            words = top(log_p, width)
            best_of[(u, v)] = words, log_p[words]
        return best_of[(u, v)]

    for t in range(1, output_tokens):
        found = [continuations(seqs[j][-2], seqs[j][-1]) for j in range(len(seqs))]
        flat = np.concatenate([j * size + words for j, (words, _) in enumerate(found)])
        cand = np.concatenate([scores[j] + log_p for j, (_, log_p) in enumerate(found)])
        pick = np.lexsort((flat, -cand))[:width]  # best first, ties to the lower (beam, token)
        parent, word = flat[pick] // size, flat[pick] % size
        parents[t - 1] = parent
        if keep_tokens:
            history = history[parent]
            history[:, t] = word
        seqs = [[seqs[p][-1], int(w)] for p, w in zip(parent.tolist(), word.tolist())]
        scores = cand[pick]
    return BeamRecord(len(prompt), output_tokens, len(first), parents, history if keep_tokens else None)


#: the library's records per width (request ``i`` follows record ``i mod RECORDS`` of its width:
#: ``sim/core/build.py``'s ``beam_arrays``)
RECORDS = 16
#: each record's generated tokens: its steps of lineage are one fewer
RECORD_TOKENS = 1024
#: the prompt each record's search starts from: this many tokens of the corpus at a seeded place
#: (the trigram reads its last two)
RECORD_PROMPT_TOKENS = 16


@lru_cache(maxsize=1)
def builtin_model() -> tuple[TrigramModel, list[int]]:
    """The trigram model of :func:`builtin_corpus`, and the corpus as its token ids."""
    words = tokenize(builtin_corpus())
    model = TrigramModel(words)
    return model, model.ids(words)


@lru_cache(maxsize=None)
def lineage_library(width: int, records: int = RECORDS, tokens: int = RECORD_TOKENS) -> np.ndarray:
    """``records`` beam searches of ``width`` beams and ``tokens`` generated tokens each, from
    prompts drawn from the corpus (a Generator seeded by the width): their ``parents``, int16,
    ``(records, tokens - 1, width)``. Deterministic; built once a process."""
    if not 2 <= width <= np.iinfo(np.int16).max:
        raise ValueError(f"a lineage library is for 2 to 32767 beams, not {width}")
    model, ids = builtin_model()
    rng = np.random.default_rng(width)
    out = np.empty((records, tokens - 1, width), np.int16)
    for r in range(records):
        at = int(rng.integers(0, len(ids) - RECORD_PROMPT_TOKENS))
        out[r] = beam_search(model, ids[at:at + RECORD_PROMPT_TOKENS], width, tokens, keep_tokens=False).parents
    return out
