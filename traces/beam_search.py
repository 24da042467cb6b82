"""A real beam search, run on CPU, whose lineage (which beam each surviving beam descends from,
step by step) is the record the simulator's beam model (``sim/core/sched/beam.py``) is fitted to.

The language model is an interpolated Kneser-Ney trigram model (discount 0.75) over words and
punctuation, trained on a text that ships with CPython itself (``pydoc_data.topics``, the
Python documentation's topics: no download). Beam search is the standard one: from a prompt,
the first step keeps the ``width`` best tokens (every beam a child of the prompt); each later
step scores every beam's every continuation by its cumulative log-probability and keeps the
``width`` best, ties broken by beam, then token (deterministic). Lengths are fixed by the trace
as the simulator's are (no end-of-sequence token stops a beam).

The record: ``parents[t, j]`` is the index, among the beams after step ``t``, of the beam that
beam ``j`` after step ``t + 1`` continues. A beam none continues dies; one continued by several
forks. What matters for memory is how much of their sequences the beams share: the depth of
their common ancestors, and the KV blocks they hold under vLLM's copy-on-write forks
(:func:`physical_blocks`).
"""

from __future__ import annotations

import re
from collections import defaultdict
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
    sequences at the end, ``(width, output_tokens)``."""

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


def beam_search(model: TrigramModel, prompt: Sequence[int], width: int, output_tokens: int) -> BeamRecord:
    """Beam search of ``width`` beams generating ``output_tokens`` tokens after ``prompt``
    (at least two token ids, the trigram's context)."""
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
    for t in range(1, output_tokens):
        cand = np.concatenate([scores[j] + np.log(model.probs(seqs[j][-2], seqs[j][-1])) for j in range(len(seqs))])
        best = top(cand, width)
        parent, word = best // size, best % size
        parents[t - 1] = parent
        history = history[parent]
        history[:, t] = word
        seqs = [[seqs[p][-1], int(w)] for p, w in zip(parent.tolist(), word.tolist())]
        scores = cand[best]
    return BeamRecord(len(prompt), output_tokens, len(first), parents, history)


# ----------------------------------------------------------------------------------------- what a record says

def deaths(parents: np.ndarray) -> np.ndarray:
    """Per step, how many beams no beam of the next step continues."""
    width = parents.shape[1]
    return np.array([width - np.unique(row).size for row in parents], dtype=np.int64)


def distinct_ancestors(parents: np.ndarray):
    """For each step ``t`` (from 0, the first generated token), ``counts``: ``counts[i]`` is how
    many distinct beams after step ``i`` the beams after step ``t`` descend from (``i <= t``).
    Going back, once they have one common ancestor every earlier count is 1."""
    width = parents.shape[1]
    for t in range(parents.shape[0] + 1):
        counts = np.ones(t + 1, dtype=np.int64)
        line = np.arange(width)
        for i in range(t, -1, -1):
            counts[i] = np.unique(line).size
            if counts[i] == 1:
                break
            if i:
                line = parents[i - 1][line]
        yield t, counts


def shared_prefix(parents: np.ndarray) -> np.ndarray:
    """Per step ``t``, how many generated tokens all beams after step ``t`` have in common
    (their common ancestor's depth: 0 when they differ from the first generated token)."""
    out = np.zeros(parents.shape[0] + 1, dtype=np.int64)
    for t, counts in distinct_ancestors(parents):
        out[t] = int(np.argmax(counts > 1)) if (counts > 1).any() else t + 1
    return out


def lineages_by_lag(parents: np.ndarray, lags: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(sum, count) over the steps ``t >= lag`` of how many distinct ancestors the beams after
    step ``t`` have ``lag`` steps back, per lag: 1 = one common ancestor, the width = none shared."""
    total, count = np.zeros(len(lags)), np.zeros(len(lags), dtype=np.int64)
    for t, counts in distinct_ancestors(parents):
        for n, lag in enumerate(lags):
            if lag <= t:
                total[n] += counts[t - lag]
                count[n] += 1
    return total, count


def physical_blocks(parents: np.ndarray, prompt_tokens: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(physical, logical) KV blocks per step of a beam family with this lineage, under vLLM's
    copy-on-write forks (``vllm/core/block_manager_v1.py``: a fork shares every block of its parent;
    a sequence writing into a block others share copies it first). A full block is never
    written again, so it stays shared by all beams descending from the beam that filled it; the
    block being filled is copied apart at the first write after a fork. So block ``b`` has as many
    copies as the beams have distinct ancestors at the block's last written token; the prompt's
    tokens are one ancestor. Step ``t`` counts ``prompt_tokens + t + 1`` tokens per beam."""
    width = parents.shape[1]
    physical = np.zeros(parents.shape[0] + 1, dtype=np.int64)
    logical = np.zeros_like(physical)
    for t, counts in distinct_ancestors(parents):
        length = prompt_tokens + t + 1
        ends = np.minimum(np.arange(1, -(-length // block_size) + 1) * block_size, length) - 1 - prompt_tokens
        logical[t] = width * ends.size
        physical[t] = int(np.where(ends < 0, 1, counts[np.maximum(ends, 0)]).sum())
    return physical, logical


def death_rate_to_churn(rate: float, width: int) -> float:
    """The churn probability p of ``sim/core/sched/beam.py`` whose expected share of beams dying per
    step is ``rate``: each beam dies with probability p, one lives if all would, so
    E[deaths] / width = p - p**width / width; solved by bisection (increasing in p on [0, 1])."""
    if width < 2:
        return 0.0
    top_rate = 1 - 1 / width
    if rate >= top_rate:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid - mid ** width / width < rate else (lo, mid)
    return (lo + hi) / 2


# ----------------------------------------------------------------------------------------- a study

class Study(NamedTuple):
    """Beam searches from prompts drawn from a corpus, at one width, with the statistics the
    simulator's model is fitted to."""

    width: int
    records: list
    death_rate: float  # share of beams that die per step, over all steps of all records
    death_rate_by_step: np.ndarray  # rows: step bins (:data:`STEP_BINS`), the share of beams dying
    churn: float  # death_rate_to_churn(death_rate, width)
    shared_prefix_fraction: float  # mean over steps of shared generated tokens / generated tokens
    shared_prefix_quantiles: np.ndarray  # 10/50/90 % of the steps' shared / generated tokens
    block_saving: float  # 1 - physical / logical blocks, summed over every step of every record
    lineages_by_lag: np.ndarray  # per lag of :data:`LAGS`: mean distinct ancestors that many steps back


#: the lags of ``Study.lineages_by_lag``
LAGS = (1, 2, 4, 8, 16, 32)
#: the step bins of ``Study.death_rate_by_step``: [lo, hi) generated tokens
STEP_BINS = ((1, 4), (4, 16), (16, 64), (64, 256), (256, 10 ** 9))


def draw_requests(model: TrigramModel, corpus_ids: Sequence[int], prompt_lengths: Sequence[int],
                  output_lengths: Sequence[int], rng: np.random.Generator) -> list[tuple[list[int], int]]:
    """(prompt, output length) pairs: each prompt a stretch of the corpus of the given length
    (at least 2 tokens), starting at a random place."""
    out = []
    for p, o in zip(prompt_lengths, output_lengths):
        p = max(int(p), 2)
        start = int(rng.integers(0, len(corpus_ids) - p))
        out.append((list(corpus_ids[start:start + p]), int(o)))
    return out


def study(model: TrigramModel, requests: Sequence[tuple[list[int], int]], width: int,
          block_size: int = 16) -> Study:
    """Beam search of ``width`` from every request; the record's statistics."""
    records = [beam_search(model, prompt, width, out) for prompt, out in requests]
    died = np.concatenate([deaths(r.parents) for r in records] or [np.zeros(0, dtype=np.int64)])
    steps = np.concatenate([np.arange(1, r.output_tokens) for r in records] or [np.zeros(0, dtype=np.int64)])
    by_step = np.array([died[(steps >= lo) & (steps < hi)].sum() / max(width * ((steps >= lo) & (steps < hi)).sum(), 1)
                        if ((steps >= lo) & (steps < hi)).any() else np.nan for lo, hi in STEP_BINS])
    rate = died.sum() / max(width * died.size, 1)
    fractions = np.concatenate([shared_prefix(r.parents) / np.arange(1, r.output_tokens + 1) for r in records])
    blocks = np.array([[b.sum() for b in physical_blocks(r.parents, r.prompt_tokens, block_size)] for r in records])
    phys, logi = (int(x) for x in blocks.sum(axis=0))
    by_lag = [lineages_by_lag(r.parents, LAGS) for r in records]
    lag_total, lag_count = (np.sum([x[n] for x in by_lag], axis=0) for n in (0, 1))
    return Study(width, records, float(rate), by_step, death_rate_to_churn(float(rate), width),
                 float(fractions.mean()), np.quantile(fractions, [0.1, 0.5, 0.9]),
                 1 - phys / logi if logi else 0.0, np.where(lag_count > 0, lag_total / np.maximum(lag_count, 1), np.nan))
