"""The chatbot workload of Fig. 17 (traces/chatbot.py)."""

from pathlib import Path

import pandas as pd
import pytest

from pagesim.sim.errors import ConfigError
from pagesim.traces import chatbot


def test_pairs_are_resampled_jointly_then_cut():
    lengths = pd.DataFrame({"prompt_tokens": [3000, 500], "output_tokens": [1500, 20]})
    df = chatbot.chatbot_workload(2.0, num_requests=50, seed=1, lengths=lengths)
    assert len(df) == 50 and df["arrival_s"].is_monotonic_increasing
    # (3000, 1500) -> last 1,024 prompt tokens, 1,024 outputs; (500, 20) is untouched
    pairs = set(zip(df["prompt_tokens"], df["output_tokens"]))
    assert pairs == {(1024, 1024), (500, 20)}
    assert (df["n"] == 1).all() and (df["beam_width"] == 1).all()
    again = chatbot.chatbot_workload(2.0, num_requests=50, seed=1, lengths=lengths)
    pd.testing.assert_frame_equal(df, again)  # same seed, same trace


def test_missing_lengths_file_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGESIM_SHAREGPT_LENGTHS", str(tmp_path / "nope.csv"))
    with pytest.raises(ConfigError, match="PAGESIM_SHAREGPT_LENGTHS"):
        chatbot.chatbot_workload(1.0, num_requests=3)


@pytest.mark.skipif(not Path(chatbot.DEFAULT_LENGTHS).is_file(), reason="shared ShareGPT length file absent")
def test_most_real_prompts_reach_the_cut(monkeypatch):
    monkeypatch.delenv("PAGESIM_SHAREGPT_LENGTHS", raising=False)
    df = chatbot.chatbot_workload(1.0, num_requests=2000, seed=0)
    # the paper: "the input prompts for most requests have 1024 tokens"
    assert (df["prompt_tokens"] == 1024).mean() > 0.5
    assert df["prompt_tokens"].max() == 1024 and df["output_tokens"].max() <= 1024


def test_sweep_builds_the_chatbot_trace(monkeypatch):
    from pagesim.experiments import run_spec
    from pagesim.experiments.run_spec import RunSpec, simulate_spec
    lengths = pd.DataFrame({"prompt_tokens": [3000], "output_tokens": [7]})
    real = chatbot.chatbot_workload
    # patched where simulate_spec looks them up (run_spec imports both at its top)
    monkeypatch.setattr(run_spec, "chatbot_workload", lambda *a, **k: real(*a, **k, lengths=lengths))
    seen = {}
    monkeypatch.setattr(run_spec, "run_simulation", lambda cfg, trace, progress=False, **k: seen.setdefault("trace", trace))
    simulate_spec(RunSpec(system="vllm", workload="chatbot", rate=1.0, num_requests=4))
    assert seen["trace"]["prompt_tokens"].tolist() == [1024] * 4 and seen["trace"]["output_tokens"].tolist() == [7] * 4
    with pytest.raises(ConfigError, match="one sequence per request"):
        simulate_spec(RunSpec(system="vllm", workload="chatbot", rate=1.0, num_requests=4, n=2))
