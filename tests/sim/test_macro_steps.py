"""Macro steps (the engine's decode-only stretches taken at once) change nothing but speed.

Each case runs the same trace and configuration step by step (``macro_steps=False``) and with
macro steps, and compares request records, the per-step table and the summary: records and
step tables must be identical, times bit for bit (a macro step ends where the steps' sums end);
only running sums in float order (mean inter-token latency; time-weighted sums of unrecorded
steps) may differ, within 1e-9 relative.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.config import SimConfig
from pagesim.sim.engine import Engine
from pagesim.sim.metrics import request_frame, summarize
from pagesim.sim.run import build, run_simulation
from tests.sim.helpers import OPT13B_SLOT, rand_trace

def run(cfg: SimConfig, trace: pd.DataFrame, macro: bool, min_steps: int = 2, vectorized: bool = False):
    _, _, _, table, manager, sched, executor = build(cfg, trace)
    eng = Engine(sched, manager, executor, table.arrival_s, record_steps=cfg.record_steps,
                 macro_steps=macro)
    eng.MACRO_MIN_STEPS = min_steps  # take even short stretches at once: more boundaries tested
    if vectorized:  # plan every stretch with numpy, however short (the scalar paths' reference)
        eng.SCALAR_MACRO_MAX = 0
        manager.SCALAR_LANE_CROSSINGS = 0
    eng.run()
    summary = summarize(table, eng.rec, sched, duration_s=eng.end_s, wall_time_s=0.0)
    summary.update(eng.rec.sharing())
    return summary, request_frame(table), eng.rec.frame(), eng.num_macro_steps


def assert_same(a, b):
    sa, ra, fa, _ = a
    sb, rb, fb, _ = b
    assert list(ra.columns) == list(rb.columns)
    pd.testing.assert_frame_equal(ra, rb, check_exact=True)
    pd.testing.assert_frame_equal(fa, fb, check_exact=True)
    assert sa.keys() == sb.keys()
    exact_sums = len(fa) > 0  # recorded steps: the summary's sums come from identical rows
    for k, v in sa.items():
        if exact_sums and k != "mean_itl_ms" and not (isinstance(v, float) and np.isnan(v)):
            assert sb[k] == v, k
        elif isinstance(v, float):
            if np.isnan(v):
                assert np.isnan(sb[k]), k
            else:
                assert sb[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
        else:
            assert sb[k] == v, k


CASES = [
    ("vllm", {}, {}),
    ("vllm", dict(block_size=4), {}),
    ("vllm", dict(block_size=32, watermark=0.0), {}),
    ("token", {}, {}),
    ("vattention", {}, {}),
    ("orca-max", {}, {}),
    ("orca-pow2", {}, {}),
    ("orca-oracle", {}, {}),
    ("static", {}, {}),
    ("vllm", dict(chunked_prefill=True, chunk_budget=128), {}),
    ("vllm", dict(preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30), {}),
    ("vllm", dict(max_num_seqs=8), {}),
    ("vllm", dict(waiting_served_ratio=0.5), {}),
    ("vllm", {}, dict(width={"n": [1, 2, 3]})),
    ("vllm", {}, dict(width={"beam_width": [1, 1, 2, 4]})),
    ("vllm", dict(prefix_caching=True), dict(prefix=True)),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("system,kw,tkw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_macro_steps_equal_step_by_step(system, kw, tkw, seed):
    kw = dict(kw)
    slots = kw.pop("slots", 3000 if system != "static" else 2048)
    kw.setdefault("kv_gib", slots * OPT13B_SLOT / 2**30)
    kw.setdefault("max_seq_len", 256)
    cfg = SimConfig.for_system(system, model="opt-13b", gpu="a100-80gb", seed=seed, **kw)
    trace = rand_trace(seed, **tkw)
    a = run(cfg, trace, macro=False)
    b = run(cfg, trace, macro=True)
    assert a[3] == 0
    assert_same(a, b)
    if system != "static" and "beam_width" not in tkw.get("width", {}):
        assert b[3] > 0
    assert_same(a, run(cfg, trace, macro=True, min_steps=Engine.MACRO_MIN_STEPS))
    assert_same(a, run(cfg, trace, macro=True, min_steps=8))
    c = run(cfg, trace, macro=True)  # deterministic run to run
    assert c[3] == b[3]
    pd.testing.assert_frame_equal(c[1], b[1])
    pd.testing.assert_frame_equal(c[2], b[2])


def test_requests_wider_than_max_num_seqs_are_rejected_alike_with_macro_steps():
    """Requests of 4 sequences with max_num_seqs=3 are rejected at arrival: they never join the
    queue, so the step table's num_waiting must not count them (macro steps did)."""
    cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", kv_gib=3000 * OPT13B_SLOT / 2**30,
                               max_seq_len=256, max_num_seqs=3, seed=0)
    trace = rand_trace(0, width={"n": [1, 2, 4]})
    a = run(cfg, trace, macro=False)
    assert (a[1]["reject_reason"].str.contains("exceed max_num_seqs")).sum() > 0
    assert_same(a, run(cfg, trace, macro=True))


def test_macro_steps_taken_and_unrecorded_sums():
    cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", kv_gib=3000 * OPT13B_SLOT / 2**30,
                               max_seq_len=256, record_steps=False)
    trace = rand_trace(3, n=300, rate=10.0)
    a = run(cfg, trace, macro=False)
    b = run(cfg, trace, macro=True)
    assert b[3] > a[2].shape[0] // 4 if len(a[2]) else b[3] > 0
    assert_same(a, b)


