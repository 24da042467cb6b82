"""The requests of an inference-perf shared_prefix run rebuilt from its settings
(traces/inference_perf.py), on tiny runs stated by hand as a RealRun: stage sizes, arrivals,
which prompt each request sends, prefix hashes, output lengths, stage starts."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.errors import ConfigError
from pagesim.traces.inference_perf import (HASH_BLOCK_TOKENS, STAGE_START_DELAY_S, inference_perf_trace,
                                           quantile_lengths, stage_starts)
from pagesim.traces.real_runs import RealRun

GROUPS, PER_GROUP = 2, 2
NUM_PROMPTS = GROUPS * PER_GROUP


def tiny_run(**changes) -> RealRun:
    """2 groups x 2 prompts of a 32-token system prompt and a 40-token question, 8 out with
    ignore_eos; stage 0 sends 2/s for 5 s (10 requests), stage 1 4.5/s for 3 s (13.5 -> 13).
    The client counted prompts of 70..78 tokens, so the 4 prompts get the lengths at quantiles
    0.125, 0.375, 0.625, 0.875 of min 70, p25 72, median 74, p75 76, max 78: 71, 73, 75, 77.
    ``changes``: workload keys to set (None: remove)."""
    workload = {"load.type": "constant", "stages": 2, "load.interval": 1.0,
                "stage.0.rate": 2.0, "stage.0.duration": 5.0, "stage.1.rate": 4.5, "stage.1.duration": 3.0,
                "shared_prefix.num_groups": GROUPS, "shared_prefix.num_prompts_per_group": PER_GROUP,
                "shared_prefix.system_prompt_len": 32, "shared_prefix.question_len": 40,
                "shared_prefix.output_len": 8, "ignore_eos": True,
                "prompt_len.min": 70.0, "prompt_len.p25": 72.0, "prompt_len.median": 74.0, "prompt_len.p75": 76.0,
                "prompt_len.max": 78.0, "output_len.min": 5.0, "output_len.median": 5.0, "output_len.max": 5.0}
    for k, v in changes.items():
        if v is None:
            workload.pop(k)
        else:
            workload[k] = v
    return RealRun("tiny", "inference-perf", "tiny-run", engine={"model": "llama-2-7b"}, workload=workload)


def stage(df: pd.DataFrame, s: int) -> pd.DataFrame:
    return df[df["stage"] == s].reset_index(drop=True)


def test_stage_sizes_int_of_rate_times_duration():
    """Stage s sends int(rate x duration) requests, truncated as inference-perf does (4.5/s x 3 s
    = 13.5 -> 13), ids s{stage}-{j}; columns: the canonical ones, prefix_hashes and stage."""
    df = inference_perf_trace(tiny_run(), seed=0)
    assert df["stage"].tolist() == [0] * 10 + [1] * 13
    assert df["request_id"].tolist() == [f"s0-{j}" for j in range(10)] + [f"s1-{j}" for j in range(13)]
    assert list(df.columns) == ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "prefix_hashes",
                                "stage"]
    assert df.attrs["hash_block_tokens"] == HASH_BLOCK_TOKENS == 16
    one = inference_perf_trace(tiny_run(**{"stage.0.rate": 2.5, "stage.0.duration": 3.0}), seed=0)
    assert (one["stage"] == 0).sum() == 7  # 7.5 -> 7


def test_constant_arrivals_end_exactly_at_the_stages_duration():
    """constant load: the exponential gaps are scaled to sum to the duration, so the last send of
    a stage is exactly its clock start + duration; sends increase; stage 0's clock starts 1 s in."""
    df = inference_perf_trace(tiny_run(), seed=3)
    starts = df.attrs["stage_starts"]
    assert starts[0] == STAGE_START_DELAY_S == 1.0
    for s, duration in ((0, 5.0), (1, 3.0)):
        t = stage(df, s)["arrival_s"].to_numpy()
        assert np.all(np.diff(t) > 0)
        assert t[0] > starts[s]
        assert t[-1] == pytest.approx(starts[s] + duration, abs=1e-9)
    # stage 1 long after stage 0 (an idle gap no drain reaches)
    assert starts[1] > starts[0] + 5.0 + 100


