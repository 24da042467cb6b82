"""An LLMServingSim vLLM run and an older vllm benchmark_serving.py file replayed (pagesim
validate --against; experiments/real_validate.py), on tiny synthetic runs written by hand into
tmp_path; the GPU presets those runs use and the Qwen3 presets."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pagesim.experiments.real_validate import pool_gib, replay_config, validate_run
from pagesim.sim.cli import main
from pagesim.sim.cost.calibration import describe_band, error_band
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import resolve_budget
from pagesim.sim.specs import get_gpu
from pagesim.sim.specs.hf_config import model_from_hf_config
from pagesim.sim.specs.presets import get_model, preset_of_hf_id
from pagesim.traces.real_runs import read_real_run, send_times
from tests.traces.test_llmservingsim_runs import META, OLD_BENCH, write_run


def test_pool_is_the_runs_block_count(tmp_path):
    """2,588 blocks of 16 tokens of Llama-3.1-8B (32 layers x 2 x 8 KV heads x 128 x 2 B = 128 KiB a
    token) are 5.0546875 GiB, and the replay's pool holds exactly those 41,408 tokens."""
    run = read_real_run(write_run(tmp_path))
    cfg = replay_config(run, None)
    assert cfg.kv_gib == 2588 * 16 * 131072 / 2**30 == 5.0546875
    assert resolve_budget(cfg)[2].capacity_tokens == 41408
    assert (cfg.gpu, cfg.block_size, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_seq_len) == \
        ("rtx-4090", 16, 256, 2048, 32768)
    assert cfg.system == "vllm-v1" and cfg.prefix_caching and cfg.gpu_memory_utilization == 0.9
    assert replay_config(run, None, {"kv_gib": 3.0}).kv_gib == 3.0  # the caller's pool wins


def test_pool_per_gpu_of_a_tp_group_and_fp8():
    """At TP 2 a GPU keeps half the KV heads; fp8 one byte an element."""
    settings = {"model": "qwen3-32b", "block_size": 16}
    one = pool_gib(1000, settings, "run")
    assert one == 1000 * 16 * 64 * 2 * 8 * 128 * 2 / 2**30
    assert pool_gib(1000, dict(settings, tensor_parallel=2), "run") == one / 2
    assert pool_gib(1000, dict(settings, kv_cache_dtype="fp8"), "run") == one / 2


