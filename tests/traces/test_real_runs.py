"""Real serving runs read back (traces/real_runs.py): an inference-perf run folder and a vllm bench
serve --save-detailed JSON, both tiny and written by hand into tmp_path; a run's fact-table rows;
malformed input as a TraceError naming the file and the field."""

from __future__ import annotations

import copy
import csv
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from pagesim.sim.errors import TraceError
from pagesim.traces.real_runs import RealRun, read_real_run, runs_from_facts

# ---------------------------------------------------------------------------------------------
# a tiny inference-perf run: llama-2-7b, 2 groups x 2 prompts of 32 + 40 tokens, 8 out, stages
# 2 req/s x 5 s and 4 req/s x 5 s (10 + 20 requests)

PROMPT_LEN = {"min": 70, "p0.1": 70, "p1": 70, "p5": 71, "p10": 71, "p25": 72, "median": 73, "p75": 74,
              "p90": 75, "p95": 76, "p99": 77, "p99.9": 78, "max": 78}
OUTPUT_LEN = {q: 7 for q in PROMPT_LEN}
#: inference-perf's latency names -> ours, and a base figure (s) per scope: stat s of a metric
#: is base + STEP[s]
LATENCIES = {"time_to_first_token": "ttft", "time_per_output_token": "tpot", "inter_token_latency": "itl",
             "request_latency": "e2e"}
STEP = {"mean": 0.0, "median": 0.001, "p90": 0.002, "p99": 0.003}
BASE = {"overall": {"ttft": 0.020, "tpot": 0.008, "itl": 0.007, "e2e": 0.080},
        "stage 0": {"ttft": 0.010, "tpot": 0.006, "itl": 0.005, "e2e": 0.060},
        "stage 1": {"ttft": 0.030, "tpot": 0.010, "itl": 0.009, "e2e": 0.100}}
COUNTS = {"overall": (30, 0, 1.5), "stage 0": (10, 0, 2.0), "stage 1": (19, 1, 3.8)}  # ok, failed, req/s


def lifecycle(scope: str) -> dict:
    """A lifecycle metrics file's content as inference-perf writes it (seconds)."""
    ok, failed, rps = COUNTS[scope]
    latency = {theirs: {"min": 0.0001, "max": 9.0, "mean": BASE[scope][ours] + STEP["mean"],
                        "median": BASE[scope][ours] + STEP["median"], "p90": BASE[scope][ours] + STEP["p90"],
                        "p99": BASE[scope][ours] + STEP["p99"]}
               for theirs, ours in LATENCIES.items()}
    return {"load_summary": {"count": ok + failed},
            "successes": {"count": ok, "latency": latency,
                          "throughput": {"requests_per_sec": rps, "output_tokens_per_sec": 8 * rps},
                          "prompt_len": dict(PROMPT_LEN, mean=73.2), "output_len": dict(OUTPUT_LEN, mean=7.0)},
            "failures": {"count": failed, "request_latency": None}}


def run_files() -> dict:
    """The run folder's files, relative path -> content (edit, then :func:`write_run`)."""
    config = {"data": {"type": "shared_prefix",
                       "shared_prefix": {"num_groups": 2, "num_prompts_per_group": 2, "system_prompt_len": 32,
                                         "question_len": 40, "output_len": 8}},
              "load": {"type": "constant", "interval": 1.0,
                       "stages": [{"rate": 2.0, "duration": 5}, {"rate": 4.0, "duration": 5}]},
              "server": {"type": "vllm", "model_name": "meta-llama/Llama-2-7b-hf", "ignore_eos": True}}
    return {"results/config.yaml": config,
            "results/summary_lifecycle_metrics.json": lifecycle("overall"),
            "results/stage_0_lifecycle_metrics.json": lifecycle("stage 0"),
            "results/stage_1_lifecycle_metrics.json": lifecycle("stage 1"),
            "exp-config.yaml": {"model": "meta-llama/Llama-2-7b-hf", "tensor_parallelism": 1, "max_model_len": 4096,
                                "max_num_batched_tokens": 2048, "max_num_seqs": 128}}


def write_run(folder, files: dict):
    """Write ``files`` (a dict or list: YAML or JSON by suffix; a str: as is) under ``folder``."""
    for rel, content in files.items():
        p = folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            p.write_text(content)
        elif rel.endswith(".yaml"):
            p.write_text(yaml.safe_dump(content))
        else:
            p.write_text(json.dumps(content))
    return folder


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "20260217-000000-llama-2-7b-tp1-tiny", run_files())


