"""benchmarks/validation_cost_models.py: the score of a cost model against measured decode steps,
worked by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import validation_cost_models as vcm  # noqa: E402


class Flat:
    """Prices a decode step at 1 ms + 1 ms per sequence, of which 0.5 ms is host time."""
    overhead_s = 0.5e-3
    per_seq_overhead_s = 0.0

    def step_time(self, batch):
        return 1e-3 * (1 + batch.num_seqs)


def test_score_by_hand():
    # step 1: price 2 ms, measured 4 ms (-50 %), GPU part 1.5 ms vs 3 ms device (-50 %)
    # step 2: price 3 ms, measured 2 ms (+50 %), GPU part 2.5 ms vs 2 ms device (+25 %)
    # step 3: price 4 ms, measured 4 ms (0), GPU part 3.5 ms vs 3.5 ms (0)
    steps = pd.DataFrame({"num_decode_seqs": [1, 2, 3], "sum_decode_context": [10, 20, 30],
                          "measured_s": [4e-3, 2e-3, 4e-3], "measured_gpu_s": [3e-3, 2e-3, 3.5e-3]})
    r = vcm.score(steps, Flat())
    assert r["median"] == pytest.approx(0.5) and r["bias"] == pytest.approx(0.0)
    assert r["gpu_median"] == pytest.approx(0.25) and r["gpu_bias"] == pytest.approx(0.0)
    assert r["p90"] == pytest.approx(0.5)  # |errors| 0.5, 0.5, 0: the 90th percentile is 0.5


def test_the_tests_import_the_simulator_where_its_warm_up_does():
    """This module put the benchmarks' link to the checkout first on sys.path as it was imported
    (benchmarks/_import_path.py); the simulator's modules still come from where the suite's
    warm-up imports them (tests/conftest.py), so numba's cache folders, named by the modules'
    paths, are the ones the warm-up filled."""
    import sys

    from pagesim.sim.core.events import loop

    assert any("pagesim-import-" in entry for entry in sys.path)
    assert "pagesim-import-" not in loop.__file__
