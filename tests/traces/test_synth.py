"""Synthetic workloads: paper means, filter, determinism, arrival-process sanity."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.errors import ConfigError
from pagesim.traces.arrivals import arrivals
from pagesim.traces.synth import (fit_paper_workload, inverse_cdf, make_workload, paper_lengths, parse_dist,
                                  sample_lengths)

PAPER = {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}


@pytest.mark.parametrize("name", ["sharegpt", "alpaca"])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_means_within_2pct_of_paper_at_10k(name, seed):
    df = make_workload(name, rate=2.0, num_requests=10_000, seed=seed)
    assert len(df) == 10_000
    mp, mo = PAPER[name]
    assert df["prompt_tokens"].mean() == pytest.approx(mp, rel=0.02)
    assert df["output_tokens"].mean() == pytest.approx(mo, rel=0.02)


@pytest.mark.parametrize("name", ["sharegpt", "alpaca"])
def test_vllm_benchmark_filter_holds(name):
    df = make_workload(name, rate=2.0, num_requests=50_000, seed=3)
    p, o = df["prompt_tokens"].to_numpy(), df["output_tokens"].to_numpy()
    assert p.min() >= 4 and o.min() >= 4
    assert p.max() <= 1024 and (p + o).max() <= 2048


def test_fit_reproduces_exact_means():
    for name, (mp, mo) in PAPER.items():
        fit = fit_paper_workload(name)
        assert fit["prompt_mean"] == pytest.approx(mp, abs=1e-6)
        assert fit["output_mean"] == pytest.approx(mo, abs=1e-6)


def test_lengths_have_a_spread_not_a_constant():
    p, o = paper_lengths("sharegpt", 20_000, np.random.default_rng(0))
    assert np.median(p) < p.mean()  # right-skewed
    assert p.std() > 100 and o.std() > 200
    assert (p + o).max() > 1900  # the 2048 cap is reached


def test_the_bucketed_inverse_cdf_answers_as_a_binary_search():
    """Worked by hand. Table 4, 8, 12, 16 over 16 buckets of width 1 (bucket_bits 4): the answers
    at the edges 0..18 are 0,0,0,0, 1,1,1,1, 2,2,2,2, 3,3,3,3, 4,4,4. A key's bracket runs from the
    edge one bucket below its own to three edges on, and holds one table value or none:
    0 -> bucket 0 (clipped), [0, 0]: 0; 5.5 -> 4, [1, 1]: 1; 7.9 -> 6, [1, 2]: 1 (8 > 7.9); 8 -> 7,
    [1, 2]: 2 (8 <= 8: right of an equal value); 11 -> 10, [2, 3]: 2; 16 -> 15, [3, 4]: 4. Over
    4, 4.5, 12, 16 the bracket of 4.2 (bucket 3: edges 3..6) holds two values, 4 and 4.5, and
    the key is searched as before: 1. Sixteen keys at least, else the table is searched whole."""
    keys = np.array([0.0, 5.5, 7.9, 8.0, 11.0, 16.0] * 3)
    expected = [0, 1, 1, 2, 2, 4] * 3
    table = np.array([4.0, 8.0, 12.0, 16.0])
    assert np.searchsorted(table, keys, side="right").tolist() == expected
    assert inverse_cdf(table, keys, bucket_bits=4).tolist() == expected
    dense = np.array([4.0, 4.5, 12.0, 16.0])
    keys = np.array([4.2, 0.0, 16.0, 13.0] * 4)
    assert inverse_cdf(dense, keys, bucket_bits=4).tolist() == [1, 0, 4, 3] * 4


def test_the_bucketed_inverse_cdf_is_exact_over_the_paper_tables():
    """The prompt and output tables of the built-in workloads, keys drawn as the lengths are
    and keys on the table's own values: every answer that of ``np.searchsorted``."""
    from pagesim.traces.synth import PAPER_WORKLOADS, _output_cums, _prompt_table, _stratified

    rng = np.random.default_rng(5)
    for name in ("sharegpt", "alpaca"):
        fit = fit_paper_workload(name)
        for table in (np.cumsum(_prompt_table(PAPER_WORKLOADS[name], fit["prompt_mu"])),
                      _output_cums(PAPER_WORKLOADS[name], fit["output_mu"])[0]):
            keys = np.concatenate([_stratified(200_000, rng) * table[-1], table, [0.0, table[-1]]])
            assert (inverse_cdf(table, keys) == np.searchsorted(table, keys, side="right")).all()


def test_same_seed_identical_different_seed_differs(tmp_path):
    kw = dict(rate=3.0, duration_s=200.0, arrival="gamma", cv=2.0)
    a = make_workload("sharegpt", seed=11, **kw)
    b = make_workload("sharegpt", seed=11, **kw)
    pd.testing.assert_frame_equal(a, b)
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    c = make_workload("sharegpt", seed=12, **kw)
    assert not a["prompt_tokens"].equals(c["prompt_tokens"])