# ---------------------------------------------------------------------------------------------
# a tiny vllm bench serve file: 6 requests, sent out of order; r2 generated nothing (output 0)
# and r3 carries an error, so 4 succeeded

BENCH = {"date": "20260301-120000", "backend": "vllm", "model_id": "meta-llama/Llama-2-7b-hf",
         "tokenizer_id": "meta-llama/Llama-2-7b-hf", "num_prompts": 6, "duration": 2.0, "completed": 4,
         "input_lens": [10, 20, 30, 40, 50, 60],
         "output_lens": [5, 1, 0, 3, 4, 2],
         "start_times": [100.5, 100.0, 101.0, 100.25, 102.0, 101.5],
         "ttfts": [0.1, 0.2, 0.0, 0.1, 0.3, 0.2],
         "itls": [[0.1, 0.1, 0.1, 0.1], [], [], [0.1, 0.1], [0.2, 0.2, 0.2], [0.2]],
         "latencies": [0.5, 0.2, 0.0, 0.3, 0.9, 0.4],
         "errors": ["", "", "", "Timeout", "", ""]}


@pytest.fixture
def bench_file(tmp_path):
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(BENCH))
    return p


# ---------------------------------------------------------------------------------------------
# inference-perf


def test_inference_perf_every_field_read(run_dir):
    """The engine's settings come from exp-config.yaml (vLLM's names), the workload from
    results/config.yaml (stages flattened as stage.N.*, the shared_prefix settings, ignore_eos)
    with the summary's prompt/output length quantiles; each lifecycle file becomes a scope of
    count, failures, {ttft,e2e}_{mean,median,p90,p99} in seconds and requests_per_s, without the
    length quantiles and without the statistics it does not compare (min, max). With ignore_eos
    every request generated output_len tokens, so TPOT and ITL are vLLM's per-token figure
    (mean E2E - mean TTFT) / (output_len - 1), mean only (inference-perf's own time chunks)."""
    run = read_real_run(run_dir)
    assert run.name == "20260217-000000-llama-2-7b-tp1-tiny"
    assert run.fmt == "inference-perf" and run.source == str(run_dir)
    assert run.requests is None and run.info == {}
    assert run.engine == {"model": "meta-llama/Llama-2-7b-hf", "tensor_parallelism": 1, "max_model_len": 4096,
                          "max_num_batched_tokens": 2048, "max_num_seqs": 128}
    expected_workload = {
        "load.type": "constant", "stages": 2, "load.interval": 1.0,
        "stage.0.rate": 2.0, "stage.0.duration": 5.0, "stage.1.rate": 4.0, "stage.1.duration": 5.0,
        "shared_prefix.num_groups": 2, "shared_prefix.num_prompts_per_group": 2,
        "shared_prefix.system_prompt_len": 32, "shared_prefix.question_len": 40, "shared_prefix.output_len": 8,
        "ignore_eos": True, "client_timeout_s": 300.0,  # no load.request_timeout: aiohttp's 5 x 60 s
        **{f"prompt_len.{q}": float(v) for q, v in PROMPT_LEN.items()},
        **{f"output_len.{q}": 7.0 for q in OUTPUT_LEN}}
    dotted = {"prompt_len.p0.1", "prompt_len.p99.9", "output_len.p0.1", "output_len.p99.9"}  # see below
    assert {k: v for k, v in run.workload.items() if k not in dotted} == \
        {k: v for k, v in expected_workload.items() if k not in dotted}
    assert run.num_stages == 2
    assert list(run.measured) == ["overall", "stage 0", "stage 1"]
    overall = run.measured["overall"]
    assert overall["count"] == 30 and overall["failures"] == 0
    assert overall["requests_per_s"] == 1.5
    assert overall["ttft_mean"] == pytest.approx(0.020)
    assert overall["ttft_p99"] == pytest.approx(0.023)
    assert overall["e2e_mean"] == pytest.approx(0.080) and overall["e2e_p90"] == pytest.approx(0.082)
    assert overall["tpot_mean"] == pytest.approx((0.080 - 0.020) / 7)
    assert "itl_mean" not in overall  # the same figure as TPOT's mean here: compared once
    assert sorted(overall) == sorted(["count", "failures", "requests_per_s", "tpot_mean"]
                                     + [f"{m}_{s}" for m in ("ttft", "e2e") for s in STEP])
    stage0, stage1 = run.measured["stage 0"], run.measured["stage 1"]
    assert (stage0["count"], stage0["failures"], stage0["requests_per_s"]) == (10, 0, 2.0)
    assert (stage1["count"], stage1["failures"], stage1["requests_per_s"]) == (19, 1, 3.8)
    assert stage0["ttft_mean"] == pytest.approx(0.010) and stage1["ttft_mean"] == pytest.approx(0.030)
    assert stage1["e2e_p99"] == pytest.approx(0.103)
    assert stage0["tpot_mean"] == pytest.approx((0.060 - 0.010) / 7)
    assert stage1["tpot_mean"] == pytest.approx((0.100 - 0.030) / 7)
    assert sorted(stage1) == sorted(overall)  # no length quantiles, no min/max in any scope


