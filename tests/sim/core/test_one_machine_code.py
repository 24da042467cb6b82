"""Every configuration runs one machine code: numba compiles the loop once per distinct type of
the core's state (an array's dtype, dimensions, layout, writeability), and a compile of the whole
loop takes minutes. A state's arrays must therefore have the same kinds whatever the system,
the trace's columns (parallel sampling, beam search, prefix hashes), the cost model or the
records kept. Worked example of what broke it: a beam run's first-sequence column as a view
of the (n, width) slot table is strided, and a trace column from pandas is read-only, each a
second compile of the loop."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.core.events.replay import array_kind
from pagesim.sim.run import initial_state
from tests.sim.helpers import ConstExecutor, cfg_for, rand_trace


def kinds(cfg, trace, executor=None):
    return tuple(array_kind(a) for a in initial_state(cfg, trace, executor))


CONFIGS = [
    ("vllm", {}, {}),
    ("vllm", {"n": [1, 2, 3]}, {}),
    ("vllm", {"beam_width": [1, 2, 4]}, {}),
    ("vllm", {}, {"prefix_caching": True}),
    ("vllm", {}, {"record_steps": False}),
    ("vllm", {}, {"cost_model": "calibrated"}),
    ("vllm-v1", {}, {}),
    ("sglang", {}, {}),
    ("sglang", {}, {"kv_offload_gib": 1.0}),  # its host tier (sim/core/kv/radix_cache.py)
    ("orca-max", {}, {}),
    ("orca-pow2", {}, {}),
    ("orca-oracle", {}, {}),
    ("static", {}, {}),
]


@pytest.mark.parametrize("system, columns, options", CONFIGS)
def test_every_configuration_has_the_default_runs_state_types(system, columns, options):
    trace = rand_trace(0, n=40, width=columns, prefix=options.get("prefix_caching", False))
    assert kinds(cfg_for(system, **options), trace) == kinds(cfg_for("vllm"), rand_trace(0, n=40))


def test_sglang_over_prefix_hashes_has_the_default_runs_state_types():
    trace = rand_trace(0, n=40, prefix=True)  # the radix cache reads the chains; pages of 4, lpm
    assert kinds(cfg_for("sglang", block_size=4, schedule_policy="lpm"), trace) == kinds(cfg_for("vllm"),
                                                                                         rand_trace(0, n=40))


def test_a_trace_of_read_only_or_strided_columns_changes_nothing():
    trace = rand_trace(1, n=40)
    strided = pd.DataFrame({c: trace[c].to_numpy()[::-1][::-1] for c in trace})
    for c in ("prompt_tokens", "output_tokens", "arrival_s"):
        wide = np.repeat(trace[c].to_numpy(), 2)[::2]  # a strided view
        wide.flags.writeable = False
        strided[c] = pd.Series(wide, copy=False)
    assert kinds(cfg_for("vllm"), strided) == kinds(cfg_for("vllm"), trace)


def test_an_executor_outside_the_core_changes_nothing():
    trace = rand_trace(2, n=40)  # the GPU mode's executor reads each step's block copies
    assert kinds(cfg_for("vllm"), trace, ConstExecutor()) == kinds(cfg_for("vllm"), trace)
