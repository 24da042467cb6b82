"""LLMServingSim's per-request vLLM runs read back (traces/real_runs.py read_llmservingsim), and
an older vllm benchmark_serving.py file without start_times or latencies (read_vllm_bench): tiny
synthetic folders and files in their formats, written by hand into tmp_path, and their figures
worked by hand."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from pagesim.sim.errors import TraceError
from pagesim.traces.real_runs import read_real_run, send_times

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------
# a 3-request LLMServingSim run: the engine's stamps from 1000 s (its monotonic clock), the front
# end's arrival_time from 1.7e9 (its wall clock; each request reached the queue after its own
# lag), which the reader does not use

META = {"schema_version": 1, "model": "meta-llama/Llama-3.1-8B", "vllm_version": "0.19.0",
        "engine_kwargs": {"model": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 1, "data_parallel_size": 1,
                          "enable_expert_parallel": False, "max_num_seqs": 256, "max_num_batched_tokens": 2048,
                          "max_model_len": 32768, "dtype": "bfloat16", "kv_cache_dtype": "auto", "seed": 42},
        "num_requests": 3,
        "kv_cache": {"num_gpu_blocks": 2588, "num_cpu_blocks": None, "block_size": 16, "gpu_memory_utilization": 0.9,
                     "enable_prefix_caching": True, "num_kv_tokens": 41408},
        "hardware": {"device_count": 1, "device_name": "NVIDIA GeForce RTX 4090"}}
#: (input, output, queued, first token, last token, the front end's lag before queued)
REQUESTS = [(100, 5, 1000.0, 1000.5, 1001.3, 0.01),
            (200, 1, 1000.25, 1001.0, 1001.0, 0.2),
            (300, 3, 1002.0, 1002.25, 1002.75, 0.05)]


def request_rows() -> list[dict]:
    return [{"request_id": f"bench-{i}", "input_toks": n_in, "output_toks": n_out,
             "arrival_time": 1.7e9 + queued - lag, "queued_ts": queued, "scheduled_ts": queued,
             "first_token_ts": first, "last_token_ts": last}
            for i, (n_in, n_out, queued, first, last, lag) in enumerate(REQUESTS)]


def write_run(root, meta=None, rows=None, gpu_folder="RTX4090"):
    """``root/<gpu_folder>/Llama-3.1-8B/vllm/`` with meta.json, requests.jsonl and timeseries.csv."""
    folder = root / gpu_folder / "Llama-3.1-8B" / "vllm"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(META if meta is None else meta))
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (request_rows() if rows is None
                                                                                 else rows)))
    (folder / "timeseries.csv").write_text("t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
                                           "1.0,600.0,9.0,2,0,1.0\n")
    return folder


def test_requests_arrive_at_their_queued_ts(tmp_path):
    """Arrivals are queued_ts less the first (0, 0.25, 2.0 s), in arrival order, with their lengths."""
    run = read_real_run(write_run(tmp_path))
    assert run.fmt == "llmservingsim" and run.name == "RTX4090-Llama-3.1-8B"
    assert run.requests["arrival_s"].tolist() == [0.0, 0.25, 2.0]
    assert run.requests["prompt_tokens"].tolist() == [100, 200, 300]
    assert run.requests["output_tokens"].tolist() == [5, 1, 3]
    assert run.requests["succeeded"].all()
    assert run.workload == {"clock": "engine"}


def test_measured_from_the_engines_queue(tmp_path):
    """TTFT 0.5, 0.75, 0.25 s; E2E 1.3, 0.75, 0.75 s; TPOT over outputs longer than one: 0.8 / 4 =
    0.2 and 0.5 / 2 = 0.25 s; ITL pooled 1.3 / 6; 3 requests over 2.75 s (first queued to last
    token)."""
    m = read_real_run(write_run(tmp_path)).measured["overall"]
    assert (m["count"], m["failures"]) == (3, 0)
    assert m["ttft_mean"] == pytest.approx(0.5) and m["ttft_median"] == pytest.approx(0.5)
    assert m["e2e_mean"] == pytest.approx(2.8 / 3) and m["e2e_median"] == pytest.approx(0.75)
    assert m["tpot_mean"] == pytest.approx(0.225) and m["tpot_p90"] == pytest.approx(0.245)
    assert m["itl_mean"] == pytest.approx((0.8 + 0.5) / 6)
    assert m["requests_per_s"] == pytest.approx(3 / 2.75)


def test_engine_settings_pool_and_gpu(tmp_path):
    """meta.json's engine_kwargs and kv_cache under vLLM's names; the GPU from the device name."""
    run = read_real_run(write_run(tmp_path).parent)  # the <run> folder reads as its vllm/ folder
    assert run.engine == {"model": "meta-llama/Llama-3.1-8B", "tensor_parallelism": 1, "data_parallel_size": 1,
                          "enable_expert_parallel": False, "max_num_seqs": 256, "max_num_batched_tokens": 2048,
                          "max_model_len": 32768, "kv_cache_dtype": "auto", "dtype": "bfloat16", "num_gpu_blocks": 2588,
                          "block_size": 16, "gpu_memory_utilization": 0.9, "enable_prefix_caching": True,
                          "vllm_version": "0.19.0"}
    assert run.info == {"gpu": "rtx-4090"}


def test_gpu_from_the_folder_where_meta_has_no_hardware(tmp_path):
    """A run recorded before meta.json kept hardware (and kv_cache): the GPU from its <GPU> folder,
    LLMServingSim's hardware name; no pool size; an unknown folder names no GPU."""
    meta = {k: v for k, v in META.items() if k not in ("hardware", "kv_cache")}
    run = read_real_run(write_run(tmp_path, meta=meta, gpu_folder="RTXPRO6000"))
    assert run.info == {"gpu": "rtx-pro-6000"} and "num_gpu_blocks" not in run.engine
    assert read_real_run(write_run(tmp_path / "other", meta=meta, gpu_folder="A100")).info == {}