def test_inference_perf_quantiles_with_a_dot_read(run_dir):
    """The length quantiles whose names hold a dot (p0.1, p99.9: inference-perf writes both, and
    LENGTH_QUANTILES lists them) are read like the others.

    Their keys hold a dot: a path split on '.' would look for 'p0' then '1' and, the quantiles
    being optional, drop them silently."""
    w = read_real_run(run_dir).workload
    assert w.get("prompt_len.p0.1") == 70.0 and w.get("prompt_len.p99.9") == 78.0
    assert w.get("output_len.p0.1") == 7.0 and w.get("output_len.p99.9") == 7.0


def test_inference_perf_one_stage_run_may_keep_only_its_summary(tmp_path):
    """A one-stage run may keep only the summary (no stage_0 file) and then has the one scope
    'overall'; without ignore_eos the outputs vary, so TPOT and ITL are the client's own, every
    statistic."""
    files = run_files()
    del files["results/stage_0_lifecycle_metrics.json"]
    del files["results/stage_1_lifecycle_metrics.json"]
    files["results/config.yaml"]["load"]["stages"] = [{"rate": 3.0, "duration": 4}]
    files["results/config.yaml"]["server"]["ignore_eos"] = False
    run = read_real_run(write_run(tmp_path / "one", files))
    assert run.engine["model"] == "meta-llama/Llama-2-7b-hf"
    assert run.num_stages == 1 and list(run.measured) == ["overall"]
    assert run.workload["ignore_eos"] is False
    assert (run.workload["stage.0.rate"], run.workload["stage.0.duration"]) == (3.0, 4.0)
    m = run.measured["overall"]
    assert m["tpot_mean"] == pytest.approx(0.008) and m["tpot_median"] == pytest.approx(0.009)
    assert m["itl_p90"] == pytest.approx(0.009) and m["itl_p99"] == pytest.approx(0.010)


def _fact_table(run) -> pd.DataFrame:
    return pd.DataFrame(run.facts(), columns=["run", "section", "key", "value"])


def test_facts_round_trip_in_memory(run_dir):
    """facts() then runs_from_facts() gives back the run: its name, format, engine, workload and
    measured scopes, equal value for value; the table's source becomes the run's source."""
    run = read_real_run(run_dir)
    back, = runs_from_facts(_fact_table(run), "facts.csv")
    assert (back.name, back.fmt, back.source) == (run.name, "inference-perf", "facts.csv")
    assert back.engine == run.engine
    assert back.workload == run.workload
    assert back.measured == run.measured


def test_facts_round_trip_through_csv(run_dir, tmp_path):
    """Through a CSV read back as strings (as benchmarks/real_run_accuracy.py reads it) the run
    comes back equal too: numbers as numbers, True/False as bools, the model id as a string, the
    info a fact table adds (gpu, source)."""
    run = read_real_run(run_dir)
    run.info.update(gpu="h100-80gb", source="hand-written, 2 stages")
    path = tmp_path / "facts.csv"
    with path.open("w", newline="") as f:
        f.write("# a comment line\n")
        w = csv.writer(f)
        w.writerow(["run", "section", "key", "value"])
        w.writerows(run.facts())
    table = pd.read_csv(path, comment="#", dtype=str, keep_default_na=False)
    back, = runs_from_facts(table, str(path))
    assert back.fmt == "inference-perf"
    assert back.engine == run.engine and isinstance(back.engine["max_num_seqs"], int)
    assert back.workload == run.workload and back.workload["ignore_eos"] is True
    assert back.measured == run.measured
    assert back.info["gpu"] == "h100-80gb" and back.info["source"] == "hand-written, 2 stages"


