"""The bytes a request of a run takes, weighed on the tables a run of its options allocates, and
the refusal of a synthetic workload whose tables do not fit in memory (``sim.limits`` says what
else is checked, and how the pools' tables were measured).

The tables (``sim.run.prepare``: the core's state of ``sim/core/build.py``, the request table, the
trace's frame) are weighed for two sample traces: what grows between them is per request. The
step table is counted apart, only where steps are recorded: its first size is not its peak.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim import limits
from pagesim.sim.metrics import STEP_COLUMNS
from pagesim.sim.run import prepare

#: the sample traces whose tables :func:`bytes_per_request` weighs: two sizes (their difference is
#: per request), past the step table's first size (``sim.core.build``: 1,024 rows or 8 a request)
SAMPLE_REQUESTS = (1024, 2048)
#: a sample request's tokens (ShareGPT's means in the vLLM paper's workload, rounded): the tables
#: kept per token (SGLang's radix rows, prefix caching's hashes) grow with them
SAMPLE_PROMPT_TOKENS, SAMPLE_OUTPUT_TOKENS = 160, 340
#: more than any configuration's tables take a sample request (SGLang's radix rows, a row a token,
#: the most: 8.6 KiB): a workload that fits at this many bytes a request fits, unweighed
BYTES_PER_REQUEST_BOUND = 64 * 1024


#: the step table's rows a request at a run's peak, where steps are recorded: the core's first
#: table (``sim.core.build.ROWS_PER_REQUEST``, 8 a request) doubled once, as a loaded run's is
#: (ShareGPT at 20 req/s on the default system takes 13.4 steps a request); the step frame
#: (``sim.metrics.StepRecords.frame``) is built from it beside it
STEP_ROWS_PER_REQUEST = 16
#: the summary's per-request arrays at its peak, above the tables (``sim.metrics.summarize``: one
#: latency array at a time, worked on in place, beside a column of the finished requests and
#: np.std's temporary: three float64s; 16-24 bytes a request measured by tracemalloc on 10^6 and
#: 10^7 ShareGPT requests, vllm)
SUMMARY_BYTES_PER_REQUEST = 24
_PER_REQUEST: dict[str, float] = {}


def bytes_per_request(cfg=None) -> float:
    """The bytes a request of a run of ``cfg`` (a SimConfig; default the default one, its steps
    recorded) takes: the tables its run allocates before its first event (:func:`tables_bytes`,
    grown between sample traces of :data:`SAMPLE_REQUESTS` requests, over their difference), the
    summary's arrays, and where steps are recorded :data:`STEP_ROWS_PER_REQUEST` rows of the
    core's step table and of the step frame (8 bytes a column each). Computed once per
    configuration in a process."""
    cfg = cfg if cfg is not None else SimConfig()
    key = repr(cfg)
    if key not in _PER_REQUEST:
        bare = replace(cfg, record_steps=False)  # the step table apart: its first size is not its peak
        (small, _), (large, blocks) = (tables_bytes(bare, n) for n in SAMPLE_REQUESTS)
        per_request = (large - small) / (SAMPLE_REQUESTS[1] - SAMPLE_REQUESTS[0]) + SUMMARY_BYTES_PER_REQUEST
        if cfg.record_steps:  # the frame's columns: the step's, and a paged pool's used and logical blocks
            row = 8 * (state.ROW_FLOATS + state.ROW_INTS) + 8 * (len(STEP_COLUMNS) + 2 * blocks)
            per_request += STEP_ROWS_PER_REQUEST * row
        _PER_REQUEST[key] = per_request
    return _PER_REQUEST[key]


def sample_trace(n: int):
    """A trace of ``n`` requests of :data:`SAMPLE_PROMPT_TOKENS` and :data:`SAMPLE_OUTPUT_TOKENS`,
    one a second, in canonical form (``traces/synth.py``'s columns)."""
    ones = np.ones(n, np.int64)
    return pd.DataFrame({"request_id": np.arange(n).astype(str), "arrival_s": np.arange(n, dtype=np.float64),
                         "prompt_tokens": SAMPLE_PROMPT_TOKENS * ones, "output_tokens": SAMPLE_OUTPUT_TOKENS * ones,
                         "n": ones, "beam_width": ones.copy()})


def tables_bytes(cfg, n: int) -> tuple[int, bool]:
    """The bytes of the tables a run of ``cfg`` over :func:`sample_trace` ``(n)`` allocates before
    its first event (``sim.run.prepare``): every array of the core's state and of the request
    table, once each, the request ids (pandas' string array, unless the trace's own) and the trace's
    frame; and whether its pool has blocks."""
    trace = sample_trace(n)
    run = prepare(cfg, trace)
    arrays = {id(a): a for a in [*run.state, *vars(run.table).values()] if isinstance(a, np.ndarray)}
    ids = 0 if run.table.request_id is trace["request_id"].array else run.table.request_id.nbytes  # (shared)
    return sum(a.nbytes for a in arrays.values()) + ids + int(trace.memory_usage(deep=True).sum()), run.pool.has_blocks


def check_synthetic_workload(rate: float, duration_s: float | None, num_requests: int | None, *,
                             what: str = "the workload",
                             advice: str = "use a lower --rate, a shorter --duration or fewer --num-requests",
                             cfg=None) -> None:
    """Refuse a synthetic workload of ``rate`` req/s for ``duration_s`` (or ``num_requests``, the
    fewer when both are given) whose request tables (:func:`bytes_per_request` of ``cfg``, the
    run's SimConfig) do not fit in memory; ``what`` names the workload and ``advice`` which
    settings to change."""
    count, how = float("inf"), ""
    if duration_s is not None:
        count, how = rate * duration_s, f"{rate:g} req/s for {duration_s:g} s"
    if num_requests is not None and num_requests < count:
        count, how = num_requests, f"{num_requests} requests"
    if count * BYTES_PER_REQUEST_BOUND <= limits.physical_memory_bytes():
        return  # (weighing the tables costs a sample run's preparation, ~0.2 s)
    limits.check_fits_in_memory(count * bytes_per_request(cfg),
                                f"{what} ({how}) means {count:.3g} requests, whose tables", advice)