def test_request_without_metrics_is_a_failure(tmp_path):
    """A request vLLM returned no metrics for (every stamp null) counts as failed and never arrives."""
    rows = request_rows()
    rows[1].update(queued_ts=None, scheduled_ts=None, first_token_ts=None, last_token_ts=None)
    run = read_real_run(write_run(tmp_path, rows=rows))
    assert run.requests["request_id"].tolist() == ["r0", "r2"]
    assert run.requests["arrival_s"].tolist() == [0.0, 2.0]
    assert (run.measured["overall"]["count"], run.measured["overall"]["failures"]) == (2, 1)


def _edit_row(index: int, **changes) -> list[dict]:
    rows = request_rows()
    for key, value in changes.items():
        if value is ...:
            del rows[index][key]
        else:
            rows[index][key] = value
    return rows


def _edit_meta(dotted: str, value) -> dict:
    meta = copy.deepcopy(META)
    node = meta
    *parents, last = dotted.split(".")
    for part in parents:
        node = node[part]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return meta


# (id, meta, rows, file, row, field, message fragment)
BAD = [
    ("no-output", None, _edit_row(1, output_toks=...), "requests.jsonl", 2, "output_toks", "missing"),
    ("zero-input", None, _edit_row(2, input_toks=0), "requests.jsonl", 3, "input_toks", "got 0"),
    ("text-stamp", None, _edit_row(0, first_token_ts="soon"), "requests.jsonl", 1, "first_token_ts", "'soon'"),
    ("one-stamp-null", None, _edit_row(2, last_token_ts=None), "requests.jsonl", 3, "last_token_ts",
     "other timestamps"),
    ("last-before-first", None, _edit_row(0, last_token_ts=1000.4), "requests.jsonl", 1, "last_token_ts",
     "before first_token_ts"),
    ("no-requests", None, [], "requests.jsonl", None, None, "no requests"),
    ("no-model", _edit_meta("model", ...), None, "meta.json", None, "model", "missing"),
    ("text-max-num-seqs", _edit_meta("engine_kwargs.max_num_seqs", "many"), None, "meta.json", None,
     "engine_kwargs.max_num_seqs", "'many'"),
    ("zero-blocks", _edit_meta("kv_cache.num_gpu_blocks", 0), None, "meta.json", None, "kv_cache.num_gpu_blocks",
     ">= 1"),
]