def test_facts_round_trip_keeps_info():
    """The info a round trip gives back is the info the run had, so that writing a read-back run's
    facts again gives the same rows (no fact twice).

    The ("run", "format") row is the format's alone: filed under info too, facts() of the
    read-back run would write it twice."""
    run = RealRun("r", "inference-perf", "src", engine={"model": "m"}, workload={"stages": 1},
                  info={"gpu": "h100-80gb"})
    back, = runs_from_facts(_fact_table(run), "facts.csv")
    assert back.info == run.info
    assert back.facts() == run.facts()


def test_fact_table_bad_section_and_missing_column():
    """A fact table without one of its four columns, or with a section other than run, engine,
    workload, measured SCOPE, is a TraceError naming the table and the field (and the row)."""
    with pytest.raises(TraceError) as ei:
        runs_from_facts(pd.DataFrame({"run": ["a"], "section": ["run"], "key": ["k"]}), "t.csv")
    assert ei.value.path == "t.csv" and ei.value.field == "value"
    table = pd.DataFrame([["a", "engine", "model", "m"], ["a", "bogus", "k", "1"]],
                         columns=["run", "section", "key", "value"])
    with pytest.raises(TraceError) as ei:
        runs_from_facts(table, "t.csv")
    assert (ei.value.path, ei.value.row, ei.value.field) == ("t.csv", 2, "section")


# ---------------------------------------------------------------------------------------------
# vllm bench serve


def test_vllm_bench_requests_sorted_from_zero(bench_file):
    """The requests start at 0 (start_times less their least) in send order, each keeping its own
    lengths; the failed ones (an error, or output 0) are kept but marked succeeded False."""
    run = read_real_run(bench_file)
    assert (run.name, run.fmt, run.workload) == ("bench", "vllm-bench", {"client_timeout_s": 6 * 3600.0})
    assert run.engine == {"model": "meta-llama/Llama-2-7b-hf"}
    r = run.requests
    # start_times - 100.0 = 0.5, 0, 1.0, 0.25, 2.0, 1.5 -> order r1, r3, r0, r2, r5, r4
    assert r["request_id"].tolist() == ["r1", "r3", "r0", "r2", "r5", "r4"]
    assert r["arrival_s"].tolist() == [0.0, 0.25, 0.5, 1.0, 1.5, 2.0]
    assert r["prompt_tokens"].tolist() == [20, 40, 10, 30, 60, 50]
    assert r["output_tokens"].tolist() == [1, 3, 5, 0, 2, 4]
    assert r["succeeded"].tolist() == [True, False, True, False, True, True]


def test_vllm_bench_measured_by_vllms_definitions(bench_file):
    """Over the 4 that succeeded (r0, r1, r4, r5): TTFT and E2E their means; TPOT = (latency -
    ttft) / (output - 1) over outputs > 1 (vLLM's calculate_metrics: r0 0.4/4, r4 0.6/3, r5
    0.2/1; r1's one token has none); ITL all their token gaps pooled; requests_per_s = completed
    / duration = 4 / 2.0; the 2 failed are counted as failures."""
    m = read_real_run(bench_file).measured
    assert list(m) == ["overall"]
    m = m["overall"]
    assert (m["count"], m["failures"]) == (4, 2)
    assert m["ttft_mean"] == pytest.approx((0.1 + 0.2 + 0.3 + 0.2) / 4)
    assert m["e2e_mean"] == pytest.approx((0.5 + 0.2 + 0.9 + 0.4) / 4)
    assert m["e2e_median"] == pytest.approx(0.45)
    assert m["tpot_mean"] == pytest.approx((0.1 + 0.2 + 0.2) / 3)
    assert m["tpot_median"] == pytest.approx(0.2)
    assert m["itl_mean"] == pytest.approx((4 * 0.1 + 3 * 0.2 + 0.2) / 8)  # r3's gaps (failed) left out
    assert m["requests_per_s"] == pytest.approx(2.0)


def test_vllm_bench_without_errors_list_or_duration(tmp_path):
    """An empty errors list counts every request with output > 0 as a success; without a duration
    there is no requests_per_s (nothing to divide by)."""
    data = {k: v for k, v in BENCH.items() if k not in ("duration",)}
    data["errors"] = []
    p = tmp_path / "b.json"
    p.write_text(json.dumps(data))
    m = read_real_run(p).measured["overall"]
    assert (m["count"], m["failures"]) == (5, 1)
    assert "requests_per_s" not in m


# ---------------------------------------------------------------------------------------------
# malformed input


