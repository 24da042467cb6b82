"""The core's per-request arrays as long as a run can use, no longer (sim/core/build.py, issue 85:
ten million requests in under 2 GB). Worked by hand on small traces; the suite's bounds
checking (tests/checked_core.py) turns a length too short into an IndexError in whichever test
runs past it, and these tests fail when one grows back to the trace's length."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagesim.sim.core import state
from pagesim.sim.disagg import disaggregated_columns
from pagesim.sim.requests import RequestTable
from pagesim.sim.run import initial_state
from tests.sim.helpers import cfg_for

STEP_ARRAYS = ("running", "running_group", "step_prefill_ids", "step_prefill_tokens", "step_finished",
               "step_prefill_context")


def trace(size: int, **columns) -> pd.DataFrame:
    """``size`` requests of 8 prompt and 4 output tokens at 0 s, and ``columns``."""
    return pd.DataFrame({"request_id": [str(i) for i in range(size)], "arrival_s": [0.0] * size,
                         "prompt_tokens": [8] * size, "output_tokens": [4] * size, **columns})


def lengths(s, names) -> set[int]:
    return {len(getattr(s, name)) for name in names}


def test_the_running_list_and_the_steps_arrays_are_as_long_as_the_most_that_run_at_once():
    # 10 requests, max_num_seqs 4: 4 places; a paged pool of 3 blocks of 16 (48 slots) holds 3
    # running requests (each holds a block): 3; the contiguous manager counts no slots: 4
    assert lengths(initial_state(cfg_for("vllm", max_num_seqs=4), trace(10)), STEP_ARRAYS) == {4}
    small = cfg_for("vllm", slots=48, max_seq_len=48, max_num_seqs=4)
    assert lengths(initial_state(small, trace(10)), STEP_ARRAYS) == {3}
    assert lengths(initial_state(cfg_for("orca-max", max_num_seqs=4), trace(10)), STEP_ARRAYS) == {4}
    # fewer requests than either: the trace's
    assert lengths(initial_state(cfg_for("vllm", max_num_seqs=4), trace(2)), STEP_ARRAYS) == {2}


def test_the_swapped_queue_is_one_place_where_nothing_is_swapped_out():
    # vLLM 0.4.2 swaps with --preemption swap, or a request of several sequences (lifecycle.preempt)
    names = ("swapped", "swapped_tokens")
    assert lengths(initial_state(cfg_for("vllm"), trace(10)), names) == {1}
    assert lengths(initial_state(cfg_for("vllm", preemption="swap"), trace(10)), names) == {10}
    assert lengths(initial_state(cfg_for("vllm"), trace(10, n=[1] * 9 + [2])), names) == {10}
    assert lengths(initial_state(cfg_for("vllm-v1"), trace(10)), names) == {1}  # (no swap space)


def test_a_connectors_columns_are_a_disaggregated_runs_or_a_host_tiers():
    names = ("admitted_s", "load_ready_s")
    assert lengths(initial_state(cfg_for("vllm-v1"), trace(10)), names) == {1}
    assert lengths(initial_state(cfg_for("vllm-v1", kv_offload_gib=1.0), trace(10)), ("load_ready_s",)) == {10}
    assert {len(v) for v in disaggregated_columns(10).values()} == {10}


def test_prefix_chains_are_kept_where_a_cache_reads_them():
    assert len(initial_state(cfg_for("vllm"), trace(10)).chain_start) == 1
    assert len(initial_state(cfg_for("vllm", prefix_caching=True), trace(10)).chain_start) == 11


def test_one_array_of_ones_is_n_beam_and_width_where_each_request_runs_one_sequence():
    table = RequestTable(trace(10, n=[1] * 10))
    assert table.n is table.beam is table.width and table.n.tolist() == [1] * 10
    table = RequestTable(trace(3, beam_width=[1, 4, 2]))
    assert table.width is table.beam and table.n.tolist() == [1, 1, 1]
    table = RequestTable(trace(3, n=[2, 1, 1], beam_width=[1, 3, 1]))
    assert table.width.tolist() == [2, 3, 1]


def test_priorities_are_a_single_0_unless_the_trace_has_them_or_the_policy_reads_them():
    assert RequestTable(trace(10)).priority.tolist() == [0]
    assert len(initial_state(cfg_for("vllm-v1"), trace(10)).priority) == 1
    s = initial_state(cfg_for("vllm-v1", scheduling_policy="priority"), trace(10))
    assert s.priority.tolist() == [0] * 10
    s = initial_state(cfg_for("vllm-v1"), trace(3, priority=[2, 0, 1]))
    assert s.priority.tolist() == [2, 0, 1]
    assert s.config[state.NUM_REQUESTS] == 3 and np.all(s.prompt_tokens == 8)