def test_canonical_columns_and_parallel():
    df = make_workload("alpaca", 1.0, num_requests=10, n=4, beam_width=2)
    assert list(df.columns) == ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "n", "beam_width"]
    assert (df["n"] == 4).all() and (df["beam_width"] == 2).all()
    assert df["request_id"].tolist() == [str(i) for i in range(10)]


def test_poisson_rate_and_cv():
    t = arrivals("poisson", 5.0, num_requests=200_000, rng=np.random.default_rng(0))
    gaps = np.diff(np.r_[0.0, t])
    assert gaps.mean() == pytest.approx(0.2, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_cv(cv):
    t = arrivals("gamma", 2.0, num_requests=200_000, cv=cv, rng=np.random.default_rng(1))
    gaps = np.diff(np.r_[0.0, t])
    assert gaps.mean() == pytest.approx(0.5, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_duration_bounds_and_count():
    t = arrivals("poisson", 10.0, duration_s=1000.0, rng=np.random.default_rng(2))
    assert t.max() < 1000.0 and t.min() > 0 and np.all(np.diff(t) >= 0)
    assert abs(t.size - 10_000) < 5 * np.sqrt(10_000)  # Poisson count, 5 sigma
    both = arrivals("poisson", 10.0, duration_s=1000.0, num_requests=100, rng=np.random.default_rng(2))
    assert both.size == 100
    np.testing.assert_array_equal(both, t[:100])


def test_gamma_keeps_the_mean_rate_over_the_duration():
    # 1 req/s for 5000 s: exactly round(1 x 5000) = 5000 requests, all inside the window, however bursty
    for cv in (0.5, 6.0, 1e3):  # cv 1e3 used to give ~19,000 requests here (and cv 1e6 gigabytes of gaps)
        t = arrivals("gamma", 1.0, duration_s=5000.0, cv=cv, rng=np.random.default_rng(5))
        assert t.size == 5000 and 0 <= t.min() and t.max() < 5000.0 and np.all(np.diff(t) >= 0)
    # without a duration: num_requests over num_requests / rate = 200 s
    t = arrivals("gamma", 2.0, num_requests=400, cv=1e6, rng=np.random.default_rng(5))
    assert t.size == 400 and t.max() < 200.0
    # both: the first num_requests of the duration's round(2 x 60) = 120
    full = arrivals("gamma", 2.0, duration_s=60.0, cv=3.0, rng=np.random.default_rng(1))
    first = arrivals("gamma", 2.0, duration_s=60.0, num_requests=50, cv=3.0, rng=np.random.default_rng(1))
    assert full.size == 120
    np.testing.assert_array_equal(first, full[:50])


def test_million_requests_fast():
    import time
    t0 = time.perf_counter()
    df = make_workload("sharegpt", 100.0, num_requests=1_000_000, seed=0)
    assert len(df) == 1_000_000
    assert time.perf_counter() - t0 < 10.0


def test_length_dists():
    rng = np.random.default_rng(0)
    assert (sample_lengths("constant:128", 5, rng) == 128).all()
    u = sample_lengths("uniform:low=4,high=6", 10_000, rng)
    assert set(np.unique(u)) == {4, 5, 6}
    e = sample_lengths("exponential:mean=300", 100_000, rng)
    assert e.mean() == pytest.approx(300, rel=0.02) and e.min() >= 1
    ln = sample_lengths("lognormal:mean=200,sigma=0.5", 100_000, rng)
    assert ln.mean() == pytest.approx(200, rel=0.02)
    assert parse_dist("exponential:300") == ("exponential", {"mean": 300.0})


def test_empirical_dist_resamples_trace_values(write):
    path = write("l.csv", "num_prefill_tokens,num_decode_tokens\n10,1\n20,2\n30,3\n")
    df = make_workload("custom", 1.0, num_requests=500, prompt_dist=f"empirical:{path}",
                       output_dist=f"empirical:{path}")
    assert set(df["prompt_tokens"]) == {10, 20, 30} and set(df["output_tokens"]) == {1, 2, 3}


def test_bad_workload_args():
    with pytest.raises(ConfigError, match="unknown workload 'sharegtp'"):
        make_workload("sharegtp", 1.0, num_requests=5)
    with pytest.raises(ConfigError, match="custom"):
        make_workload("custom", 1.0, num_requests=5)
    with pytest.raises(ConfigError, match="rate"):
        make_workload("sharegpt", 0.0, num_requests=5)
    with pytest.raises(ConfigError, match="unknown length distribution 'zipf'"):
        parse_dist("zipf:a=2")
    with pytest.raises(ConfigError, match="needs sigma="):
        parse_dist("lognormal:mean=3")