def _edit(files: dict, rel: str, dotted: str, value) -> None:
    """Set (or with value ``...`` delete) ``files[rel]``'s entry at ``dotted``; ``[i]`` indexes."""
    node = files[rel]
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    last = parts[-1]
    if isinstance(node, list):
        last = int(last)
    if value is ...:
        del node[last]
    else:
        node[last] = value


CFG, SUMMARY, STAGE1, EXP = ("results/config.yaml", "results/summary_lifecycle_metrics.json",
                             "results/stage_1_lifecycle_metrics.json", "exp-config.yaml")

# (id, edit(files), file named, field named (None: the file itself), message fragment)
FOLDER_CASES = [
    ("no-config", lambda f: f.pop(CFG), CFG, None, "missing"),
    ("config-not-mapping", lambda f: f.__setitem__(CFG, ["a", "b"]), CFG, None, "expected a mapping"),
    ("config-not-yaml", lambda f: f.__setitem__(CFG, "data: [unclosed\n"), CFG, None, "not YAML"),
    ("not-shared-prefix", lambda f: _edit(f, CFG, "data.type", "random"), CFG, "data.type", "'random'"),
    ("multi-turn", lambda f: _edit(f, CFG, "data.shared_prefix.enable_multi_turn_chat", True), CFG,
     "data.shared_prefix.enable_multi_turn_chat", "multi-turn"),
    ("no-question-len", lambda f: _edit(f, CFG, "data.shared_prefix.question_len", ...), CFG,
     "data.shared_prefix.question_len", "missing"),
    ("load-sweep", lambda f: _edit(f, CFG, "load.type", "sweep"), CFG, "load.type", "'sweep'"),
    ("rate-0", lambda f: _edit(f, CFG, "load.stages.1.rate", 0), CFG, "load.stages[1].rate", "> 0"),
    # the engine's defaults (1,024 sequences, 8,192 tokens) are not the run's settings
    ("no-exp-config", lambda f: f.pop(EXP), EXP, None, "missing (the server's launch settings"),
    ("stage-beyond-memory", lambda f: (_edit(f, CFG, "load.stages.1.rate", 1e9), _edit(f, CFG, "load.stages.1.duration", 1e9)),
     CFG, "load.stages[1]", "more than this machine's memory"),
    ("no-ttft-mean", lambda f: _edit(f, STAGE1, "successes.latency.time_to_first_token.mean", ...), STAGE1,
     "successes.latency.time_to_first_token.mean", "missing"),
    ("abc-latency", lambda f: _edit(f, SUMMARY, "successes.latency.request_latency.p90", "abc"), SUMMARY,
     "successes.latency.request_latency.p90", "'abc'"),
    ("negative-count", lambda f: _edit(f, SUMMARY, "failures.count", -1), SUMMARY, "failures.count", "-1"),
    ("abc-max-num-seqs", lambda f: _edit(f, EXP, "max_num_seqs", "abc"), EXP, "max_num_seqs", "'abc'"),
    ("no-stage-1", lambda f: f.pop(STAGE1), STAGE1, None, "missing"),
    ("no-summary", lambda f: f.pop(SUMMARY), SUMMARY, None, "missing"),
    ("summary-not-json", lambda f: f.__setitem__(SUMMARY, "{oops"), SUMMARY, None, "not JSON"),
]


@pytest.mark.parametrize("edit,rel,field,fragment", [c[1:] for c in FOLDER_CASES], ids=[c[0] for c in FOLDER_CASES])
def test_malformed_folder_names_file_and_field(tmp_path, edit, rel, field, fragment):
    """Each malformed or missing part of a run folder is a TraceError whose path is the file and
    whose field is the dotted key at fault, both in the message."""
    files = copy.deepcopy(run_files())
    edit(files)
    folder = write_run(tmp_path / "run", files)
    with pytest.raises(TraceError) as ei:
        read_real_run(folder)
    e = ei.value
    assert e.path == str(folder / rel)
    assert e.field == field
    msg = str(e)
    assert str(folder / rel) in msg and fragment in msg
    if field is not None:
        assert f"field '{field}'" in msg


def _bench(**changes) -> dict:
    data = copy.deepcopy(BENCH)
    for k, v in changes.items():
        if v is ...:
            del data[k]
        else:
            data[k] = v
    return data


