"""Today's engines' features under random configurations (``tests/sim/feature_space.py``): every
seed of a fixed sample ends with each request finished or rejected with a reason, or is refused
in one line, checked every iteration; in the suite the core is bounds-checked
(``tests/checked_core.py``), so a write past a table fails here as an ``IndexError``. The whole
hunt: ``python -m tests.sim.feature_space --count 5000``."""

from __future__ import annotations

import os

import pytest

from tests.sim.feature_space import RESERVATION_SYSTEMS, STRETCH, case, outcome, paged_case

SAMPLE = int(os.environ.get("PAGESIM_FEATURE_SEEDS", "80"))


@pytest.mark.parametrize("seed", range(SAMPLE))
def test_a_drawn_configuration_ends_or_is_refused_in_one_line(seed):
    kind, why = outcome(seed)
    assert kind in ("ok", "refused"), f"seed {seed}: {kind}: {why}"


def test_the_sample_draws_every_reservation_system():
    if SAMPLE < 80:
        pytest.skip("a sample smaller than the suite's")
    drawn = {case(seed)[0] for seed in range(SAMPLE)}
    assert set(RESERVATION_SYSTEMS) <= drawn, set(RESERVATION_SYSTEMS) - drawn


def test_the_sample_stretches_some_seeds():
    """A stretched seed's sequence limit is STRETCH times its paged draw's; the suite's sample
    holds some."""
    if SAMPLE < 80:
        pytest.skip("a sample smaller than the suite's")
    long = [seed for seed in range(SAMPLE)
            if case(seed)[1]["max_seq_len"] == STRETCH * paged_case(seed)[1]["max_seq_len"]]
    assert len(long) >= 4, long
