"""A published offline benchmark replayed (pagesim validate --against published_throughput):
the ShareGPT sample rebuilt from its counts (traces/sharegpt_sample.py) and the replay's system
and cost model named by the table (experiments/real_validate.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.experiments.real_validate import replay_config, validate_run
from pagesim.experiments.validate_cli import shipped_table
from pagesim.sim.cli import main
from pagesim.sim.errors import TraceError
from pagesim.traces.real_runs import RealRun, read_real_runs
from pagesim.traces.sharegpt_sample import FORMAT, sharegpt_sample_trace


def sample_run(**workload) -> RealRun:
    wl = {"num_prompts": 5000, "prompt_tokens_mean": 226.0932, "output_tokens_mean": 194.3226, **workload}
    return RealRun("bench", FORMAT, "table.csv", engine={"model": "llama-3.1-8b"}, workload=wl,
                   measured={"overall": {"requests_per_s": 20.0}}, info={"gpu": "a100-80gb"})


def test_the_sample_has_the_published_counts_under_the_benchmarks_filter():
    """5,000 prompts sent at 0, their means the sample's (1,130,466 / 5,000 and 971,613 / 5,000
    tokens) within 1 %, each prompt 4-1,024 tokens and at most 2,048 with its answer."""
    trace = sharegpt_sample_trace(sample_run(), seed=0)
    assert len(trace) == 5000 and (trace["arrival_s"] == 0).all() and (trace["stage"] == 0).all()
    assert trace["prompt_tokens"].mean() == pytest.approx(1_130_466 / 5000, rel=0.01)
    assert trace["output_tokens"].mean() == pytest.approx(971_613 / 5000, rel=0.01)
    assert trace["prompt_tokens"].between(4, 1024).all() and trace["output_tokens"].ge(4).all()
    assert (trace["prompt_tokens"] + trace["output_tokens"]).le(2048).all()
    again = sharegpt_sample_trace(sample_run(), seed=0)
    pd.testing.assert_frame_equal(trace, again)
    assert not np.array_equal(sharegpt_sample_trace(sample_run(), seed=1)["prompt_tokens"], trace["prompt_tokens"])


@pytest.mark.parametrize("workload,field,message", [
    ({"num_prompts": 0}, "workload.num_prompts", "must be a whole number > 0"),
    ({"num_prompts": 2.5}, "workload.num_prompts", "must be a whole number > 0"),
    ({"num_prompts": "abc"}, "workload.num_prompts", "expected a number, got 'abc'"),
    ({"output_tokens_mean": None}, "workload.output_tokens_mean", "missing"),
    ({"prompt_tokens_mean": "x"}, "workload.prompt_tokens_mean", "expected a number"),
    # the filter keeps prompts of at most 1,024 tokens: no mean of 5,000; nor of 1 (at least 4)
    ({"prompt_tokens_mean": 5000}, "workload.prompt_tokens_mean", "cannot be the mean"),
    ({"output_tokens_mean": 1}, "workload.output_tokens_mean", "cannot be the mean"),
])
def test_a_sample_missing_or_misstating_its_counts_is_refused(workload, field, message):
    run = sample_run(**workload)
    run.workload = {k: v for k, v in run.workload.items() if v is not None}
    with pytest.raises(TraceError, match=field) as e:
        sharegpt_sample_trace(run, seed=0)
    assert message in str(e.value)


def test_a_sample_without_its_measured_throughput_is_refused():
    run = sample_run()
    run.measured = {"overall": {}}
    with pytest.raises(TraceError, match="measured overall.requests_per_s"):
        sharegpt_sample_trace(run, seed=0)


def test_the_table_names_the_system_and_cost_model_that_replay_a_run():
    """A row replayed by the system its table names (vLLM 0.6.0 by vllm's v0 scheduler, at its
    max_num_seqs 256 and max_model_len 4096) priced by the serving model; the caller's win."""
    runs = {r.name: r for r in read_real_runs(shipped_table("published_throughput"))}
    vllm = replay_config(runs["vllm-0.6.0-llama-3.1-8b-a100"], None)
    assert (vllm.system, vllm.scheduler, vllm.cost_model) == ("vllm", "vllm", "serving")
    assert (vllm.max_num_seqs, vllm.max_seq_len, vllm.gpu_memory_utilization) == (256, 4096, 0.9)
    sglang = replay_config(runs["sglang-0.3.0-llama-3.1-70b-tp4-h100"], None)
    assert (sglang.system, sglang.tensor_parallel, sglang.gpu_memory_utilization) == ("sglang", 4, 0.88)
    mine = replay_config(runs["vllm-0.6.0-llama-3.1-8b-a100"], None, {"system": "vllm-v1", "cost_model": "roofline"})
    assert (mine.system, mine.cost_model) == ("vllm-v1", "roofline")
    # a system of the caller's runs at its own default cost model, not the table's
    assert replay_config(runs["vllm-0.6.0-llama-3.1-8b-a100"], None, {"system": "orca-max"}).cost_model == "roofline"


def test_requests_per_second_as_the_benchmark_counts_them():
    """bench_serving's request throughput: the prompts over the time from the first send to the
    last answer; the replay's is the same over its own request table."""
    run = sample_run(num_prompts=200)
    v = validate_run(run, replay_config(run, None, {"system": "vllm-v1"}))
    table = v.result.requests
    assert v.simulated["overall"]["requests_per_s"] == pytest.approx(200 / table["e2el_s"].max())
    assert list(v.errors()["metric"]) == ["requests_per_s"]


def test_a_profile_of_the_callers_is_not_overridden_by_the_tables_cost_model(tmp_path):
    """--profile picks the table model: the row's cost model (serving) must not be set beside it."""
    runs = {r.name: r for r in read_real_runs(shipped_table("published_throughput"))}
    cfg = replay_config(runs["vllm-0.6.0-llama-3.1-8b-a100"], None, {"profile": str(tmp_path / "p.csv")})
    assert cfg.cost_model != "serving"


def test_cli_replays_the_published_table(capsys):
    assert main(["validate", "--against", "published_throughput", "--run", "vllm-0.6.0-llama-3.1-8b",
                 "--no-progress"]) == 0
    assert "(sharegpt-offline, 5,000 prompts sent)" in capsys.readouterr().out
    assert main(["validate", "--against", "published_throughput", "--run", "8b-a100", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "vllm-0.6.0-llama-3.1-8b-a100" in out and "sglang-0.3.0-llama-3.1-8b-a100" in out and "req/s" in out
    assert "70b" not in out.split("median")[0]
