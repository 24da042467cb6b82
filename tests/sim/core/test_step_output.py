"""The core with an executor outside it (config[EXTERNAL_STEPS], the GPU mode's contract): the
loop returns ``SCHEDULED`` after scheduling each iteration, the executor reads the step from
the arrays (copy-on-write pairs, device blocks swapped out and in, the requests the last step
finished) and hands back its duration, which the loop's clock takes. Worked by hand on pools
of 4 blocks of 4 tokens (the free stack hands out its top: blocks 3, 2, 1, 0 from a fresh
pool, and a freed request's blocks are pushed in table order)."""

from __future__ import annotations

import pandas as pd
import pytest

from pagesim.sim.core import state
from pagesim.sim.core.events import loop
from pagesim.sim.core.price.cost import kernel_read_tokens
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.errors import InvariantError
from pagesim.sim.run import initial_state, run_simulation
from tests.sim.helpers import cfg_for, rand_trace
from pagesim.sim.core.sched.scheduler_vllm import KERNEL_BLOCK


class Recorder:
    """An external executor (``sim.executor.is_external``) that keeps each step's contract and
    takes ``dt`` seconds per step, or (``dt=None``) what the core's own cost model prices it
    (``priced_as``: a core of the same configuration, whose cost arrays price the step)."""

    def __init__(self, dt=1.0, priced_as=None):
        self.dt = dt
        self.cost = (priced_as.cost, priced_as.cost_data) if priced_as is not None else None
        self.steps = []
        self.finished_at_end = None

    def start(self, core):
        assert core.config[state.EXTERNAL_STEPS] == 1
        self.core = core

    def step(self, core):
        c = core.count
        self.steps.append(dict(
            copies=core.step_copies[:c[state.STEP_COPIED_BLOCKS]].tolist(),
            swap_out=core.step_swap_out[:c[state.STEP_SWAP_OUT_BLOCKS]].tolist(),
            swap_in=core.step_swap_in[:c[state.STEP_SWAP_IN_BLOCKS]].tolist(),
            finished=core.step_finished[:c[state.STEP_NUM_FINISHED]].tolist(),
            swap_tokens=(int(c[state.STEP_SWAP_OUT]), int(c[state.STEP_SWAP_IN])),
            early=int(c[state.STEP_SWAP_OUT_EARLY]),
            now=float(core.clock[state.NOW])))
        if self.dt is not None:
            return self.dt
        # the simulated price of the same step: the loop's own function, its decode context sum
        # from the arrays as the executor sees them
        running = core.running[:c[state.NUM_RUNNING]]
        decoding = running[core.in_decode[running] != 0] if c[state.STEP_DECODE_SEQS] else running[:0]
        read = interpreted(kernel_read_tokens)(core.num_computed_tokens[decoding], core.config[KERNEL_BLOCK])
        context_sum = int((read * core.num_seqs[decoding]).sum())
        cost, cost_data = self.cost
        return loop.step_time(core._replace(cost=cost, cost_data=cost_data), context_sum,
                              core.config[state.FAMILY_TRAITS])

    def finish(self, core):
        self.finished_at_end = core.step_finished[:core.count[state.STEP_NUM_FINISHED]].tolist()


def tiny(rows, **kw):
    trace = pd.DataFrame(rows, columns=["arrival_s", "prompt_tokens", "output_tokens", "n"])
    trace.insert(0, "request_id", [f"r{i}" for i in range(len(trace))])
    return trace, cfg_for(slots=16, block_size=4, max_seq_len=16, watermark=0.0, **kw)


def test_copy_on_write_at_a_forks_first_decode():
    """A (6 prompt tokens, 2 output tokens, n = 2) prefills into blocks 3 (4 tokens) and 2 (2
    tokens), then forks: both sequences share 2 as their tail. At the first decode, sequence 0
    writes into the shared tail: it takes a fresh block (1, the stack's top) and block 2 is
    copied into it; sequence 1 then finds 2 private and writes in place. A finishes there."""
    trace, cfg = tiny([(0.0, 6, 2, 2)])
    rec = Recorder()
    run_simulation(cfg, trace, executor=rec)
    assert [st["copies"] for st in rec.steps] == [[], [[2, 1]]]
    assert [st["swap_out"] + st["swap_in"] for st in rec.steps] == [[], []]
    assert rec.finished_at_end == [0]