def test_poisson_arrivals_count_and_span():
    """poisson load sends int(rate x duration) requests too, in increasing order, from its clock
    start on."""
    df = inference_perf_trace(tiny_run(**{"load.type": "poisson"}), seed=1)
    for s, n in ((0, 10), (1, 13)):
        t = stage(df, s)["arrival_s"].to_numpy()
        assert len(t) == n and np.all(np.diff(t) >= 0) and t[0] > df.attrs["stage_starts"][s]


def test_explicit_starts_shift_a_stage_and_nothing_else():
    """``starts`` sets each stage's clock start: the same seed gives the same gaps, shifted by the
    start's difference; the prompts sent do not change."""
    a = inference_perf_trace(tiny_run(), seed=5, starts=[1.0, 30.0])
    b = inference_perf_trace(tiny_run(), seed=5, starts=[2.0, 500.0])
    assert a.attrs["stage_starts"] == [1.0, 30.0] and b.attrs["stage_starts"] == [2.0, 500.0]
    np.testing.assert_allclose(stage(b, 0)["arrival_s"] - stage(a, 0)["arrival_s"], 1.0)
    np.testing.assert_allclose(stage(b, 1)["arrival_s"] - stage(a, 1)["arrival_s"], 470.0)
    for col in ("request_id", "prompt_tokens", "output_tokens", "prefix_hashes", "stage"):
        assert a[col].tolist() == b[col].tolist()


def test_request_j_sends_prompt_j_mod_groups_times_prompts():
    """Request j of every stage sends prompt j mod (groups x prompts per group): j and j + 4 carry
    the same length and prefix hashes; the first 4 of a stage are 4 distinct prompts with the
    lengths 71, 73, 75, 77 in some order; both stages send the same prompts in the same order."""
    df = inference_perf_trace(tiny_run(), seed=2)
    s0, s1 = stage(df, 0), stage(df, 1)
    for part in (s0, s1):
        for j in range(NUM_PROMPTS, len(part)):
            assert part.loc[j, "prefix_hashes"] == part.loc[j - NUM_PROMPTS, "prefix_hashes"]
            assert part.loc[j, "prompt_tokens"] == part.loc[j - NUM_PROMPTS, "prompt_tokens"]
        assert sorted(part["prompt_tokens"][:NUM_PROMPTS]) == [71, 73, 75, 77]
        assert len(set(part["prefix_hashes"][:NUM_PROMPTS])) == NUM_PROMPTS
    assert s0["prefix_hashes"].tolist() == s1["prefix_hashes"][:10].tolist()
    assert s0["prompt_tokens"].tolist() == s1["prompt_tokens"][:10].tolist()


