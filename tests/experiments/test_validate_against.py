"""A real serving run replayed and compared (experiments/real_validate.py, ``pagesim validate
--against``), on a tiny inference-perf run folder and a tiny vllm bench file written by hand into
tmp_path; and the presets a Hugging Face model id names."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from pagesim.experiments.real_validate import error_lines, replay_config, scope_figures, validate_run
from pagesim.sim.cli import main
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import run_simulation
from pagesim.sim.specs.presets import get_model, preset_of_hf_id
from pagesim.traces.inference_perf import inference_perf_trace
from pagesim.traces.real_runs import RealRun, read_real_run

GPU = "h100-80gb"


def lifecycle(count: int, rps: float, ttft: float, e2e: float) -> dict:
    """A lifecycle metrics file as inference-perf writes it (seconds); every statistic of a
    latency is its mean plus 1, 2, 3 ms for median, p90, p99."""
    def stats(x):
        return {"mean": x, "median": x + 0.001, "p90": x + 0.002, "p99": x + 0.003}
    lengths = {"min": 72, "p25": 73, "median": 73, "p75": 74, "max": 75}
    return {"successes": {"count": count, "throughput": {"requests_per_sec": rps},
                          "latency": {"time_to_first_token": stats(ttft), "request_latency": stats(e2e),
                                      "time_per_output_token": stats(0.004), "inter_token_latency": stats(0.004)},
                          "prompt_len": lengths, "output_len": {k: 7 for k in lengths}},
            "failures": {"count": 0}}


def write_tiny_run(folder):
    """llama-2-7b, TP 1; 2 groups x 2 prompts of 32 + 40 tokens, 8 out (ignore_eos); stages 2/s
    x 5 s and 4/s x 5 s: 10 + 20 requests."""
    files = {
        "results/config.yaml": {
            "data": {"type": "shared_prefix",
                     "shared_prefix": {"num_groups": 2, "num_prompts_per_group": 2, "system_prompt_len": 32,
                                       "question_len": 40, "output_len": 8}},
            "load": {"type": "constant", "interval": 1.0,
                     "stages": [{"rate": 2.0, "duration": 5}, {"rate": 4.0, "duration": 5}]},
            "server": {"model_name": "meta-llama/Llama-2-7b-hf", "ignore_eos": True}},
        "results/summary_lifecycle_metrics.json": lifecycle(30, 2.5, 0.015, 0.075),
        "results/stage_0_lifecycle_metrics.json": lifecycle(10, 2.0, 0.014, 0.074),
        "results/stage_1_lifecycle_metrics.json": lifecycle(20, 4.0, 0.016, 0.076),
        "exp-config.yaml": {"model": "meta-llama/Llama-2-7b-hf", "tensor_parallelism": 1, "max_model_len": 4096,
                            "max_num_batched_tokens": 2048, "max_num_seqs": 128},
    }
    for rel, content in files.items():
        p = folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(content) if rel.endswith(".yaml") else json.dumps(content))
    return folder


@pytest.fixture
def run_dir(tmp_path):
    return write_tiny_run(tmp_path / "tiny-llama-2-7b-run")


@pytest.fixture
def bench_file(tmp_path):
    """6 requests of vllm bench serve; the third generated nothing and the fourth failed."""
    p = tmp_path / "bench.json"
    p.write_text(json.dumps({
        "model_id": "meta-llama/Llama-2-7b-hf", "duration": 2.0,
        "input_lens": [10, 20, 30, 40, 50, 60], "output_lens": [5, 1, 0, 3, 4, 2],
        "start_times": [100.5, 100.0, 101.0, 100.25, 102.0, 101.5], "ttfts": [0.1, 0.2, 0.0, 0.1, 0.3, 0.2],
        "itls": [[0.1] * 4, [], [], [0.1] * 2, [0.2] * 3, [0.2]], "latencies": [0.5, 0.2, 0.0, 0.3, 0.9, 0.4],
        "errors": ["", "", "", "Timeout", "", ""]}))
    return p


# ---------------------------------------------------------------------------------------------
# the replay's configuration


def test_replay_config_takes_the_runs_engine_settings(run_dir):
    """The replay runs the model and engine settings exp-config.yaml states (vLLM's names ->
    SimConfig's) on the GPU the caller gives, as vllm-v1 unless told otherwise; the caller's
    settings win; a fact table's gpu stands in for --gpu; no GPU at all -> ConfigError 'give --gpu'."""
    run = read_real_run(run_dir)
    cfg = replay_config(run, GPU)
    assert (cfg.system, cfg.gpu, cfg.tensor_parallel) == ("vllm-v1", GPU, 1)
    assert (cfg.max_seq_len, cfg.max_num_batched_tokens, cfg.max_num_seqs) == (4096, 2048, 128)
    assert get_model(cfg.model).name == "llama-2-7b"
    assert replay_config(run, GPU, {"max_num_seqs": 64, "max_model_len": None}).max_num_seqs == 64
    run.info["gpu"] = GPU
    assert replay_config(run, None).gpu == GPU
    run.info.clear()
    with pytest.raises(ConfigError, match="give --gpu"):
        replay_config(run, None)


# ---------------------------------------------------------------------------------------------
# a scope's figures


def test_scope_figures_hand_worked():
    """Over the finished requests: TTFT, TPOT (per request, those with a TPOT) and E2E their
    statistics; ITL = summed decode time / summed gaps; requests_per_s = finished / (last finish
    - first send of the frame). a: sent 0.0, first token 0.5, done 1.5, 3 tokens; b: 1.0, 1.2,
    2.2, 5 tokens; c: 2.0, 2.3, 2.3, 1 token (no TPOT); d: sent 3.0, never finished.
    TTFT mean (0.5 + 0.2 + 0.3) / 3; TPOT mean (1.0/2 + 1.0/4) / 2 = 0.375; ITL (1.0 + 1.0 + 0) /
    (2 + 4 + 0) = 1/3; E2E mean (1.5 + 1.2 + 0.3) / 3 = 1.0; 3 / (2.3 - 0.0)."""
    frame = pd.DataFrame({
        "request_id": ["a", "b", "c", "d"], "arrival_s": [0.0, 1.0, 2.0, 3.0],
        "first_token_s": [0.5, 1.2, 2.3, np.nan], "finish_s": [1.5, 2.2, 2.3, np.nan],
        "output_tokens": [3, 5, 1, 4], "ttft_s": [0.5, 0.2, 0.3, np.nan], "tpot_s": [0.5, 0.25, np.nan, np.nan],
        "e2el_s": [1.5, 1.2, 0.3, np.nan]})
    f = scope_figures(frame)
    assert f["count"] == 3
    assert f["ttft_mean"] == pytest.approx(1.0 / 3)
    assert f["ttft_median"] == pytest.approx(0.3)
    assert f["tpot_mean"] == pytest.approx(0.375)
    assert f["itl_mean"] == pytest.approx(1.0 / 3)
    assert f["e2e_mean"] == pytest.approx(1.0) and f["e2e_median"] == pytest.approx(1.2)
    assert f["requests_per_s"] == pytest.approx(3 / 2.3)
    assert scope_figures(frame[frame["request_id"] == "d"]) == {"count": 0}


# ---------------------------------------------------------------------------------------------
# the replay


def test_validate_run_every_request_every_scope(run_dir):
    """The tiny run replays every one of its int(2 x 5) + int(4 x 5) = 30 requests to the end;
    the simulated scopes count 10, 20 and 30; errors() has rows for overall, stage 0 and stage 1,
    each error = sim / real - 1; the table prints one TTFT line per scope."""
    run = read_real_run(run_dir)
    v = validate_run(run, replay_config(run, GPU), seed=0)
    assert len(inference_perf_trace(run, 0)) == 30
    assert v.unfinished == 0
    assert [v.simulated[s]["count"] for s in ("stage 0", "stage 1", "overall")] == [10, 20, 30]
    err = v.errors()
    assert set(err["scope"]) == {"overall", "stage 0", "stage 1"}
    assert {"ttft_mean", "e2e_p99", "tpot_mean", "requests_per_s"} <= set(err["metric"])
    np.testing.assert_allclose(err["error"], err["sim"] / err["real"] - 1.0)
    assert not set(err["metric"]) & {"count", "failures"}
    lines = error_lines(v)
    assert sum(" TTFT " in line for line in lines) == 3 and all(len(line) <= 100 for line in lines)


def test_validate_run_places_stages_as_the_client_ran_them(run_dir):
    """Whatever idle gap the replay put between the stages, the overall figures count stage 1 as
    starting load.interval + 1 s after stage 0's last finish, all on the trace's clock:
    requests_per_s = 30 / (stage 0's last finish + 1 + 1 + (stage 1's last finish - its clock
    start) - stage 0's first send), each finish as the client saw it (arrival + E2E: the front end's
    time included). Each stage's own figures do not depend on where it is placed.

    The simulator's records start their clock at the first arrival (summary arrival_offset_s)
    while the trace's stage clock starts (trace.attrs['stage_starts']) count from 0: mixing the
    two would land stage 1 arrival_offset_s (here 1 s + the first gap) too early and the overall
    requests_per_s would come out high."""
    run = read_real_run(run_dir)
    v = validate_run(run, replay_config(run, GPU), seed=0)
    trace = inference_perf_trace(run, 0)
    offset = trace["arrival_s"].min()  # the simulator's records count from the first send
    assert v.result.summary["arrival_offset_s"] == pytest.approx(offset)
    req = v.result.requests.set_index("request_id").loc[trace["request_id"]]
    stage = trace["stage"].to_numpy()
    finish = (req["arrival_s"] + req["e2el_s"]).to_numpy() + offset  # as the client saw it, on the trace's clock
    last0, last1 = finish[stage == 0].max(), finish[stage == 1].max()
    clock1 = trace.attrs["stage_starts"][1]
    first0 = trace["arrival_s"][stage == 0].min()
    assert v.simulated["stage 1"]["requests_per_s"] == pytest.approx(
        20 / (last1 - trace["arrival_s"][stage == 1].min()))
    span = last0 + 1.0 + 1.0 + (last1 - clock1) - first0
    assert v.simulated["overall"]["requests_per_s"] == pytest.approx(30 / span)


def test_idle_gap_between_stages_changes_no_latency(run_dir):
    """The server is idle between the stages, so the gap placed before stage 1 changes no
    request's TTFT or E2E latency (the replay's reason to run stages far apart)."""
    run = read_real_run(run_dir)
    cfg = replay_config(run, GPU)
    out = []
    for starts in ([1.0, 40.0], [1.0, 5000.0]):
        trace = inference_perf_trace(run, 0, starts=starts)
        out.append(run_simulation(cfg, trace.drop(columns="stage")).requests.set_index("request_id"))
    near, far = out
    assert len(near) == 30 and np.isfinite(near["finish_s"]).all()
    far = far.loc[near.index]
    np.testing.assert_allclose(far["ttft_s"], near["ttft_s"], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(far["e2el_s"], near["e2el_s"], rtol=1e-9, atol=1e-9)


def test_validate_vllm_bench_replays_the_successes_only(bench_file):
    """A vllm bench run replays the requests that succeeded (4 of 6) as they were sent, in one
    scope, overall."""
    run = read_real_run(bench_file)
    v = validate_run(run, replay_config(run, GPU), seed=0)
    assert v.unfinished == 0 and list(v.simulated) == ["overall"]
    assert v.simulated["overall"]["count"] == 4
    assert sorted(v.result.requests["request_id"]) == ["r0", "r1", "r4", "r5"]
    assert set(v.errors()["scope"]) == {"overall"}


# ---------------------------------------------------------------------------------------------
# the command line


def test_cli_prints_the_table(run_dir, capsys):
    """validate --against FOLDER --gpu GPU exits 0 and prints the run, the replay and the table."""
    assert main(["validate", "--against", str(run_dir), "--gpu", GPU, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "stage 1" in out and "tiny-llama-2-7b-run" in out
    assert "30 requests measured" in out


def test_cli_vllm_bench(bench_file, capsys):
    """A vllm bench file replays the same way (exit 0, a TTFT line)."""
    assert main(["validate", "--against", str(bench_file), "--gpu", GPU, "--no-progress"]) == 0
    assert "TTFT" in capsys.readouterr().out


def _one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pagesim: error: ") and "Traceback" not in err
    return lines[0]


def test_cli_without_gpu(run_dir, capsys):
    """The run's files do not name the GPU: without --gpu, exit 2 and one line saying give --gpu."""
    assert main(["validate", "--against", str(run_dir), "--no-progress"]) == 2
    assert "give --gpu" in _one_error_line(capsys)


@pytest.mark.parametrize("flags,named", [(["--rate", "3"], "--rate"), (["--num-requests", "5"], "--num-requests"),
                                         (["--backend", "fake"], "--backend")])
def test_cli_refuses_workload_flags(run_dir, capsys, flags, named):
    """--against replays the run's own workload and runs no GPU: a workload or GPU-run flag is
    refused (exit 2, one line naming the flag)."""
    assert main(["validate", "--against", str(run_dir), "--gpu", GPU, *flags]) == 2
    assert named in _one_error_line(capsys)


def test_cli_malformed_folder(tmp_path, capsys):
    """A malformed run folder: exit 2, one line naming the file, no traceback."""
    folder = write_tiny_run(tmp_path / "bad")
    (folder / "results" / "config.yaml").write_text("- just\n- a list\n")
    assert main(["validate", "--against", str(folder), "--gpu", GPU]) == 2
    assert "config.yaml" in _one_error_line(capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["validate", "--against", str(empty), "--gpu", GPU]) == 2
    assert "results/config.yaml" in _one_error_line(capsys)


def test_cli_malformed_vllm_bench_errors_list(bench_file, capsys):
    """A vllm bench file whose errors list is shorter than its requests: exit 2, one line naming
    the file, no traceback.

    Unchecked, numpy's broadcast ValueError would escape main() as a traceback."""
    data = json.loads(bench_file.read_text())
    data["errors"] = data["errors"][:-1]
    bench_file.write_text(json.dumps(data))
    assert main(["validate", "--against", str(bench_file), "--gpu", GPU]) == 2
    assert "bench.json" in _one_error_line(capsys)


def test_cli_json(run_dir, capsys):
    """--json prints one JSON object: the run, its format, the config, unfinished and the errors
    (rows of scope, metric, real, sim, error)."""
    assert main(["validate", "--against", str(run_dir), "--gpu", GPU, "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    report = json.loads(out)
    assert report["format"] == "inference-perf" and report["unfinished"] == 0
    assert {e["scope"] for e in report["errors"]} == {"overall", "stage 0", "stage 1"}
    assert set(report["errors"][0]) == {"scope", "metric", "real", "sim", "error"}


def test_page_size_is_the_block_size_in_a_replay(run_dir, capsys):
    """--page-size (SGLang's word) sets the replay's block size, as --block-size does; both given
    and different, refused in one line."""
    assert main(["validate", "--against", str(run_dir), "--gpu", GPU, "--page-size", "32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["block_size"] == 32
    argv = ["validate", "--against", str(run_dir), "--gpu", GPU, "--page-size", "32", "--block-size", "16"]
    assert main(argv) == 2
    assert capsys.readouterr().err == "pagesim: error: --page-size 32 and --block-size 16 are one setting: give one\n"


def test_requests_the_client_gave_up_on_are_rejected_not_unfinished(run_dir, capsys):
    """A client timeout shorter than any request: every request is rejected with that reason, and
    the report counts them so (it once called them unfinished, pointing at a table not written)."""
    assert main(["validate", "--against", str(run_dir), "--gpu", GPU, "--client-timeout", "0.001", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["unfinished"] == 0 and report["rejected"] > 0
    argv = ["validate", "--against", str(run_dir), "--gpu", GPU, "--client-timeout", "0.001", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"rejected   {report['rejected']:,} requests, each with its reason" in out and "unfinished" not in out


def test_cli_out_writes_validation_json(run_dir, tmp_path, capsys):
    """--out DIR writes DIR/validation.json (the --json report) and the simulation's files."""
    out = tmp_path / "val"
    assert main(["validate", "--against", str(run_dir), "--gpu", GPU, "--no-progress", "--out", str(out)]) == 0
    report = json.loads((out / "validation.json").read_text())
    assert report["run"] == str(run_dir) and len(report["errors"]) > 0
    assert (out / "sim").is_dir()
    assert "validation.json" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# model ids


@pytest.mark.parametrize("model_id,preset", [
    ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
    ("codellama/CodeLlama-34b-Instruct-hf", "codellama-34b"),
    ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ("someone/Not-A-Model-1b", None),
])
def test_preset_of_hf_id(model_id, preset):
    """A Hugging Face id names the preset of its name lower-cased, less its variant suffixes
    (-hf, -instruct, -chat, -v0.1); an unknown one names none."""
    assert preset_of_hf_id(model_id) == preset
    if preset:
        assert get_model(model_id).name == preset


def test_realrun_without_model_needs_model():
    """A run whose files name no model (a vllm bench file without model_id) needs --model."""
    run = RealRun("b", "vllm-bench", "b.json")
    with pytest.raises(ConfigError, match="give --model"):
        replay_config(run, GPU)


def test_cli_shipped_fact_table_by_name(capsys):
    """`--against real_runs_h100` names the shipped fact table (experiments/data/): one run
    (--run picks it) prints its stages; several print a row each and the medians."""
    assert main(["validate", "--against", "real_runs_h100", "--run", "70b-tp4-roleplay", "--no-progress"]) == 0
    one = capsys.readouterr().out
    assert "20260218-084319-llama-2-70b-tp4-roleplay" in one and "TTFT" in one
    assert main(["validate", "--against", "real_runs_h100", "--run", "codegen", "--no-progress"]) == 0
    many = capsys.readouterr().out
    assert "4 real runs of real_runs_h100" in many and "median |error| over the runs" in many
    assert max(len(line) for line in many.splitlines()) <= 100


def test_replay_takes_the_clients_timeout(run_dir, tmp_path):
    """inference-perf's client gives up after load.request_timeout, unset: aiohttp's default
    total timeout of 300 s; the replay's vllm-v1 aborts requests then. A system that does not
    model it replays without it."""
    run = read_real_run(run_dir)
    assert run.workload["client_timeout_s"] == 300.0
    assert replay_config(run, GPU).client_timeout_s == 300.0
    assert replay_config(run, GPU, {"client_timeout_s": 20.0}).client_timeout_s == 20.0
    assert replay_config(run, GPU, {"system": "vllm", "chunked_prefill": True}).client_timeout_s is None
    config = yaml.safe_load((run_dir / "results/config.yaml").read_text())
    config["load"]["request_timeout"] = 60.0
    (run_dir / "results/config.yaml").write_text(yaml.safe_dump(config))
    assert read_real_run(run_dir).workload["client_timeout_s"] == 60.0