@pytest.mark.parametrize("meta,rows,file,row,field,fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_malformed_run_names_file_row_field(tmp_path, meta, rows, file, row, field, fragment):
    """A malformed run is one TraceError naming the file, the 1-based request row and the field."""
    folder = write_run(tmp_path, meta=meta, rows=rows)
    with pytest.raises(TraceError) as ei:
        read_real_run(folder)
    e = ei.value
    assert (e.path, e.row, e.field) == (str(folder / file), row, field)
    assert fragment in str(e) and "\n" not in str(e)


def test_line_numbers_count_blank_lines(tmp_path):
    """The row named is the file's line: a blank line before it counts."""
    folder = write_run(tmp_path, rows=_edit_row(1, output_toks=0))
    text = (folder / "requests.jsonl").read_text()
    (folder / "requests.jsonl").write_text("\n" + text)
    with pytest.raises(TraceError) as ei:
        read_real_run(folder)
    assert (ei.value.row, ei.value.field) == (3, "output_toks")


# ---------------------------------------------------------------------------------------------
# an older vllm benchmarks/benchmark_serving.py --save-result file: no start_times, no latencies

OLD_BENCH = {"date": "20240601-120000", "backend": "vllm", "model_id": "meta-llama/Llama-2-7b-hf",
             "num_prompts": 3, "request_rate": "inf", "duration": 2.0,
             "input_lens": [10, 20, 30], "output_lens": [3, 1, 2], "ttfts": [0.1, 0.2, 0.3],
             "itls": [[0.05, 0.25], [], [0.5]], "generated_texts": ["a b c", "d", "e f"], "errors": ["", "", ""]}


def test_old_bench_latency_is_ttft_plus_its_gaps(tmp_path):
    """Latencies 0.1 + 0.3, 0.2, 0.3 + 0.5; TPOT (latency - TTFT) / (output - 1): 0.15 and 0.5;
    every request sent at 0 under request_rate "inf"."""
    p = tmp_path / "old.json"
    p.write_text(json.dumps(OLD_BENCH))
    run = read_real_run(p)
    m = run.measured["overall"]
    assert m["e2e_mean"] == pytest.approx((0.4 + 0.2 + 0.8) / 3) and m["e2e_median"] == pytest.approx(0.4)
    assert m["tpot_mean"] == pytest.approx((0.15 + 0.5) / 2)
    assert m["itl_mean"] == pytest.approx(0.8 / 3)
    assert run.workload["send.rate"] == np.inf and run.workload["send.burstiness"] == 1.0
    assert run.requests["arrival_s"].isna().all()  # drawn when the replay runs
    assert run.requests["request_id"].tolist() == ["r0", "r1", "r2"]  # the order sent


def test_old_bench_keeps_its_latencies_where_given(tmp_path):
    """A file with latencies but no start_times reads its latencies, not TTFT + gaps."""
    p = tmp_path / "old.json"
    p.write_text(json.dumps(dict(OLD_BENCH, latencies=[1.0, 1.0, 1.0])))
    assert read_real_run(p).measured["overall"]["e2e_mean"] == pytest.approx(1.0)


def test_send_times_as_the_old_client_spaces_them():
    """The first at 0, then gamma gaps of mean 1 / rate (shape = burstiness); all at 0 at inf."""
    assert send_times(3, np.inf, 1.0, 0).tolist() == [0.0, 0.0, 0.0]
    t = send_times(20001, 4.0, 1.0, 7)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert np.mean(np.diff(t)) == pytest.approx(0.25, rel=0.03)
    gaps = np.diff(send_times(20001, 4.0, 0.25, 7))  # burstier: the same mean, variance 1/(rate^2 b)
    assert np.mean(gaps) == pytest.approx(0.25, rel=0.05) and np.var(gaps) == pytest.approx(0.25, rel=0.1)


OLD_BAD = [
    ("no-rate", {"request_rate": ...}, "start_times", "no request_rate"),
    ("capped", {"max_concurrency": 8}, "max_concurrency", "free slot"),
    ("ramp", {"ramp_up_strategy": "linear"}, "ramp_up_strategy", "ramped"),
    ("zero-rate", {"request_rate": 0}, "request_rate", "got 0"),
    ("no-ttfts", {"ttfts": ...}, "ttfts", "benchmark_serving.py one with --save-result"),
]


@pytest.mark.parametrize("changes,field,fragment", [c[1:] for c in OLD_BAD], ids=[c[0] for c in OLD_BAD])
def test_old_bench_refusals_name_the_field(tmp_path, changes, field, fragment):
    """Without start_times the sends must follow the file's request_rate: a file that does not say
    it, or whose client sent otherwise, is one TraceError naming the field."""
    data = dict(OLD_BENCH)
    for key, value in changes.items():
        if value is ...:
            del data[key]
        else:
            data[key] = value
    p = tmp_path / "old.json"
    p.write_text(json.dumps(data))
    with pytest.raises(TraceError) as ei:
        read_real_run(p)
    assert (ei.value.path, ei.value.field) == (str(p), field)
    assert fragment in str(ei.value)


def test_a_fact_tables_requests_come_from_the_table_beside_it(tmp_path):
    """A fact table's runs take their requests from ``<name>_requests.csv`` beside it; a value
    that is not one is refused naming the file, row and field."""
    from pagesim.traces.real_runs import read_real_runs, requests_table_of

    shipped = ROOT / "experiments" / "data" / "llmservingsim_runs.csv"
    runs = {run.name: run for run in read_real_runs(shipped)}
    assert runs["RTX4090-Llama-3.1-8B"].requests is not None and len(runs["RTX4090-Llama-3.1-8B"].requests) == 300
    facts = tmp_path / "runs.csv"
    facts.write_text(shipped.read_text())
    rows = "run,request_id,arrival_s,prompt_tokens,output_tokens,succeeded\n"
    requests_table_of(facts).write_text(rows + "RTX4090-Llama-3.1-8B,r0,0.0,12,5,True\n"
                                        "RTX4090-Llama-3.1-8B,r1,0.5,7,3,False\n")
    mine = {run.name: run for run in read_real_runs(facts)}
    table = mine["RTX4090-Llama-3.1-8B"].requests
    assert table["prompt_tokens"].tolist() == [12, 7] and table["succeeded"].tolist() == [True, False]
    assert mine["RTXPRO6000-Qwen3-32B"].requests is None  # not listed beside it
    requests_table_of(facts).write_text(rows + "RTX4090-Llama-3.1-8B,r0,0.0,12,5,yes\n")
    with pytest.raises(TraceError, match="expected True or False") as e:
        read_real_runs(facts)
    assert (e.value.row, e.value.field) == (1, "succeeded")
    requests_table_of(facts).write_text(rows + "RTX4090-Llama-3.1-8B,r0,0.0,0,5,True\n")
    with pytest.raises(TraceError) as e:
        read_real_runs(facts)
    assert e.value.field == "prompt_tokens"
    requests_table_of(facts).write_text("run,request_id\nx,r0\n")
    with pytest.raises(TraceError, match="missing column") as e:
        read_real_runs(facts)
    assert e.value.field == "arrival_s"
