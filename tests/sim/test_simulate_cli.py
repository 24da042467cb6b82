"""`pagesim simulate`: outputs, JSON, TOML config precedence, and clean errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pagesim.sim.cli import main
from pagesim.sim.config import SimConfig
from pagesim.sim.errors import ConfigError
from pagesim.sim.metrics import MEMORY_CATEGORIES
from pagesim.sim.specs import GiB, get_gpu, get_model, kv_capacity


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_simulate_writes_outputs(tmp_path, capsys):
    out = tmp_path / "run"
    rc, stdout, err = run_cli(capsys, "simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "30",
                              "--system", "orca-pow2", "--kv-gib", "4", "--seed", "1", "--out", str(out),
                              "--no-progress")
    assert rc == 0, err
    summary = json.loads((out / "summary.json").read_text())
    req = pd.read_csv(out / "requests.csv")
    steps = pd.read_csv(out / "steps.csv")
    assert summary["system"] == "orca-pow2"
    assert summary["completed"] + summary["rejected"] == len(req) == summary["workload"]["rows"]
    mem = [f"mem_{c}" for c in MEMORY_CATEGORIES]
    assert (steps[mem].sum(axis=1) == summary["kv_capacity_tokens"]).all()
    assert abs(sum(summary[m] for m in mem) - 1) < 1e-9
    assert "token states" in stdout.lower() and str(out) in stdout
    # every line of the summary fits 100 columns: the cost model's band (170 characters on this
    # borrowed-GPU run) wraps under its own column
    band = [line for line in stdout.splitlines() if line.startswith("cost model")]
    assert band and "a100-40gb itself unmeasured" in stdout
    assert all(len(line) <= 100 for line in stdout.splitlines() if str(out) not in line)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["reservation"] == "pow2" and cfg["kv_gib"] == 4


def test_simulate_json_is_one_object(capsys):
    rc, stdout, err = run_cli(capsys, "simulate", "--duration", "20", "--kv-gib", "2", "--max-seq-len", "4096",
                              "--json", "--no-progress")
    assert rc == 0, err
    assert err.startswith("defaults: vllm-v1")  # said on stderr, not in the JSON
    obj = json.loads(stdout)  # exactly one JSON document
    for key in ("completed", "rejected", "duration_s", "request_throughput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                "p99_itl_ms", "mean_e2el_ms", "normalized_latency_s_per_token", "avg_batch_size",
                "num_preemptions", "mem_token_states", "mem_free_idle", "kv_capacity_tokens", "wall_time_s"):
        assert key in obj, key


def test_toml_config_then_flags_win(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text('system = "orca-max"\n[simulation]\nkv-gib = 3\nmax_num_seqs = 8\n')
    rc, stdout, err = run_cli(capsys, "simulate", "--config", str(toml), "--duration", "20", "--max-num-seqs", "4",
                              "--json", "--no-progress")
    assert rc == 0, err
    obj = json.loads(stdout)
    assert obj["system"] == "orca-max"
    assert obj["kv_capacity_tokens"] == kv_capacity(get_model("opt-13b"), kv_bytes=3 * GiB).capacity_tokens


@pytest.mark.parametrize("argv, needle", [
    (["--model", "gpt-9"], "unknown model 'gpt-9' (presets: pagesim simulate --help"),
    (["--gpu", "tpu"], "valid GPUs"),
    (["--model", "llama-2-70b", "--gpu", "a100-40gb"], "--tp"),
    (["--block-size", "0"], "block_size"),
    (["--kv-gib", "0.001"], "less than one block"),
])
def test_bad_config_exits_2_with_one_line(capsys, argv, needle):
    rc, _, err = run_cli(capsys, "simulate", "--duration", "10", "--no-progress", *argv)
    assert rc == 2
    assert err.startswith("pagesim: error:") and needle in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_missing_trace_file_is_a_clean_error(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "simulate", "--trace", str(tmp_path / "nope.csv"), "--no-progress")
    assert rc == 2 and "nope.csv" in err and "Traceback" not in err


def test_kv_capacity_of_the_paper():
    # OPT-13B fp16: 2 * 40 layers * 40 heads * 128 * 2 B = 819,200 B; 12 GiB -> 15,728 slots
    m = get_model("opt-13b")
    assert m.kv_bytes_per_token() == 819_200
    assert kv_capacity(m, kv_bytes=12 * GiB).capacity_tokens == 15_728
    # derived from the GPU: 40 GiB x 0.9 - 2 x params - 2 GiB activations
    b = kv_capacity(m, get_gpu("a100-40gb"))
    assert b.capacity_tokens == int((40 * GiB * 0.9 - m.weight_bytes - 2 * GiB) // 819_200)
    with pytest.raises(ConfigError, match="--tp"):
        kv_capacity(get_model("llama-2-70b"), get_gpu("a100-40gb"))


def test_hf_config_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                             "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336,
                             "vocab_size": 128256, "max_position_embeddings": 8192}))
    m = get_model(str(p))
    assert (m.num_kv_heads, m.head_dim, m.max_seq_len) == (8, 128, 8192)
    assert m.kv_bytes_per_token() == get_model("llama-3-8b").kv_bytes_per_token() == 131_072
    bad = tmp_path / "bad.json"
    bad.write_text('{"hidden_size": 10')
    with pytest.raises(ConfigError, match="bad.json"):
        get_model(str(bad))


def test_system_presets_and_unknown_settings():
    assert SimConfig.for_system("token").block_size == 1
    assert SimConfig.for_system("orca-oracle").reservation == "oracle"
    with pytest.raises(ConfigError, match="valid systems"):
        SimConfig.for_system("orca-magic")
    with pytest.raises(ConfigError, match="unknown setting"):
        SimConfig.for_system("vllm", blocksize=8)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="swap_gib must be (a finite number|>= 0)"):
            SimConfig.for_system("vllm", preemption="swap", swap_gib=bad)
