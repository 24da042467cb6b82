"""KV bytes per token and KV capacity in token slots, worked out by hand from the public shapes."""

from __future__ import annotations

from pagesim.sim.config import SimConfig
from pagesim.sim.run import run_simulation
from pagesim.sim.specs import GiB, get_gpu, get_model, kv_capacity


def test_opt13b_kv_bytes_per_token_is_800_kib():
    # K and V x 40 layers x 40 heads x 128 dims x 2 bytes (fp16) = 819,200 B = 800 KiB,
    # the vLLM paper's figure
    assert get_model("opt-13b").kv_bytes_per_token() == 819_200 == 800 * 1024


def test_tensor_parallel_splits_the_heads():
    # each GPU of a TP=2 group holds 20 of the 40 heads: 409,600 B per token
    assert get_model("opt-13b").kv_bytes_per_token(tensor_parallel=2) == 409_600


def test_grouped_query_attention_stores_the_kv_heads_only():
    # Llama-3-8B: 32 layers, 32 query heads but 8 KV heads of 128 dims:
    # 2 x 32 x 8 x 128 x 2 B = 131,072 B (128 KiB), not the 512 KiB of 32 heads
    assert get_model("llama-3-8b").kv_bytes_per_token() == 131_072


def test_12_gib_holds_the_papers_15728_opt13b_slots():
    # 12 GiB = 12,884,901,888 B / 819,200 B = 15,728.64: 15,728 whole slots
    budget = kv_capacity(get_model("opt-13b"), kv_bytes=12 * GiB)
    assert budget.capacity_tokens == 15_728
    assert budget.kv_bytes == 12 * GiB


def test_capacity_derived_from_gpu_memory_as_vllm_does():
    # A100-40GB: 40 GiB x 0.9 = 38,654,705,664 B usable; OPT-13B's fp16 weights are
    # 2 x 12,840,304,640 parameters = 25,680,609,280 B; the activation reserve 2 GiB =
    # 2,147,483,648 B: 10,826,612,736 B of KV / 819,200 B = 13,216.08: 13,216 slots
    budget = kv_capacity(get_model("opt-13b"), get_gpu("a100-40gb"))
    assert budget.kv_bytes == 10_826_612_736
    assert budget.capacity_tokens == 13_216


def test_kv_gib_setting_sizes_the_pool(tiny_trace):
    # --kv-gib 12 (not the GPU's memory) sets the pool: 15,728 slots, as above
    cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-40gb", kv_gib=12.0)
    result = run_simulation(cfg, tiny_trace((0.0, 8, 2)))
    assert result.summary["kv_capacity_tokens"] == 15_728


def test_llama_13b_preset_is_huggyllamas_config():
    # huggyllama/llama-13b config.json: 40 layers, hidden 5120, 40 heads (no GQA), MLP 13824,
    # vocab 32000, 2048 positions, LM head untied. KV: 2 x 40 layers x 5120 x 2 B = 819,200 B a
    # token; parameters a token multiplies: 40 x (4 x 5120^2 + 3 x 5120 x 13824) + 5120 x 32000
    from pagesim.sim.specs import get_model
    m = get_model("llama-13b")
    assert m.kv_bytes_per_token() == 819_200
    assert m.max_seq_len == 2048
    assert m.active_params == 40 * (4 * 5120 ** 2 + 3 * 5120 * 13824) + 5120 * 32000
