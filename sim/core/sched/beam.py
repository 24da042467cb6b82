"""Beam search (``beam_width`` k > 1) on the paged manager: a request's k beams decode in lockstep like
parallel samples (prefilled once, then forked: ``kv_cache.fork``), and after every decode step they
become the beams a real beam search keeps: the request follows a record of one
(``sim/beam_lineage.py``: a trigram model's beam search of k beams, ``Core.beam_parents``), in
which each new beam continues one of the step's beams. A beam no new beam continues dies and lets
its blocks go; one continued by several is forked for each after the first (vLLM 0.4.2 forks a
parent for every selected child but one, which continues it, and frees the unselected:
``engine/output_processor/single_step.py``, ``_process_sequence_group_outputs``), so the beams'
shared prefix grows, and stays apart, as a beam search's does. No draw, no fitted constant.

Which record a request follows: the ``i mod RECORDS``-th of its width's (``Core.beam_row``). A
record covers ``config[BEAM_STEPS]`` steps; a request decoding longer follows its second half
again, round and round (:func:`record_step`).
"""

from __future__ import annotations

from pagesim.sim.core.kv import kv_cache
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import FREE_EPOCH, NUM_RUNNING
from pagesim.sim.core.state import section

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    BEAM_SEARCH         1: some request has beams (sim/core/sched/beam.py)
    BEAM_STEPS          the steps of each lineage record (Core.beam_parents' rows per record)
""")


@njit(inline=True)
def searching(config):
    """The runs where some request has beams: the only ones whose beams follow a record, and so
    the only ones that compile :func:`follow_record` (``njit``'s lazy)."""
    return config[BEAM_SEARCH] > 0


@njit(inline=True)
def record_step(steps, t):
    """The record's row for decode step ``t`` of a record of ``steps``: ``t`` itself, and past
    the record its second half again (its steady state, not its first steps, where every beam
    is still a child of the prompt)."""
    if t < steps:
        return t
    half = max(steps // 2, 1)
    return steps - half + (t - steps) % half


@njit(inline=True)
def advance(s):
    """After a decode step (its finished requests gone): every running request whose beams have
    forked follows its record one step."""
    for k in range(s.count[NUM_RUNNING]):
        i = s.running[k]
        if s.beam[i] > 1 and s.num_seqs[i] > 1:
            follow_record(s, i)


@njit(inline=True)
def first_child(parents, w, q):
    """The first of the ``w`` new beams whose parent is beam ``q`` (``w``: none)."""
    j = 0
    while j < w and parents[j] != q:
        j += 1
    return j


@njit(lazy=searching)
def follow_record(s, i: int) -> None:
    """Request ``i`` decoded its token ``g`` (``num_generated``, counting the prefill's): its beams
    become those after step ``g - 1`` of its record, whose row ``g - 2`` names each new beam's
    parent among them. The beams no new beam continues let their blocks go, in their order; each
    parent's first child is its sequence, moved to the child's place; then each other child, in
    order, is a fork of its parent's first (``kv_cache.fork_seq``). Its sequences are then the
    record's new beams in the record's order (the next row's indices); their count does not
    change. In place (the core allocates nothing): a sequence's slot once at its new place is
    held there as ``-(slot + 2)`` until every one has moved."""
    t = s.num_generated[i] - 2
    if t < 0:
        return
    w = s.num_seqs[i]
    parents = s.beam_parents[s.beam_row[i] + record_step(s.config[BEAM_STEPS], t)]
    moves = False
    for j in range(w):
        moves = moves or parents[j] != j
    if not moves:
        return
    deaths = 0
    for q in range(w):  # the dead let go, in order (their place then holds -1)
        if first_child(parents, w, q) == w:
            kv_cache.release_seq(s, i, q)
            deaths += 1
    for q in range(w):  # each survivor's sequence to its first child's place, a chain at a time
        slot = s.seq_slot[i, q]
        if slot < 0:  # dead, or moved here already
            continue
        s.seq_slot[i, q] = -1
        at = q
        while slot >= 0:  # a survivor's sequence displaced by this one moves on in turn
            to = first_child(parents, w, at)
            slot, s.seq_slot[i, to] = s.seq_slot[i, to], -slot - 2
            at = to
    for j in range(w):
        if s.seq_slot[i, j] < -1:
            s.seq_slot[i, j] = -s.seq_slot[i, j] - 2
    for j in range(w):  # the other children: forks of their parent's first
        first = first_child(parents, w, parents[j])
        if first != j:
            kv_cache.fork_seq(s, i, first, j)
    if deaths:
        s.count[FREE_EPOCH] += 1  # a waiting head blocked on memory may fit now
