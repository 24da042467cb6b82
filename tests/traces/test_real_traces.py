"""The public traces in ../shared/traces (skipped when that folder is absent)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from pagesim.sim.cli import main
from pagesim.traces.loaders import load_trace
from pagesim.traces.stats import trace_stats


def test_azure_conv(shared_trace):
    t0 = time.perf_counter()
    df = load_trace(shared_trace("AzureLLMInferenceTrace_conv.csv"))
    st = trace_stats(df)
    assert time.perf_counter() - t0 < 1.0
    assert len(df) == 19366 and df.attrs["load_report"]["format"] == "azure"
    assert df["arrival_s"].iloc[0] == 0.0
    assert st["duration_s"] == pytest.approx(3501.7, abs=0.1)
    assert st["rate_rps"] == pytest.approx(5.530, abs=0.001)
    assert st["prompt_tokens"]["mean"] == pytest.approx(1154.7, abs=0.05)
    assert st["output_tokens"]["p50"] == 129 and st["prompt_tokens"]["max"] == 14050
    assert st["interarrival_cv"] == pytest.approx(1.09, abs=0.01)


def test_azure_code(shared_trace):
    st = trace_stats(load_trace(shared_trace("AzureLLMInferenceTrace_code.csv")))
    assert st["rows"] == 8819 and st["rate_rps"] == pytest.approx(2.566, abs=0.001)


def test_mooncake(shared_trace):
    df = load_trace(shared_trace("mooncake_conversation_trace.jsonl"))
    assert len(df) == 12031
    lens = df["prefix_hashes"].map(len).to_numpy()
    np.testing.assert_array_equal(lens, np.ceil(df["prompt_tokens"].to_numpy() / 512).astype(int))
    assert df["arrival_s"].nunique() == 1180
    st = trace_stats(df)
    assert st["prefix_blocks"]["total"] == 288_500 and st["prefix_blocks"]["unique"] == 182_790
    spread = load_trace(shared_trace("mooncake_conversation_trace.jsonl"), spread_timestamps=True)
    assert spread["arrival_s"].nunique() == 12031
    assert np.all(np.diff(spread["arrival_s"]) >= 0)
    assert np.abs(spread["arrival_s"] - df["arrival_s"]).max() < 3.01  # stays within the 3 s step
    assert trace_stats(spread)["interarrival_cv"] < trace_stats(df)["interarrival_cv"]


def test_sharegpt_lengths(shared_trace):
    df = load_trace(shared_trace("sharegpt_8k_filtered_stats_llama2_tokenizer.csv"), rate=3.0)
    assert len(df) == 30731 and df.attrs["load_report"]["format"] == "lengths"
    assert df["prompt_tokens"].mean() == pytest.approx(2340.0, abs=0.05)
    assert trace_stats(df)["rate_rps"] == pytest.approx(3.0, rel=0.05)


def test_cli_stats_json_azure(shared_trace, capsys):
    assert main(["trace", "stats", str(shared_trace("AzureLLMInferenceTrace_conv.csv")), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["rows"] == 19366 and math.isclose(st["rate_rps"], 5.530, abs_tol=1e-3)
