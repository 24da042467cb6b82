"""Beam search (``beam_width`` k > 1) on the paged manager: a request's k beams decode in lockstep like parallel
samples (prefilled once, then forked: ``kv_cache.fork``), and after every decode step each beam
dies with probability ``clock[BEAM_CHURN]`` (:data:`BEAM_CHURN_PROBABILITY`) and is replaced by a fork of a surviving beam, so
that the beams' shared prefix grows as real beam search's does.

The draws come from the run's seeded numpy ``Generator`` (``Core.rng``), in this order: per forked beam request,
in the running order, k uniforms (one per beam, in its sequences' order); if all k die, one
integer below k picks the one that lives; then one integer below the number of survivors per
dead beam picks the parent it is replaced by.
"""

from __future__ import annotations

from pagesim.sim.core.kv import kv_cache
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.rng import below
from pagesim.sim.core.state import FREE_EPOCH, NUM_RUNNING
from pagesim.sim.core.state import section

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    BEAM_SEARCH         1: some request has beams (sim/core/sched/beam.py)
""")

# Core.clock: this file's entries, in its room of the shared table (sim/core/state.py)
section("clock", globals(), """
    BEAM_CHURN          beam search: the chance that a beam dies at a decode step
""")


#: the model's one constant: the chance that a beam dies at a decode step and is replaced by a
#: fork of a surviving beam, so that a beam family's shared prefix grows as real beam search's does.
#: Measured (``pagesim trace beam-search``, traces/beam_search.py: a Kneser-Ney trigram model's beam
#: search, 400 Alpaca-length and 60 ShareGPT-length requests, seed 0): the share of beams no beam
#: of the next step continues is 0.30 / 0.35 / 0.37 (Alpaca) and 0.32 / 0.39 / 0.40 (ShareGPT) at
#: widths 2 / 4 / 6, which this model's p - p**k / k matches at p = 0.37 / 0.36 / 0.37 and
#: 0.40 / 0.40 / 0.40, flat over the steps: one p, their mean. What it misses: real beam families
#: keep 1.3-1.6 distinct lineages however far back (widths 4 and 6) where this model's coalesce
#: into one within ~10 steps, so at widths 4 and 6 it shares 2-10 pp more blocks than the
#: record; at 0.25 (the guess it replaces) as much (its saving barely moves with p).
BEAM_CHURN_PROBABILITY = 0.38


def set_churn(s, probability: float) -> None:
    """Make the chance that a beam dies at a decode step ``probability`` for the run of state
    ``s``, in place of :data:`BEAM_CHURN_PROBABILITY` (traces/beam_fit.py fits it so)."""
    s.clock[BEAM_CHURN] = probability


@njit(inline=True)
def searching(config):
    """The runs where some request has beams: the only ones whose beams churn, and so the only
    ones that compile :func:`churn_beams` (``njit``'s lazy)."""
    return config[BEAM_SEARCH] > 0


@njit(inline=True)
def churn(s):
    """After a decode step (its finished requests gone): every running request whose beams
    have forked churns them ."""
    for k in range(s.count[NUM_RUNNING]):
        i = s.running[k]
        if s.beam[i] > 1 and s.num_seqs[i] > 1:
            churn_beams(s, i)


@njit(lazy=searching)
def churn_beams(s, i: int) -> None:
    """Request ``i``'s beams: each dies with probability ``clock[BEAM_CHURN]``, one at random
    lives if none would; the dead let their blocks go, and each is replaced by a fork of a
    survivor drawn at random. Its sequences are then the survivors, in their order, followed by
    the new forks in the order they were drawn. The count of sequences does not change."""
    w = s.num_seqs[i]
    p = s.clock[BEAM_CHURN]
    deaths = 0
    for j in range(w):  # a dying sequence's slot is marked -(slot + 1) until it is let go
        if s.rng.random() < p:
            s.seq_slot[i, j] = -s.seq_slot[i, j] - 1
            deaths += 1
    if deaths == w:
        j = below(s.rng, w)
        s.seq_slot[i, j] = -s.seq_slot[i, j] - 1
        deaths -= 1
    if deaths == 0:
        return
    s.count[FREE_EPOCH] += 1  # a waiting head blocked on memory may fit now
    alive = 0
    for j in range(w):  # the dead let go in order; the survivors move to the front
        slot = s.seq_slot[i, j]
        if slot < 0:
            s.seq_slot[i, j] = -slot - 1
            kv_cache.release_seq(s, i, j)
        else:
            s.seq_slot[i, alive] = slot
            alive += 1
    for k in range(deaths):
        kv_cache.fork_seq(s, i, below(s.rng, alive), alive + k)