def test_run_simulation_flag_and_check_mode():
    cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", kv_gib=3000 * OPT13B_SLOT / 2**30,
                               max_seq_len=256)
    trace = rand_trace(5)
    on = run_simulation(cfg, trace)
    off = run_simulation(cfg, trace, macro_steps=False)
    pd.testing.assert_frame_equal(on.steps, off.steps, rtol=1e-9)
    chk = run_simulation(SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", check=True,
                                              kv_gib=3000 * OPT13B_SLOT / 2**30, max_seq_len=256), trace)
    pd.testing.assert_frame_equal(on.steps, chk.steps, rtol=1e-9)


def test_macro_steps_with_table_cost_model(tmp_path):
    from pagesim.sim.profile_format import write_profile

    c = dict(model="opt-13b", gpu="a100-80gb", dtype="float16", tp=1)
    rows = [dict(component="linear", num_tokens=t, batch=None, context=None, time_us=us, **c)
            for t, us in ((1, 20000.0), (64, 21000.0), (2048, 90000.0))]
    rows += [dict(component="attn_decode", num_tokens=None, batch=b, context=x, time_us=b * x * 0.01 + 30, **c)
             for b in (1, 8, 64) for x in (64, 512, 2048)]
    rows += [dict(component="attn_prefill", num_tokens=512, batch=None, context=None, time_us=800.0, **c),
             dict(component="overhead", num_tokens=None, batch=None, context=None, time_us=3000.0, **c)]
    prof = write_profile(rows, tmp_path / "profile.csv")
    cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", kv_gib=3000 * OPT13B_SLOT / 2**30,
                               max_seq_len=256, profile=str(prof))
    trace = rand_trace(7, n=200, rate=5.0)
    a = run(cfg, trace, macro=False)
    b = run(cfg, trace, macro=True)
    assert b[3] > 0
    assert_same(a, b)


@pytest.mark.parametrize("system,kw,tkw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_check_mode_recomputes_the_incremental_state(system, kw, tkw):
    """``check=True`` recomputes, after every iteration, the decode set's aggregates (members,
    widths, context sum, finish steps, sequence array) from the request table and confirms
    that a queue head skipped as blocked really cannot be admitted; same records as a normal run."""
    kw = dict(kw)
    slots = kw.pop("slots", 3000 if system != "static" else 2048)
    kw.setdefault("kv_gib", slots * OPT13B_SLOT / 2**30)
    kw.setdefault("max_seq_len", 256)
    trace = rand_trace(2, **tkw)
    plain = run_simulation(SimConfig.for_system(system, model="opt-13b", gpu="a100-80gb", **kw), trace)
    checked = run_simulation(SimConfig.for_system(system, model="opt-13b", gpu="a100-80gb", check=True, **kw), trace)
    pd.testing.assert_frame_equal(plain.steps, checked.steps, rtol=1e-9)
    pd.testing.assert_frame_equal(plain.requests, checked.requests, rtol=1e-9)


def test_check_mode_catches_a_drifted_decode_set():
    from pagesim.sim.errors import InvariantError

    cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", kv_gib=3000 * OPT13B_SLOT / 2**30,
                               max_seq_len=256, check=True)
    _, _, _, table, manager, sched, executor = build(cfg, rand_trace(4))
    orig = sched._join

    def bad_join(i):  # forget one sequence's context: the running sum drifts
        orig(i)
        sched._ctx_base -= 1
    sched._join = bad_join
    eng = Engine(sched, manager, executor, table.arrival_s, check=True)
    with pytest.raises(InvariantError, match="decode context sum"):
        eng.run()


@pytest.mark.parametrize("system,kw,tkw", [c for c in CASES if c[0] in ("vllm", "token", "orca-pow2")][:6])
@pytest.mark.parametrize("record", [True, False])
def test_scalar_and_vectorized_macro_planning_agree(system, kw, tkw, record):
    """Short stretches are planned and advanced in scalar Python, long ones with numpy: forcing
    numpy everywhere gives the same records as step by step."""
    kw = dict(kw)
    kw.setdefault("kv_gib", 3000 * OPT13B_SLOT / 2**30)
    cfg = SimConfig.for_system(system, model="opt-13b", gpu="a100-80gb", max_seq_len=256, seed=1,
                               record_steps=record, **kw)
    trace = rand_trace(1, **tkw)
    a = run(cfg, trace, macro=False)
    b = run(cfg, trace, macro=True, min_steps=1, vectorized=True)
    assert b[3] > 0
    assert_same(a, b)


@pytest.mark.parametrize("max_num_seqs", [1, 256])
def test_arrival_tied_with_a_stretch_end(max_num_seqs):
    """An arrival at the exact time a stretch would end: the stretch's timeout is older than
    the last step's would be, so SimPy could run the engine before the arrival where step by
    step runs the arrival first (queue head blocked: num_waiting; queue empty: admission).
    The stretch stops a step short and the full path takes the tie."""
    cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", kv_gib=3000 * OPT13B_SLOT / 2**30,
                               max_seq_len=256, max_num_seqs=max_num_seqs)

    def trace(arr):
        return pd.DataFrame({"request_id": [f"r{i}" for i in range(len(arr))], "arrival_s": arr,
                             "prompt_tokens": [10] * len(arr), "output_tokens": [200] + [5] * (len(arr) - 1)})
    base = [0.0, 0.05, 0.1]
    steps = run(cfg, trace(base), macro=False)[2]
    ties = 0
    for tie in steps["start_s"].to_numpy()[steps["start_s"].to_numpy() > 0.2][:12]:
        t = trace(base + [float(tie)])
        a = run(cfg, t, macro=False)
        assert_same(a, run(cfg, t, macro=True, min_steps=1))
        assert_same(a, run(cfg, t, macro=True, min_steps=1, vectorized=True))
        ties += int(np.isin(float(tie), a[2]["start_s"].to_numpy()))
    assert ties >= 6  # the arrival does land on a step boundary of the run it is in