def test_swap_out_lists_the_blocks_before_they_are_freed_and_swap_in_the_new_ones():
    """A (4 + 3 tokens) and B (4 + 10) arrive together. Step 0 prefills both: A in block 3, B
    in 2. Step 1 decodes both across a block boundary: A takes 1, B takes 0; no block is free.
    Step 2: free-block-per-seq asks one free block of the last member, so B (the latest) is
    swapped out with its 5 tokens in blocks [2, 0] (table order); they are pushed back (stack
    2, 0) and A decodes its third token and finishes: its blocks 3, 1 are pushed (stack 2, 0,
    3, 1). Step 3 swaps B back in: its 2 blocks are the stack's top, 1 then 3, and it decodes."""
    trace, cfg = tiny([(0.0, 4, 3, 1), (0.0, 4, 10, 1)], preemption="swap", swap_gib=1.0)
    rec = Recorder()
    res = run_simulation(cfg, trace, executor=rec)
    A, B = 0, 1
    st = rec.steps
    assert [s["swap_out"] for s in st[:4]] == [[], [], [[B, 0, 2], [B, 0, 0]], []]
    assert [s["swap_in"] for s in st[:4]] == [[], [], [], [[B, 0, 1], [B, 0, 3]]]
    assert [s["swap_tokens"] for s in st[:4]] == [(0, 0), (0, 0), (5, 0), (0, 5)]
    assert [s["finished"] for s in st[:4]] == [[], [], [], [A]]  # what the step before finished
    assert all(not s["swap_out"] and not s["swap_in"] and not s["copies"] for s in st[4:])
    assert res.summary["num_preemptions"] == 1 and rec.finished_at_end == [B]


def test_a_group_swaps_out_and_back_in_sharing_its_prompt_block():
    """B (4 + 10 tokens) and A (4 + 3, n = 2) arrive together. Step 0 prefills B in block 3, A
    in 2; A forks (both sequences hold 2). Step 1: B, at its turn, has the 2 free blocks its
    one sequence asks and takes the stack's top, 1, to cross, before anyone is preempted (vLLM
    appends a request's slots at its turn: scheduler.py:410-448); A's 2 sequences then find 1:
    A, the latest, goes out (the block both sequences hold, 2, listed and moved once with the
    first: 4 tokens, as vLLM swaps a shared block once), its last holder freeing it. A comes back
    holding its one block shared, as it left (vLLM swaps a group's blocks as they are), with one
    more per sequence: 3 free blocks, so it waits until B, which takes 2 and 0 as it grows,
    finishes after step 9 (its blocks [3, 1, 2, 0] pushed tail first: stack 0, 2, 1, 3). Step
    10: nothing runs, so A swaps back in: both sequences hold 3, and they decode across the
    boundary into 1 and 2. Step 11: A's 2 sequences find 1 free block: A goes out again, 5
    tokens per sequence in [3, 1] and [3, 2], the prompt's block 3 once: 5 + 1 tokens (nothing
    else runs: it is recomputed, a swap fallback, as its 3 blocks and one per sequence exceed
    the pool)."""
    trace, cfg = tiny([(0.0, 4, 10, 1), (0.0, 4, 3, 2)], preemption="swap", swap_gib=1.0)
    rec = Recorder()
    run_simulation(cfg, trace, executor=rec)
    B, A = 0, 1
    st = rec.steps
    assert st[1]["swap_out"] == [[A, 0, 2]] and st[1]["swap_tokens"] == (4, 0)
    assert [k for k, s in enumerate(st) if s["swap_out"]] == [1, 11]
    assert [k for k, s in enumerate(st) if s["swap_in"]] == [10]
    assert st[10]["swap_in"] == [[A, 0, 3]] and st[10]["swap_tokens"] == (0, 4)
    assert st[10]["finished"] == [B]
    assert st[11]["swap_out"] == [[A, 0, 3], [A, 0, 1], [A, 1, 2]] and st[11]["swap_tokens"] == (6, 0)


