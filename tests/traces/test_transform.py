"""Transformations with exact hand-computed results."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.errors import ConfigError, TraceError
from pagesim.traces.transform import apply_max_len_policy, sample, scale_rate, set_parallel, time_slice


@pytest.fixture
def df():
    d = pd.DataFrame({"request_id": [str(i) for i in range(6)],
                      "arrival_s": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
                      "prompt_tokens": np.array([10, 90, 50, 100, 120, 30], dtype=np.int64),
                      "output_tokens": np.array([10, 20, 50, 1, 5, 70], dtype=np.int64)})
    d.attrs["source"] = "t.csv"
    return d


def test_time_slice_rezeroes(df):
    out = time_slice(df, 1.5, 4.0)
    assert out["request_id"].tolist() == ["2", "3"]
    assert out["arrival_s"].tolist() == [0.5, 1.5]
    assert df["arrival_s"].tolist()[0] == 0.0  # input untouched
    assert time_slice(df, 4.0)["request_id"].tolist() == ["4", "5"]
    assert time_slice(df, None, 1.0)["request_id"].tolist() == ["0"]
    assert out.attrs["source"] == "t.csv"
    with pytest.raises(ConfigError):
        time_slice(df, 3.0, 2.0)


def test_scale_rate(df):
    out = scale_rate(df, 2.0)
    assert out["arrival_s"].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert df["arrival_s"].iloc[1] == 1.0
    with pytest.raises(ConfigError):
        scale_rate(df, 0)


def test_sample(df):
    a = sample(df, fraction=0.5, seed=1)
    assert len(a) == 3
    assert np.all(np.diff(a["arrival_s"]) >= 0)  # arrival order kept
    assert set(a["request_id"]) <= set(df["request_id"])
    pd.testing.assert_frame_equal(a, sample(df, fraction=0.5, seed=1))
    assert len(sample(df, count=4)) == 4 and len(sample(df, count=100)) == 6
    with pytest.raises(ConfigError):
        sample(df, fraction=1.5)


def test_set_parallel(df):
    out = set_parallel(df, n=3)
    assert (out["n"] == 3).all() and "beam_width" not in out.columns
    out = set_parallel(out, beam_width=4)
    assert (out["n"] == 3).all() and (out["beam_width"] == 4).all()
    with pytest.raises(ConfigError):
        set_parallel(df, n=0)


def test_max_len_error_names_first_offending_row(df):
    # sums: 20, 110, 100, 101, 125, 100; max 100 -> rows 2, 4, 5 offend
    with pytest.raises(TraceError) as ei:
        apply_max_len_policy(df, 100, "error")
    assert ei.value.row == 2 and ei.value.path == "t.csv"
    assert "110" in str(ei.value) and "3 such requests" in str(ei.value)


def test_max_len_drop(df):
    out, rep = apply_max_len_policy(df, 100, "drop")
    assert rep == {"policy": "drop", "max_seq_len": 100, "affected": 3, "dropped": 3, "truncated": 0}
    assert out["request_id"].tolist() == ["0", "2", "5"]


def test_max_len_truncate(df):
    out, rep = apply_max_len_policy(df, 100, "truncate")
    assert rep == {"policy": "truncate", "max_seq_len": 100, "affected": 3, "dropped": 0, "truncated": 3}
    # row 1: 90+20 -> output 10; row 3: 100+1 -> prompt 99, output 1; row 4: 120+5 -> 99+1
    assert out["prompt_tokens"].tolist() == [10, 90, 50, 99, 99, 30]
    assert out["output_tokens"].tolist() == [10, 10, 50, 1, 1, 70]
    assert ((out["prompt_tokens"] + out["output_tokens"]) <= 100).all()
    assert df["output_tokens"].tolist()[1] == 20  # input untouched


def test_max_len_nothing_to_do(df):
    out, rep = apply_max_len_policy(df, 1000, "error")
    assert out is df and rep["affected"] == 0


def test_truncate_clips_prefix_hashes():
    d = pd.DataFrame({"request_id": ["a"], "arrival_s": [0.0], "prompt_tokens": np.array([1100]),
                      "output_tokens": np.array([5]), "prefix_hashes": pd.Series([(1, 2, 3)], dtype=object)})
    d.attrs["hash_block_tokens"] = 512
    out, _ = apply_max_len_policy(d, 600, "truncate")
    assert out["prompt_tokens"].tolist() == [599] and out["prefix_hashes"].tolist() == [(1, 2)]


def test_unknown_policy(df):
    with pytest.raises(ConfigError, match="unknown max-len policy"):
        apply_max_len_policy(df, 100, "clip")


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 3000)), min_size=1, max_size=40),
       st.integers(2, 2048))
def test_truncate_invariants(pairs, max_len):
    p = np.array([a for a, _ in pairs], dtype=np.int64)
    o = np.array([b for _, b in pairs], dtype=np.int64)
    d = pd.DataFrame({"request_id": [str(i) for i in range(len(p))], "arrival_s": np.arange(len(p), dtype=float),
                      "prompt_tokens": p, "output_tokens": o})
    over = p + o > max_len
    out, rep = apply_max_len_policy(d, max_len, "truncate")
    np_, no = out["prompt_tokens"].to_numpy(), out["output_tokens"].to_numpy()
    assert rep["truncated"] == rep["affected"] == int(over.sum()) and len(out) == len(d)
    assert (np_ + no <= max_len).all() and (np_ >= 1).all() and (no >= 1).all()
    np.testing.assert_array_equal(np_[~over], p[~over])
    np.testing.assert_array_equal(no[~over], o[~over])
    # prompts are kept whenever they fit with one output token; then outputs fill the rest exactly
    keep = over & (p < max_len)
    np.testing.assert_array_equal(np_[keep], p[keep])
    np.testing.assert_array_equal((np_ + no)[over], np.full(int(over.sum()), max_len))
    dropped, drep = apply_max_len_policy(d, max_len, "drop")
    assert len(dropped) == len(d) - int(over.sum()) == len(d) - drep["dropped"]


def test_max_len_clip_prompt(df):
    out, rep = apply_max_len_policy(df, 100, "clip-prompt")
    assert rep == {"policy": "clip-prompt", "max_seq_len": 100, "affected": 3, "dropped": 0, "truncated": 3}
    # row 1: 90+20 -> prompt 100-20 = 80 (its last 80 tokens), output 20; row 3: 100+1 -> 99+1;
    # row 4: 120+5 -> 95+5; outputs untouched
    assert out["prompt_tokens"].tolist() == [10, 80, 50, 99, 95, 30]
    assert out["output_tokens"].tolist() == [10, 20, 50, 1, 5, 70]


def test_clip_prompt_clips_an_output_that_fills_the_limit_and_drops_clipped_hashes():
    d = pd.DataFrame({"request_id": ["a", "b", "c"], "arrival_s": [0.0, 1.0, 2.0],
                      "prompt_tokens": np.array([700, 10, 100]), "output_tokens": np.array([5, 800, 5]),
                      "prefix_hashes": pd.Series([(1, 2), (3,), (4,)], dtype=object)})
    d.attrs["hash_block_tokens"] = 512
    out, _ = apply_max_len_policy(d, 600, "clip-prompt")
    # a: 700+5 -> 595+5, its start gone with its hashes; b: output 800 alone > 600 -> 599, prompt 1;
    # c fits and keeps everything
    assert out["prompt_tokens"].tolist() == [595, 1, 100] and out["output_tokens"].tolist() == [5, 599, 5]
    assert out["prefix_hashes"].tolist() == [(), (), (4,)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 3000)), min_size=1, max_size=40),
       st.integers(2, 2048))
def test_clip_prompt_invariants(pairs, max_len):
    p = np.array([a for a, _ in pairs], dtype=np.int64)
    o = np.array([b for _, b in pairs], dtype=np.int64)
    d = pd.DataFrame({"request_id": [str(i) for i in range(len(p))], "arrival_s": np.arange(len(p), dtype=float),
                      "prompt_tokens": p, "output_tokens": o})
    over = p + o > max_len
    out, _ = apply_max_len_policy(d, max_len, "clip-prompt")
    np_, no = out["prompt_tokens"].to_numpy(), out["output_tokens"].to_numpy()
    assert (np_ >= 1).all() and (no >= 1).all() and (np_ + no <= max_len).all()
    np.testing.assert_array_equal(np_[~over], p[~over])
    fits = over & (o < max_len)  # outputs are kept whenever they leave room for one prompt token
    np.testing.assert_array_equal(no[fits], o[fits])
    np.testing.assert_array_equal((np_ + no)[over], np.full(int(over.sum()), max_len))


def test_keep_last_prompt_tokens_cuts_prompts_and_caps_outputs(df):
    from pagesim.traces.transform import keep_last_prompt_tokens
    # prompts 10 90 50 100 120 30 -> last 50 tokens; outputs 10 20 50 1 5 70 -> at most 20
    out = keep_last_prompt_tokens(df, 50, 20)
    assert out["prompt_tokens"].tolist() == [10, 50, 50, 50, 50, 30]
    assert out["output_tokens"].tolist() == [10, 20, 20, 1, 5, 20]
    assert df["prompt_tokens"].tolist() == [10, 90, 50, 100, 120, 30]  # input untouched
    assert out.attrs["source"] == "t.csv"
    assert keep_last_prompt_tokens(df, 50)["output_tokens"].tolist() == df["output_tokens"].tolist()
    with pytest.raises(ConfigError, match="max_prompt_tokens must be an integer >= 1"):
        keep_last_prompt_tokens(df, 0)


def test_keep_last_prompt_tokens_drops_the_hashes_of_cut_prompts():
    from pagesim.traces.transform import keep_last_prompt_tokens
    d = pd.DataFrame({"request_id": ["a", "b"], "arrival_s": [0.0, 1.0], "prompt_tokens": np.array([1100, 600]),
                      "output_tokens": np.array([5, 5]), "prefix_hashes": pd.Series([(1, 2, 3), (4, 5)], dtype=object)})
    out = keep_last_prompt_tokens(d, 1024)
    # the cut prompt starts mid-history: none of its hashed blocks is its prefix any more
    assert out["prompt_tokens"].tolist() == [1024, 600] and out["prefix_hashes"].tolist() == [(), (4, 5)]


def test_repeat_keeps_the_mean_rate_and_gives_each_copy_its_own_ids_and_prefixes():
    """Three requests at 0, 1, 2 s (mean rate (3 - 1) / 2 = 1 req/s): copy 1 starts one period
    later, 2 * 3 / 2 = 3 s, so six requests at 0..5 s keep 1 req/s. Requests sharing a prefix
    within a copy still share it; across copies they do not."""
    from pagesim.traces.transform import repeat

    df = pd.DataFrame({"request_id": ["a", "b", "c"], "arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [4, 4, 4],
                       "output_tokens": [2, 2, 2], "prefix_hashes": [(1, 2), (1, 3), ()]})
    out = repeat(df, 2)
    assert out["arrival_s"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert out["request_id"].tolist() == ["a", "b", "c", "a#1", "b#1", "c#1"]
    h = out["prefix_hashes"].tolist()
    assert h[:3] == [(1, 2), (1, 3), ()] and h[3][0] == h[4][0] and h[5] == ()
    assert not set(h[3] + h[4]) & {1, 2, 3}
    assert repeat(df, 1) is df
    with pytest.raises(ConfigError, match="whole number >= 1"):
        repeat(df, 1.5)
