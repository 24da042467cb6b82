"""The SimPy model of the core's loop (sim/simpy_model.py: two processes, SimPy's clock, the
core's own functions) leaves the records of the compiled loop, for every kind of system."""

from __future__ import annotations

import pandas as pd
import pytest

from pagesim.sim import simpy_model
from pagesim.sim.run import prepare, result, run_simulation
from tests.sim.helpers import OPT13B_SLOT, cfg_for, rand_trace


@pytest.mark.parametrize("system,kw,tkw", [
    ("vllm", dict(slots=1200), dict(rate=200.0)),  # preemption storms
    ("vllm", dict(slots=1200, preemption="swap", swap_gib=150 * OPT13B_SLOT / 2**30, chunked_prefill=True,
                  chunk_budget=64), dict(rate=200.0)),
    ("vllm", dict(slots=1200, prefix_caching=True), dict(rate=200.0, prefix=True, width={"beam_width": [1, 2, 3]})),
    ("vllm", {}, dict(rate=2.0)),  # idle between arrivals: the engine sleeps and is woken
    ("orca-max", dict(slots=1000, reservation="predicted", placement="best-fit"), dict(rate=200.0)),
    ("static", dict(slots=1200), dict(rate=5.0)),
    ("vllm-v1", dict(slots=1200, max_num_batched_tokens=64, max_num_seqs=16), dict(rate=200.0, prefix=True)),
    ("sglang", dict(slots=600, chunk_budget=64, block_size=4, schedule_policy="lpm"), dict(rate=200.0, prefix=True)),
])
def test_the_simpy_model_leaves_the_loops_records(system, kw, tkw):
    kw = dict(kw)
    cfg = cfg_for(system, slots=kw.pop("slots", 3000), seed=0, **kw)
    trace = rand_trace(0, n=80, **tkw)
    compiled = run_simulation(cfg, trace)
    run = prepare(cfg, trace)
    model = result(cfg, run._replace(state=simpy_model.run(run.state)), wall_time_s=0.0)
    pd.testing.assert_frame_equal(model.requests, compiled.requests, check_exact=True)
    pd.testing.assert_frame_equal(model.steps, compiled.steps, check_exact=True)
    assert compiled.summary["idle_s"] > 0 or tkw["rate"] > 2  # the rate-2 case sleeps and is woken
    for k, v in compiled.summary.items():
        if k != "wall_time_s":
            assert model.summary[k] == v or (v != v and model.summary[k] != model.summary[k]), k
