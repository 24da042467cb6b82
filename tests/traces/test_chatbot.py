"""The chatbot workloads: Fig. 17's and DistServe's (traces/chatbot.py)."""

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


def test_distserve_keeps_the_artifacts_pairs_whole():
    # the artifact drops a pair at prompt + output >= 2,048 and when both sides are under 4
    # tokens; it cuts nothing (a 1,500-token prompt stays whole, unlike the vLLM paper's rule)
    lengths = pd.DataFrame({"prompt_tokens": [1500, 1500, 3, 3, 2, 2043],
                            "output_tokens": [547, 548, 3, 4, 500, 5]})
    kept = chatbot.distserve_lengths(lengths)
    assert list(zip(kept["prompt_tokens"], kept["output_tokens"])) == [(1500, 547), (3, 4), (2, 500)]
    df = chatbot.chatbot_workload(2.0, num_requests=200, seed=1, lengths=lengths,
                                  variant="chatbot-distserve")
    assert set(zip(df["prompt_tokens"], df["output_tokens"])) == {(1500, 547), (3, 4), (2, 500)}
    assert df.attrs["workload"]["workload"] == "chatbot-distserve"
    with pytest.raises(ConfigError, match="no .* pair of the length file is kept"):
        chatbot.chatbot_workload(1.0, num_requests=3, lengths=lengths.iloc[[1, 2]],
                                 variant="chatbot-distserve")


def test_missing_lengths_file_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGESIM_SHAREGPT_LENGTHS", str(tmp_path / "nope.csv"))
    with pytest.raises(ConfigError, match="PAGESIM_SHAREGPT_LENGTHS"):
        chatbot.chatbot_workload(1.0, num_requests=3)


def test_the_lengths_are_found_beside_the_repository_or_by_pagesim_shared(monkeypatch, tmp_path):
    """No machine's path: without the variables the file is ../shared/traces/ from the
    repository's root; PAGESIM_SHARED names another shared folder; absent, one line."""
    monkeypatch.delenv("PAGESIM_SHAREGPT_LENGTHS", raising=False)
    monkeypatch.delenv("PAGESIM_SHARED", raising=False)
    root = Path(chatbot.__file__).resolve().parents[1]
    assert chatbot.shared_dir() == root.parent / "shared"
    monkeypatch.setenv("PAGESIM_SHARED", str(tmp_path))
    with pytest.raises(ConfigError) as e:
        chatbot.lengths_path()
    assert str(e.value) == (f"the chatbot workload needs ShareGPT request lengths: {tmp_path}/traces/"
                            f"{chatbot.LENGTHS_NAME} not found (set PAGESIM_SHAREGPT_LENGTHS to "
                            f"{chatbot.LENGTHS_NAME}, or PAGESIM_SHARED to its shared folder)")
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / chatbot.LENGTHS_NAME).write_text("prompt_tokens,output_tokens\n5,6\n")
    assert chatbot.lengths_path() == tmp_path / "traces" / chatbot.LENGTHS_NAME


@pytest.mark.skipif(not (chatbot.shared_dir() / "traces" / chatbot.LENGTHS_NAME).is_file(),
                    reason="shared ShareGPT length file absent")
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
    # DistServe's variant by its name: the 3,007-token pair is dropped, not cut
    lengths = pd.DataFrame({"prompt_tokens": [3000, 900], "output_tokens": [7, 8]})
    seen.clear()
    simulate_spec(RunSpec(system="vllm", workload="chatbot-distserve", rate=1.0, num_requests=4))
    assert seen["trace"]["prompt_tokens"].tolist() == [900] * 4