def test_prefix_hashes_shared_within_a_group_only():
    """Each prompt names its full 16-token blocks (71..77 tokens: 4). The client's tokens per drawn
    token, (median 74 - BOS) / (32 + 40) = 73/72, make the shared system prompt 1 + round(32 x
    73/72) = 33 tokens: its 2 full blocks carry the group's ids, the other 2 the prompt's own.
    So two prompts of one group share exactly their 2 leading ids; prompts of different groups
    share none; each group has 2 prompts."""
    df = inference_perf_trace(tiny_run(), seed=4)
    assert df.attrs["shared_prefix_tokens"] == 33
    prompts = stage(df, 0)["prefix_hashes"][:NUM_PROMPTS].tolist()
    assert all(len(h) == 4 for h in prompts)
    same_group = 0
    for h, k in itertools.combinations(prompts, 2):
        common = set(h) & set(k)
        if common:
            same_group += 1
            assert h[:2] == k[:2] and common == set(h[:2])
        else:
            assert h[:2] != k[:2]
    assert same_group == GROUPS * (PER_GROUP * (PER_GROUP - 1) // 2)  # 2 pairs
    assert len({h[:2] for h in prompts}) == GROUPS


def test_system_prompt_shorter_than_a_block_shares_nothing():
    """A system prompt (with BOS) under one 16-token block has no full block to share: every id
    is the prompt's own; with no system prompt at all the shared part is 0 tokens."""
    short = inference_perf_trace(tiny_run(**{"shared_prefix.system_prompt_len": 8}), seed=0)
    none = inference_perf_trace(tiny_run(**{"shared_prefix.system_prompt_len": 0}), seed=0)
    assert none.attrs["shared_prefix_tokens"] == 0
    for df in (short, none):
        prompts = stage(df, 0)["prefix_hashes"][:NUM_PROMPTS].tolist()
        for h, k in itertools.combinations(prompts, 2):
            assert not set(h) & set(k)


def test_outputs_with_and_without_ignore_eos():
    """With ignore_eos every request generates output_len (8); without it the outputs take the
    client's output_len quantiles (all 5 -> all 5; min 2, median 6, max 10 -> the 4 prompts get
    3, 5, 7, 9), each prompt keeping its output on every repeat."""
    assert set(inference_perf_trace(tiny_run(), seed=0)["output_tokens"]) == {8}
    assert set(inference_perf_trace(tiny_run(ignore_eos=False), seed=0)["output_tokens"]) == {5}
    varied = inference_perf_trace(tiny_run(**{"ignore_eos": False, "output_len.min": 2.0, "output_len.median": 6.0,
                                              "output_len.max": 10.0}), seed=0)
    s0 = stage(varied, 0)
    assert sorted(s0["output_tokens"][:NUM_PROMPTS]) == [3, 5, 7, 9]
    for j in range(NUM_PROMPTS, len(s0)):
        assert s0.loc[j, "output_tokens"] == s0.loc[j - NUM_PROMPTS, "output_tokens"]


def test_seeded():
    """The same seed gives the same trace; another seed other sends."""
    a, b = inference_perf_trace(tiny_run(), seed=7), inference_perf_trace(tiny_run(), seed=7)
    pd.testing.assert_frame_equal(a, b)
    assert a.attrs == b.attrs
    c = inference_perf_trace(tiny_run(), seed=8)
    assert not np.allclose(a["arrival_s"], c["arrival_s"])


def test_quantile_lengths_hand_worked():
    """count lengths at quantiles (i + 0.5) / count, interpolated linearly between the stated
    quantiles: min 10, median 20, max 30 and count 2 -> q 0.25, 0.75 -> 15, 25; count 5 -> q 0.1,
    0.3, 0.5, 0.7, 0.9 -> 12, 16, 20, 24, 28; one stated quantile -> that length (at least 1);
    none -> ConfigError naming the run."""
    run = RealRun("q", "inference-perf", "q-run",
                  workload={"prompt_len.min": 10.0, "prompt_len.median": 20.0, "prompt_len.max": 30.0,
                            "output_len.median": 0.2})
    assert quantile_lengths(run, "prompt_len", 2).tolist() == [15, 25]
    assert quantile_lengths(run, "prompt_len", 5).tolist() == [12, 16, 20, 24, 28]
    assert quantile_lengths(run, "output_len", 3).tolist() == [1, 1, 1]
    with pytest.raises(ConfigError, match="q-run.*no prompt_len quantiles"):
        quantile_lengths(RealRun("q", "inference-perf", "q-run", workload={}), "prompt_len", 2)


def test_stage_starts_hand_worked():
    """Stage s + 1's clock starts load.interval + 1 s after stage s's last request finished on
    the client's clock: interval 1.0, stage 0 starts at 1.0 and (in a replay whose stage 0
    clock started at 1.0) finishes at 12.5 -> stage 1 at 1.0 + 11.5 + 1.0 + 1.0 = 14.5; stage 1,
    replayed from 10020.0 to 10025.0, -> stage 2 at 14.5 + 5.0 + 2.0 = 21.5."""
    three = tiny_run(stages=3, **{"stage.2.rate": 1.0, "stage.2.duration": 2.0})
    assert stage_starts(three, [12.5, 10025.0, 0.0], [1.0, 10020.0, 0.0]) == [1.0, 14.5, 21.5]
    assert stage_starts(tiny_run(**{"load.interval": 0.0}), [12.5, 0.0], [1.0, 0.0]) == [1.0, 13.5]