@pytest.mark.parametrize("key,value,fragment", [
    ("dtype", "float32", "32-bit weights"),
])
def test_unmodelled_engine_setting_refused(tmp_path, capsys, key, value, fragment):
    """A run served with what the replay does not model: exit 2, one line naming the setting."""
    meta = json.loads(json.dumps(META))
    meta["engine_kwargs"][key] = value
    folder = write_run(tmp_path, meta=meta)
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        replay_config(read_real_run(folder), None)
    assert main(["validate", "--against", str(folder), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{key} = {value}" in err[0] and fragment in err[0]


def test_replay_times_from_the_engines_queue(tmp_path):
    """The run was timed from the engine's queue: the replay's TTFT and E2E are its engine times,
    without the serving cost model's front end (8 ms), and its requests arrive at 0, 0.25, 2 s."""
    run = read_real_run(write_run(tmp_path))
    cfg = replay_config(run, None, {"cost_model": "serving"})
    v = validate_run(run, cfg)
    table = v.result.requests
    assert sorted(table["arrival_s"]) == [0.0, 0.25, 2.0]
    engine_ttft = (table["first_token_s"] - table["arrival_s"]).to_numpy()
    engine_e2e = (table["finish_s"] - table["arrival_s"]).to_numpy()
    assert v.simulated["overall"]["ttft_mean"] == pytest.approx(engine_ttft.mean(), rel=1e-12)
    assert v.simulated["overall"]["e2e_mean"] == pytest.approx(engine_e2e.mean(), rel=1e-12)
    assert (table["ttft_s"] - engine_ttft).abs().max() > 1e-3  # the request table itself keeps the front end


def test_old_bench_sends_drawn_with_the_seed(tmp_path):
    """An older vllm bench file at 2 requests/s: the replay sends as send_times draws them with
    the replay's seed; its measured E2E is TTFT + the gaps."""
    p = tmp_path / "old.json"
    p.write_text(json.dumps(dict(OLD_BENCH, request_rate=2.0)))
    run = read_real_run(p)
    v = validate_run(run, replay_config(run, "h100-80gb"), seed=5)
    drawn = send_times(3, 2.0, 1.0, 5)
    assert np.allclose(np.sort(v.result.requests["arrival_s"].to_numpy()), drawn - drawn[0])
    assert v.measured["overall"]["e2e_median"] == pytest.approx(0.4)


def test_cli_replays_an_llmservingsim_run(tmp_path, capsys):
    """validate --against <GPU>/<run>/vllm: exit 0, the GPU from the run's files, the table."""
    assert main(["validate", "--against", str(write_run(tmp_path)), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "RTX4090-Llama-3.1-8B (llmservingsim, 3 requests measured)" in out
    assert "vllm-v1 on rtx-4090, TP 1" in out and "overall  TTFT" in out
    assert "rtx-4090: no fitted run" in out
    assert max(len(line) for line in out.splitlines()) <= 100


# ---------------------------------------------------------------------------------------------
# presets


@pytest.mark.parametrize("name,alias,mem_mib,bf16,fp8,bandwidth,link", [
    ("rtx-4090", "RTX4090", 24_564, 165.2e12, 330.3e12, 1008e9, 25e9),
    ("rtx-pro-6000", "RTXPRO6000", 97_887, 503.8e12, 1007.6e12, 1597e9, 50e9),
])
def test_rtx_presets(name, alias, mem_mib, bf16, fp8, bandwidth, link):
    """The datasheet figures (sim/specs/gpus.py); LLMServingSim's hardware names as aliases; FP8
    twice BF16; PCIe (no NVLink) for the TP all-reduce and for swapping."""
    gpu = get_gpu(alias)
    assert gpu.name == name and gpu.mem_bytes == mem_mib * 2**20
    assert (gpu.peak_flops, gpu.peak_fp8_flops, gpu.mem_bw) == (bf16, fp8, bandwidth)
    assert gpu.peak_fp8_flops == pytest.approx(2 * gpu.peak_flops, rel=1e-3)
    assert gpu.interconnect_bw == gpu.pcie_bw == link


@pytest.mark.parametrize("gpu", ["rtx-4090", "rtx-pro-6000"])
def test_rtx_presets_say_they_are_unmeasured(gpu):
    """No fitted run of their own: the serving model's constants are the H100's, and the band
    takes the runs on GPUs held out of the fit and says so."""
    band = error_band("serving", gpu, moe=False)
    assert band["cost_error"]["measured_on"] == "h100-80gb"
    assert band["cost_error"]["regime_sets"] == ["dense", "held_out_gpu"]
    assert f"{gpu}: no fitted run; the band takes" in describe_band(band, gpu)


QWEN3_32B = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_size": 5120,
             "intermediate_size": 25600, "max_position_embeddings": 40960, "num_attention_heads": 64,
             "num_hidden_layers": 64, "num_key_value_heads": 8, "tie_word_embeddings": False, "vocab_size": 151936,
             "torch_dtype": "bfloat16", "sliding_window": None, "use_sliding_window": False}
QWEN3_30B_A3B_2507 = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "head_dim": 128,
                      "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 262144,
                      "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                      "decoder_sparse_step": 1, "mlp_only_layers": [], "num_attention_heads": 32,
                      "num_hidden_layers": 48, "num_key_value_heads": 4, "tie_word_embeddings": False,
                      "vocab_size": 151936, "torch_dtype": "bfloat16", "sliding_window": None,
                      "use_sliding_window": False}


@pytest.mark.parametrize("hf_id,preset,config", [
    ("Qwen/Qwen3-32B", "qwen3-32b", QWEN3_32B),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b-2507", QWEN3_30B_A3B_2507),
])
def test_qwen3_presets_are_their_configs(tmp_path, hf_id, preset, config):
    """The Qwen3 presets hold what their config.json files say (read by sim/specs/hf_config.py),
    and the Hugging Face ids the runs name find them."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(config))
    read = model_from_hf_config(p)
    ours = get_model(preset)
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                  "vocab_size", "max_seq_len", "tie_word_embeddings", "moe"):
        assert getattr(ours, field) == getattr(read, field), field
    assert ours.weight_bytes == read.weight_bytes
    assert preset_of_hf_id(hf_id) == preset


def test_qwen3_30b_a3b_base_context():
    """The base model: the 2507 model's shapes with a 40,960-token context; about 30.5 B weights."""
    base, newer = get_model("qwen3-30b-a3b"), get_model("qwen3-30b-a3b-2507")
    assert base.max_seq_len == 40960 and newer.max_seq_len == 262144
    assert base.weight_bytes == newer.weight_bytes
    assert base.weight_bytes / 2 == pytest.approx(30.5e9, rel=0.01)
    assert get_model("qwen3-32b").weight_bytes / 2 == pytest.approx(32.8e9, rel=0.01)


def test_the_shipped_tables_replay_every_run(capsys):
    """``--against llmservingsim_runs``: the four runs replay from the shipped fact and per-request
    tables, Qwen3-30B-A3B's data-parallel ranks with expert parallel among them."""
    assert main(["validate", "--against", "llmservingsim_runs", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "left out" not in err
    assert "4 real runs of llmservingsim_runs" in out and "RTXPRO6000-Qwen3-30B-A3B-Instruct-2507" in out


def test_data_parallel_ranks_replay_as_one_expert_parallel_group(tmp_path):
    """A run of 2 data-parallel ranks with expert parallel (vLLM's --data-parallel-size 2
    --enable-expert-parallel) replays as 2 replicas, each one rank of the group, priced for 2
    ranks whose experts are split over the 2 GPUs (its 3 requests, each done before the next
    arrives, all go to rank 0 here, the lowest of the tied; vLLM would send the second to rank 1).
    The same mixture of experts without expert parallel is refused (vLLM shards each expert over
    both ranks' GPUs); a dense model's ranks replay as 2 replicas of their own."""
    meta = json.loads(json.dumps(META))
    meta["model"] = "Qwen/Qwen3-30B-A3B"
    meta["engine_kwargs"].update(model="Qwen/Qwen3-30B-A3B", data_parallel_size=2, enable_expert_parallel=True,
                                 max_model_len=4096)
    run = read_real_run(write_run(tmp_path / "ep", meta=meta))
    cfg = replay_config(run, "rtx-pro-6000", {"kv_gib": 4.0})
    assert cfg.expert_parallel and cfg.data_parallel == 1  # the replicas are the ranks: the cluster sets 2
    v = validate_run(run, cfg)
    assert len(v.result.replica_summaries) == 2 and set(v.result.requests["replica"]) == {0}
    meta["engine_kwargs"]["enable_expert_parallel"] = False
    with pytest.raises(ConfigError, match="without expert parallel"):
        replay_config(read_real_run(write_run(tmp_path / "moe-dp", meta=meta)), "rtx-pro-6000")
    dense = json.loads(json.dumps(META))
    dense["engine_kwargs"].update(data_parallel_size=2, enable_expert_parallel=True)  # ignored by a dense model
    plain = read_real_run(write_run(tmp_path / "dp", meta=dense))
    w = validate_run(plain, replay_config(plain, None))
    assert len(w.result.replica_summaries) == 2 and not w.config.expert_parallel
    assert [r["expert_group"] for r in v.result.replica_summaries] == [2, 2]  # each rank priced for the group
