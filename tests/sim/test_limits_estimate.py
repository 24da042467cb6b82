"""sim/run_memory.py's bytes a request: the tables a run of the options allocates (weighed on two
sample traces: what grows between them is per request), the summary's arrays, and the step table
only where steps are recorded. Worked by hand; the estimate against a command's measured peak
memory is ``benchmarks/limits_accuracy.py`` (within 25 % at 1M requests)."""

from __future__ import annotations

import pytest

from pagesim.sim import limits
from pagesim.sim import run_memory as M
from pagesim.sim.config import SimConfig
from pagesim.sim.errors import ConfigError


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(M, "_PER_REQUEST", {})


def test_the_arithmetic_by_hand(monkeypatch):
    # tables of 1,000 bytes plus 300 a request: 300 + the summary's 24 a request without steps;
    # with steps, 16 rows of the core's table (2 float + 15 int columns) and of the frame (the
    # step's 15 columns and a paged pool's used and logical blocks), 8 bytes a cell:
    # 16 x (17 x 8 + 17 x 8) = 4,352 more
    monkeypatch.setattr(M, "tables_bytes", lambda cfg, n: (1000 + 300 * n, True))
    assert M.bytes_per_request(SimConfig.for_system("vllm", record_steps=False)) == 300 + 24
    assert M.bytes_per_request(SimConfig.for_system("vllm", record_steps=True)) == 300 + 24 + 4352


def test_the_tables_weighed_for_a_tiny_config():
    """vLLM v0 without steps, a request of the sample: the trace's frame (its id string and five
    int64/float64 columns), the request table's id string and the core's per-request arrays,
    each counted once: what the request table and the core share is not counted twice."""
    cfg = SimConfig.for_system("vllm", record_steps=False)
    (small, blocks), (large, _) = (M.tables_bytes(cfg, n) for n in M.SAMPLE_REQUESTS)
    per_request = (large - small) / (M.SAMPLE_REQUESTS[1] - M.SAMPLE_REQUESTS[0])
    assert blocks
    assert M.bytes_per_request(cfg) == per_request + M.SUMMARY_BYTES_PER_REQUEST
    # the step table costs nothing without steps: the same tables with them are 8 rows larger a
    # request (the core's first table: 17 cells of 8 bytes), which the estimate replaces by its 16
    with_steps = SimConfig.for_system("vllm", record_steps=True)
    grown = [M.tables_bytes(with_steps, n)[0] for n in M.SAMPLE_REQUESTS]
    assert (grown[1] - grown[0]) - (large - small) == 8 * 17 * 8 * 1024
    assert 150 < per_request < 1000  # not the 4 KiB charged before, measured with the step table


def test_ten_million_requests_without_steps_fit_24_gib(monkeypatch):
    monkeypatch.setattr(limits, "physical_memory_bytes", lambda: 24 << 30)
    M.check_synthetic_workload(1000.0, None, 10_000_000, cfg=SimConfig.for_system("vllm", record_steps=False))
    with pytest.raises(ConfigError, match="1e\\+07 requests"):
        M.check_synthetic_workload(1000.0, None, 10_000_000, cfg=SimConfig.for_system("vllm"))
