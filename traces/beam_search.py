"""What a real beam search's lineage says (``pagesim trace beam-search``): the search and its
record are ``sim/beam_lineage.py``'s, the record the simulator's beams follow
(``sim/core/sched/beam.py``); here, from prompts of a workload's lengths, how many beams die per
step, how much of their sequences the beams share (the depth of their common ancestors), and the
KV blocks they hold under vLLM's copy-on-write forks (:func:`physical_blocks`), counted from the
record alone: the core's own count, step by step, is checked against it
(``tests/sim/core/test_beam.py``).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from pagesim.sim.beam_lineage import (BeamRecord, TrigramModel, beam_search, builtin_corpus,  # noqa: F401
                                      tokenize, top)

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


# ----------------------------------------------------------------------------------------- a study

class Study(NamedTuple):
    """Beam searches from prompts drawn from a corpus, at one width, and their statistics."""

    width: int
    records: list
    death_rate: float  # share of beams that die per step, over all steps of all records
    death_rate_by_step: np.ndarray  # rows: step bins (:data:`STEP_BINS`), the share of beams dying
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
    return Study(width, records, float(rate), by_step, float(fractions.mean()), np.quantile(fractions, [0.1, 0.5, 0.9]),
                 1 - phys / logi if logi else 0.0, np.where(lag_count > 0, lag_total / np.maximum(lag_count, 1), np.nan))