def test_a_second_pass_swaps_in_after_the_first_ones_swap_outs():
    """X (4 + 10 tokens, n = 4) prefills in block 3, Y (5 + 10) in [2, 1]; X forks (its 4
    sequences hold 3). Step 1: X's 4 sequences cross a block boundary and free-block-per-seq asks
    5 blocks of the 1 free: Y, the latest, goes out (its blocks freed tail first: stack 0, 1,
    2), then X, still 4 > 3 (3 pushed last; its block, shared, listed once). Nothing runs, so the
    core schedules again at the same instant: Y, first in the swapped queue, comes back into 3
    (X's block, swapped out just before) and 2, and decodes; X (a free block per sequence and
    one more each) waits.
    The first pass's 3 swapped-out rows are marked early: they must run before the swap-in."""
    trace, cfg = tiny([(0.0, 4, 10, 4), (0.0, 5, 10, 1)], preemption="swap", swap_gib=1.0)
    rec = Recorder()
    run_simulation(cfg, trace, executor=rec)
    X, Y = 0, 1
    st = rec.steps[1]
    assert st["swap_out"] == [[Y, 0, 2], [Y, 0, 1], [X, 0, 3]]
    assert st["early"] == 3 and st["swap_in"] == [[Y, 0, 3], [Y, 0, 2]]
    assert st["swap_tokens"] == (5 + 4, 5)
    # later steps preempt everyone again (X alone can never decode with a free block per
    # sequence; it is recomputed), with no swap-in after
    assert [k for k, s in enumerate(rec.steps) if s["early"] and s["swap_in"]] == [1]


def test_the_clock_takes_the_executors_durations():
    """Every step takes 1 s. A (4 + 3 tokens) arrives at 0: its prefill runs 0-1. B (4 + 2)
    arrives at 1, when that step ends: the arrival was set before the step's end, so it is
    handed over first and the step at 1 prefills B (prefill first); 2-3 decodes both (B's
    last token), 3-4 decodes A's last."""
    trace = pd.DataFrame({"request_id": ["A", "B"], "arrival_s": [0.0, 1.0], "prompt_tokens": [4, 4],
                          "output_tokens": [3, 2]})
    res = run_simulation(cfg_for(slots=64, block_size=4, max_seq_len=16), trace, executor=Recorder(1.0))
    r = res.requests
    assert res.steps["start_s"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert res.steps["dt_s"].tolist() == [1.0] * 4
    assert res.steps["num_prefill_tokens"].tolist() == [4, 4, 0, 0]
    assert r["first_token_s"].tolist() == [1.0, 2.0] and r["finish_s"].tolist() == [4.0, 3.0]


def test_a_step_of_no_duration_ends_the_run_with_an_error():
    trace, cfg = tiny([(0.0, 4, 3, 1)])
    with pytest.raises(InvariantError, match="non-positive step time"):
        run_simulation(cfg, trace, executor=Recorder(0.0))


@pytest.mark.parametrize("kw", [dict(), dict(chunked_prefill=True, chunk_budget=48),
                                dict(preemption="swap", swap_gib=0.02), dict(prefix_caching=True),
                                dict(system="token")])
def test_priced_from_outside_the_same_records_as_inside(kw):
    """An external executor returning the core's own price for the step it reads gives the very
    records of a simulation (time's rules are the loop's either way), bit for bit."""
    kw = dict(kw)
    system = kw.pop("system", "vllm")
    cfg = cfg_for(system, slots=1200, **kw)
    trace = rand_trace(7, n=120, width={"n": [1, 1, 2, 3]}, prefix=kw.get("prefix_caching", False))
    sim = run_simulation(cfg, trace)
    rec = Recorder(None, priced_as=initial_state(cfg, trace))  # the roofline
    ext = run_simulation(cfg, trace, executor=rec)
    assert sim.summary["engine"] == ext.summary["engine"]
    pd.testing.assert_frame_equal(ext.requests, sim.requests)
    pd.testing.assert_frame_equal(ext.steps, sim.steps)
    assert len(rec.steps) == len(sim.steps)
    copies = sum(len(s["copies"]) for s in rec.steps)
    assert copies == sim.summary.get("mgr_cow_copies", 0)
    if "preemption" in kw:
        assert sum(len(s["swap_out"]) for s in rec.steps) > 0
