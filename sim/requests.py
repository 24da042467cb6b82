"""A run's requests as columns (numpy arrays over the trace's rows): the trace's own, and the
state the core writes in place as it runs them (``sim.core.state.Core`` holds these very arrays).
Request ``i`` is row ``i`` of the trace.

Token timeline of one sequence (P prompt tokens, O output tokens)::

    step:       prefill      decode 1     decode 2   ...   decode O-1
    KV stored:  P            P+1          P+2              P+O-1
    generated:  1            2            3                O          -> finished

The prefill computes the prompt's K/V and samples the first token; each decode step stores
the K/V of the newest token and samples the next, so the last token's K/V is never stored.
A recompute preemption turns the generated tokens into prompt: re-prefill P+g tokens, sample
token g+1. ``final_len = P + O`` is what reservation policies and the accounting call F.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # (pandas is imported where a frame is built)
    import pandas as pd

from pagesim.sim.errors import TraceError


class Status(enum.IntEnum):
    """A request's ``status`` (the core's ``state.PENDING`` .. ``REJECTED``)."""

    PENDING = 0  # not arrived yet
    WAITING = 1
    RUNNING = 2
    SWAPPED = 3
    FINISHED = 4
    REJECTED = 5
    LOADING = 6  # a disaggregated decode replica's: its prompt's KV on the wire (sim/core/kv/remote_kv.py)


def check_counts(trace: "pd.DataFrame", table: "RequestTable") -> None:
    """Every request computes at least one prompt token and generates at least one, in at least one
    sequence: a count below 1 is refused (TraceError naming the row and field), as the trace
    loaders and ``traces.schema.validate_canonical`` refuse it. This is where every run's requests
    are built, so a DataFrame handed to ``run_simulation`` without validation is caught here too."""
    for field, values in (("prompt_tokens", table.prompt), ("output_tokens", table.output), ("n", table.n),
                          ("beam_width", table.beam)):
        bad = np.flatnonzero(values < 1)
        if bad.size:
            i = int(bad[0])
            raise TraceError(f"must be >= 1, got {values[i]} (request {table.request_id[i]!r})",
                             path=str(trace.attrs.get("source", "<trace>")), row=i + 1, field=field)


def ones_or(trace: "pd.DataFrame", column: str, ones: np.ndarray) -> np.ndarray:
    """The trace's ``column`` as int64, or ``ones`` itself where it has none or all its values are 1."""
    if column not in trace:
        return ones
    values = np.array(trace[column], dtype=np.int64)
    return ones if (values == 1).all() else values


class RequestTable:
    """Columns of the trace plus mutable per-request state."""

    def __init__(self, trace: "pd.DataFrame"):
        n = len(trace)
        self.size = n
        # pandas' string array, the trace's own where its ids are strings already: about 14 bytes an id
        # where a Python string each would take 60
        self.request_id = trace["request_id"].astype(str).array
        # The run's clock starts at the first arrival: duration and time-weighted averages are
        # measured from it (a trace whose times start late, or are epoch seconds, would count
        # the time before it), and times near 0 keep their precision (at 1e15 s a float's step
        # is 0.125 s: every latency would round to 0). Records are in this clock, and the summary keeps the offset (``arrival_offset_s``)
        arrival = trace["arrival_s"].to_numpy(dtype=np.float64)
        self.arrival_offset_s = float(arrival.min()) if n else 0.0
        self.arrival_s = arrival - self.arrival_offset_s
        # what each request spends outside the engine (the serving front end), counted in its
        # TTFT and E2EL (sim.metrics.request_latencies); the cost model's, set by sim.run.prepare
        self.frontend_s = 0.0
        # own, writeable copies: pandas hands out read-only views (copy-on-write), numba types a
        # read-only array apart from a writeable one, and each distinct type of the core's state
        # is a separate compile of the whole loop (~2 min)
        self.prompt = np.array(trace["prompt_tokens"], dtype=np.int64)
        self.output = np.array(trace["output_tokens"], dtype=np.int64)
        # n and beam_width, and the sequences each request runs (their larger): one array of ones
        # for any of them the trace leaves out or holds at 1 throughout (none is written: ten
        # million requests of one sequence keep 80 MB, not 240)
        ones = np.ones(n, np.int64)
        self.n, self.beam = (ones_or(trace, column, ones) for column in ("n", "beam_width"))
        check_counts(trace, self)
        self.width = self.beam if self.n is ones else self.n if self.beam is ones else np.maximum(self.n, self.beam)
        # the order of the waiting queue under --scheduling-policy priority (lower first); a trace
        # that has the column gets it in its records and its summary by priority (without one, a
        # single 0: sim.core.build gives the core a column of them where its policy reads it)
        self.has_priority = "priority" in trace
        self.priority = np.array(trace["priority"], dtype=np.int64) if self.has_priority else np.zeros(1, np.int64)
        if "prefix_hashes" in trace:
            self.hashes = trace["prefix_hashes"].to_numpy(dtype=object)
            self.hash_block_tokens = int(trace.attrs.get("hash_block_tokens", 512))
        else:
            self.hashes = None
            self.hash_block_tokens = 16
        self.status = np.zeros(n, np.int8)
        self.reject_code = np.zeros(n, np.int8)  # why a rejected request was (the core's state.REJECT_*; 0: not)
        self.generated = np.zeros(n, np.int64)
        self.prefilled = np.zeros(n, np.int64)  # prompt(+regenerated) tokens computed this admission
        self.target = self.prompt.copy()  # tokens the current prefill must compute
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.last_token_s = np.full(n, np.nan)
        self.preemptions = np.zeros(n, np.int64)

    def prefix_hashes(self, i: int):
        if self.hashes is None:
            return None
        h = self.hashes[i]
        return tuple(h) if h is not None and len(h) else None