# (id, file text, row named, field named, message fragment)
BENCH_CASES = [
    ("no-itls", json.dumps(_bench(itls=...)), None, "itls", "--save-detailed"),
    ("short-ttfts", json.dumps(_bench(ttfts=[0.1] * 5)), None, "ttfts", "5 entries"),
    ("negative-ttft", json.dumps(_bench(ttfts=[0.1, 0.2, -0.5, 0.1, 0.3, 0.2])), 3, "ttfts", "-0.5"),
    ("fractional-output", json.dumps(_bench(output_lens=[5, 1.5, 0, 3, 4, 2])), 2, "output_lens", "1.5"),
    ("latencies-not-list", json.dumps(_bench(latencies=3)), None, "latencies", "expected a list"),
    ("all-failed", json.dumps(_bench(output_lens=[0] * 6)), None, "errors", "every request failed"),
    ("no-requests", json.dumps({k: [] for k in ("input_lens", "output_lens", "start_times", "ttfts", "itls",
                                                "latencies")}), None, "input_lens", "no requests"),
    ("not-json", "input_lens: [1, 2]\n", None, None, "not JSON"),
    ("json-list", "[1, 2, 3]", None, None, "expected a JSON object"),
]


@pytest.mark.parametrize("text,row,field,fragment", [c[1:] for c in BENCH_CASES], ids=[c[0] for c in BENCH_CASES])
def test_malformed_vllm_bench_names_file_row_field(tmp_path, text, row, field, fragment):
    """A malformed vllm bench file is a TraceError naming the file, the field, and for a bad value
    its 1-based request row."""
    p = tmp_path / "bench.json"
    p.write_text(text)
    with pytest.raises(TraceError) as ei:
        read_real_run(p)
    e = ei.value
    assert (e.path, e.row, e.field) == (str(p), row, field)
    msg = str(e)
    assert str(p) in msg and fragment in msg
    if row is not None:
        assert f"row {row}" in msg


def test_neither_folder_nor_file(tmp_path):
    """A path that does not exist is a TraceError naming it."""
    with pytest.raises(TraceError, match="no such file or folder") as ei:
        read_real_run(tmp_path / "nowhere")
    assert ei.value.path == str(tmp_path / "nowhere")


def test_failed_flags_match_failures(bench_file):
    """The requests table flags as failed exactly the requests counted as failures."""
    run = read_real_run(bench_file)
    assert int((~run.requests["succeeded"]).sum()) == run.measured["overall"]["failures"]
    assert np.issubdtype(run.requests["arrival_s"].dtype, np.floating)


# malformed lists that numpy or len() would meet first (a bare ValueError or TypeError: a
# traceback from the command line), and a negative token gap. (id, file text, row named, field named)
UNCHECKED_CASES = [
    ("errors-short", json.dumps(_bench(errors=["", "x", "", "", ""])), None, "errors"),
    ("errors-not-list", json.dumps(_bench(errors="boom")), None, "errors"),
    ("itls-entry-number", json.dumps(_bench(itls=[0.1, [], [], [], [0.2], [0.2]])), 1, "itls"),
    ("itls-entry-text", json.dumps(_bench(itls=[["a"], [], [], [], [0.2], [0.2]])), 1, "itls"),
    ("itls-negative-gap", json.dumps(_bench(itls=[[-5.0] * 4, [], [], [], [0.2] * 3, [0.2]])), 1, "itls"),
]


@pytest.mark.parametrize("text,row,field", [c[1:] for c in UNCHECKED_CASES], ids=[c[0] for c in UNCHECKED_CASES])
def test_malformed_vllm_bench_errors_and_itls(tmp_path, text, row, field):
    """errors (when given) and each request's itls are checked like the other per-request lists:
    a TraceError naming the file, the field, and for a bad entry its 1-based row."""
    p = tmp_path / "bench.json"
    p.write_text(text)
    with pytest.raises(TraceError) as ei:
        read_real_run(p)
    assert (ei.value.path, ei.value.row, ei.value.field) == (str(p), row, field)


def test_stage_value_error_names_the_stage(tmp_path):
    """A stage's bad rate names the stage it is in (load.stages[1].rate), not just 'rate'.

    'rate' alone would not say which stage."""
    files = copy.deepcopy(run_files())
    files[CFG]["load"]["stages"][1]["rate"] = "abc"
    folder = write_run(tmp_path / "run", files)
    with pytest.raises(TraceError) as ei:
        read_real_run(folder)
    assert ei.value.path == str(folder / CFG)
    assert ei.value.field in ("load.stages[1].rate", "load.stages.1.rate")
