"""The core's static batching (sim/core/sched/static.py) worked by hand: fixed slots taken lowest
first, batches of at most B formed FCFS only when none runs, the padded prefill and decode,
and the whole batch finishing at once."""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.sim.core import state
from pagesim.sim.core.kv import extent
from pagesim.sim.core.sched import lifecycle, static
from pagesim.sim.run import initial_state, run_simulation
from tests.sim.helpers import cfg_for, trace, write_table_profile
from pagesim.sim.core.kv.extent import EXTENT_START
from pagesim.sim.core.sched.static import STATIC_BATCH_LIMIT


def core_state(rows, slots=56, max_seq_len=16, width=None, **kw):
    """The core's state with every request of ``rows`` (arrival, prompt, output; ``width``: their n)
    waiting."""
    cfg = cfg_for("static", slots=slots, max_seq_len=max_seq_len, **kw)
    s = initial_state(cfg, trace(rows, **({} if width is None else {"n": width})))
    for i in range(len(rows)):
        lifecycle.add_arrival(s, i)
    return s


def categories(s, demand_waiting=False):
    out = np.zeros(6, np.int64)
    extent.memory_categories(s, demand_waiting, out)
    return out.tolist()


def test_a_batch_of_three_slots_padded_and_finished_together():
    """56 slots of max_seq_len 16: B = 3 slots ([0, 16), [16, 32), [32, 48)) and a tail of 8
    always free. Four requests wait: the first three form the batch; the fourth waits for the
    whole batch to end."""
    s = core_state([(0, 3, 2), (0, 5, 1), (0, 2, 3), (0, 4, 1)])
    c = s.count
    assert s.config[STATIC_BATCH_LIMIT] == 3
    assert static.schedule(s) == 0
    assert s.running[:c[state.NUM_RUNNING]].tolist() == [0, 1, 2]
    assert [int(s.extent[i, EXTENT_START]) for i in range(3)] == [0, 16, 32]
    # the prefill is padded to the longest prompt: 3 x 5 tokens
    assert (c[state.STEP_PREFILL_SEQS], c[state.STEP_PREFILL_TOKENS]) == (3, 15)
    # token states 3 + 5 + 2, reservation F - L = 2 + 1 + 3, internal 16 - F, no slack, free 8
    assert categories(s) == [10, 6, 11 + 10 + 11, 0, 0, 8]
    static.complete_step(s, 1.0)
    assert s.num_generated[:4].tolist() == [1, 1, 1, 0] and c[state.NUM_RUNNING] == 3
    # decode: requests 0 and 2 still generate; request 1 (done) only pads; context 3+1, 5+1, 2+1
    assert static.schedule(s) == 4 + 6 + 3
    assert c[state.STEP_DECODE_SEQS] == 3 and categories(s)[0] == 12
    static.complete_step(s, 2.0)
    assert s.num_generated[:3].tolist() == [2, 1, 2] and c[state.NUM_RUNNING] == 3  # 2 still runs
    assert c[state.ITL_COUNT] == 2
    assert static.schedule(s) == 5 + 6 + 4
    static.complete_step(s, 3.0)
    assert c[state.NUM_RUNNING] == 0 and s.finish_s[:3].tolist() == [3.0, 3.0, 3.0]
    assert categories(s) == [0, 0, 0, 0, 0, 56]
    static.schedule(s)  # the next batch takes the lowest slot again
    assert s.running[:c[state.NUM_RUNNING]].tolist() == [3] and int(s.extent[3, EXTENT_START]) == 0


def test_batch_size_and_never_fitting_requests():
    """static_batch_size caps B; a request longer than max_seq_len is rejected, not batched."""
    s = core_state([(0, 3, 20), (0, 2, 2), (0, 2, 2), (0, 2, 2)], static_batch_size=2)
    static.schedule(s)
    assert s.status[0] == state.REJECTED and s.reject_code[0] == state.REJECT_NEVER_FITS
    assert s.running[:s.count[state.NUM_RUNNING]].tolist() == [1, 2]


def test_max_num_seqs_caps_the_batch_below_the_slots():
    """Three free slots, max_num_seqs 2: a batch of two, the third request waits (not for
    memory: no external fragmentation is counted)."""
    s = core_state([(0, 2, 2), (0, 2, 2), (0, 2, 2)], max_num_seqs=2)
    static.schedule(s)
    assert s.running[:s.count[state.NUM_RUNNING]].tolist() == [0, 1]
    assert s.count[state.WAITING_LEN] == 1 and s.count[state.DEMAND_WAITING] == 0


def test_a_padded_batch_priced_by_the_table_model(tmp_path):
    """The table model (tests/sim/helpers.py's profile: overhead 3000 us; linear 22000 us at 64
    tokens, 40000 at 256; attn_prefill 250 us at 32, 700 at 64; attn_decode 20 + 0.05 batch x
    context us) prices a static batch of prompts 20, 40, 30 as its padded shape.
    The prefill: 3 x 40 = 120 tokens, linear 22000 + 18000 x 56/192 = 27250 us; each member's
    attention at context 40 (the padded prompt, not its own), 250 + 450 x 8/32 = 362.5 us,
    three times: 3000 + 27250 + 1087.5 = 31337.5 us. The first decode: 3 sequences, linear
    20000 + 500 x 2/15 us; contexts 21 + 41 + 31 = 93, mean 31: decode at batch 1 is 21.55 us,
    at batch 8 32.4 us, at batch 3 21.55 + 10.85 x 2/7 = 24.65 us."""
    profile = str(write_table_profile(tmp_path / "profile.csv"))
    cfg = cfg_for("static", slots=192, max_seq_len=64, profile=profile)
    r = run_simulation(cfg, trace([(0, 20, 3), (0, 40, 2), (0, 30, 2)]))
    assert r.summary["engine"] in ("core", "core-cpython")
    dt_us = (r.steps["dt_s"] * 1e6).tolist()
    assert dt_us[0] == pytest.approx(3000 + 27250 + 3 * 362.5, rel=1e-12)
    assert dt_us[1] == pytest.approx(3000 + 20000 + 500 * 2 / 15 + 24.65, rel=1e-12)
    assert r.steps["num_prefill_tokens"].tolist()[:2] == [120, 0] and len(dt_us) == 3


def test_a_request_of_several_sequences_is_rejected_not_batched():
    """Static batching runs one sequence per request: a request of n = 2 at the queue's head is
    rejected (with its reason) and the batch is formed from the others."""
    s = core_state([(0, 3, 2), (0, 2, 2), (0, 2, 2), (0, 2, 2)], static_batch_size=2, width=[1, 2, 1, 1])
    static.schedule(s)
    assert s.status[1] == state.REJECTED and s.reject_code[1] == state.REJECT_WIDTH_UNSHARED
    assert s.running[:s.count[state.NUM_RUNNING]].tolist() == [0, 2]
    r = run_simulation(cfg_for("static", slots=56, max_seq_len=16), trace([(0, 3, 2), (0, 2, 2)], n=[2, 1]))
    assert r.requests["reject_reason"].tolist() == ["static batching runs one sequence per request "
                                                    "(n = beam_width = 1)", ""]
