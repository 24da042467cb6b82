"""Mamba-2 and gated-delta-net layers read from config.json (Nemotron-H, Granite-4.0-H,
Qwen3-Next): each layer's kind, its recurrent state per sequence and GPU, its parameters, the
KV cache groups vLLM v1 makes of them, and the refusals. Small configs, every number worked by
hand from the rules in ``sim/specs/model.py``; the real configs and vLLM's own state shapes are
``tests/peers/test_state_shapes_peer.py``'s."""

from __future__ import annotations

import pytest

from pagesim.sim.errors import ConfigError
from pagesim.sim.specs import get_model
from pagesim.sim.specs.kv_groups import kv_cache_groups
from tests.sim.test_model_configs import write

NEMOTRON = {"model_type": "nemotron_h", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 64, "intermediate_size": 512, "vocab_size": 1000, "num_hidden_layers": 5,
            "hybrid_override_pattern": "M-M*-", "mamba_num_heads": 8, "mamba_head_dim": 32, "n_groups": 2,
            "ssm_state_size": 16, "conv_kernel": 4, "max_position_embeddings": 4096}
GRANITE = {"model_type": "granitemoehybrid", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 128, "shared_intermediate_size": 256, "num_local_experts": 4,
           "num_experts_per_tok": 2, "vocab_size": 1000, "num_hidden_layers": 3,
           "layer_types": ["mamba", "attention", "mamba"], "mamba_expand": 2, "mamba_n_heads": 16,
           "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_d_conv": 4,
           "tie_word_embeddings": True, "max_position_embeddings": 4096}
QWEN_NEXT = {"model_type": "qwen3_next", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 64, "intermediate_size": 512, "vocab_size": 1000, "num_hidden_layers": 4,
             "full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
             "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4,
             "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
             "shared_expert_intermediate_size": 128, "max_position_embeddings": 4096}


def test_nemotron_h_pattern_state_and_parameters(tmp_path):
    m = get_model(write(tmp_path, NEMOTRON))
    assert m.kinds == ("mamba2", "mlp", "mamba2", "full_attention", "mlp") and not m.mixers_have_mlp
    assert m.num_attention_layers == 1 and m.kv_bytes_per_token() == 2 * 2 * 64 * 2
    # conv: (d_inner 8 x 32 = 256 + 2 groups x 2 x 16) = 320 x (4 - 1) x 2 B = 1,920; SSM in float32
    # (vLLM's default for Nemotron-H): 8 heads x 32 x 16 x 4 B = 16,384 -> 18,304 a layer, 2 layers
    assert m.state_bytes_per_layer("mamba2") == 18_304 and m.state_bytes_per_seq() == 36_608
    # TP 2: 2 groups split: 160 x 3 x 2 = 960 + 4 x 32 x 16 x 4 = 8,192
    assert m.state_bytes_per_layer("mamba2", 2) == 9_152
    # TP 4: 2 groups do not split over 4, so each shard keeps one: (256 + 2 x 4 x 16) / 4 = 96 x 3 x 2
    # = 576 + 2 x 32 x 16 x 4 = 4,096
    assert m.state_bytes_per_layer("mamba2", 4) == 4_672
    with pytest.raises(ConfigError, match="does not split over tensor parallel 16"):
        m.state_bytes_per_layer("mamba2", 16)  # 8 heads over 16 GPUs
    # Mamba-2 layer: in_proj 256 x (2 x 256 + 2 x 2 x 16 + 8) = 149,504 + conv 320 x 4 = 1,280 + out
    # 256 x 256 = 65,536 -> 216,320, no MLP; MLP layer: up and down 2 x 256 x 512 = 262,144, no mixer;
    # attention layer 256 x 256 + 2 x 256 x 128 + 256 x 256 = 196,608, no MLP:
    # 2 x 216,320 + 2 x 262,144 + 196,608 = 1,153,536 + embedding and head 2 x 1,000 x 256 = 512,000
    assert m.num_params == 1_665_536 and m.active_params == 1_153_536 + 256_000
    # an SSM state kept in the model's dtype where the config says so: 16,384 / 2
    half = get_model(write(tmp_path, dict(NEMOTRON, mamba_ssm_cache_dtype="bfloat16"), "half"))
    assert half.state_bytes_per_layer("mamba2") == 1_920 + 8_192


def test_granite_4_h_layers_experts_and_a_dense_variant(tmp_path):
    m = get_model(write(tmp_path, GRANITE))
    assert m.kinds == ("mamba2", "full_attention", "mamba2") and m.mixers_have_mlp
    # d_inner = mamba_expand x hidden = 512; conv (512 + 2 x 1 x 16) x 3 x 2 = 3,264 + SSM in the
    # model's dtype 16 x 32 x 16 x 2 = 16,384
    assert m.state_bytes_per_layer("mamba2") == 19_648
    # TP 2: the one group widened to 2: (512 + 64) / 2 x 3 x 2 = 1,728 + 8 x 32 x 16 x 2 = 8,192
    assert m.state_bytes_per_layer("mamba2", 2) == 9_920
    # Mamba-2 layer: 256 x (2 x 512 + 32 + 16) = 274,432 + conv 544 x 4 = 2,176 + out 131,072
    # = 407,680; attention 196,608; every layer: 4 experts x 3 x 256 x 128 = 393,216 + shared gated
    # MLP 3 x 256 x 256 = 196,608 + router 4 x 256 -> 590,848; tied embedding 256,000
    assert m.num_params == 2 * 407_680 + 196_608 + 3 * 590_848 + 256_000
    # active: 2 of the 4 experts, 196,608 + 196,608 + 1,024 = 394,240 a layer, and the head
    assert m.active_params == 2 * 407_680 + 196_608 + 3 * 394_240 + 256_000
    dense = get_model(write(tmp_path, dict(GRANITE, num_local_experts=0), "dense"))
    assert dense.moe is None and dense.intermediate_size == 256  # the shared MLP alone, gated
    assert dense.num_params == 2 * 407_680 + 196_608 + 3 * 196_608 + 256_000


def test_qwen3_next_delta_net_and_gated_attention(tmp_path):
    m = get_model(write(tmp_path, QWEN_NEXT))
    # every 2nd layer full attention (transformers' layer_types from full_attention_interval)
    assert m.kinds == ("gated_delta_net", "full_attention") * 2 and m.attention_output_gate
    # conv (2 x 2 x 32 + 4 x 32 = 256) x 3 x 2 = 1,536 + recurrent 4 v heads x 32 x 32 x 2 = 8,192
    assert m.state_bytes_per_layer("gated_delta_net") == 9_728
    assert m.state_bytes_per_layer("gated_delta_net", 2) == 768 + 4_096
    with pytest.raises(ConfigError, match="does not split over tensor parallel 8"):
        m.state_bytes_per_layer("gated_delta_net", 8)  # 4 value heads over 8 GPUs
    # delta net: in_proj_qkvz 256 x (2 x 64 + 2 x 128) = 98,304 + in_proj_ba 256 x 8 = 2,048 + conv
    # 256 x 4 = 1,024 + out 128 x 256 = 32,768 -> 134,144; gated attention: q and its gate
    # 2 x 256 x 256 + 2 x 256 x 128 + 256 x 256 = 262,144; MoE every layer 8 x 3 x 256 x 64 = 393,216
    # + shared 3 x 256 x 128 = 98,304 + router 2,048 = 493,568; embedding and head 512,000
    assert m.num_params == 2 * 134_144 + 2 * 262_144 + 4 * 493_568 + 512_000
    listed = dict(QWEN_NEXT, layer_types=["linear_attention", "linear_attention", "full_attention", "full_attention"])
    assert get_model(write(tmp_path, listed, "listed")).kinds[:3] == ("gated_delta_net",) * 2 + ("full_attention",)


def test_vllm_v1_groups_of_the_new_layers(tmp_path):
    # Nemotron: 1 attention layer beside 2 Mamba-2 layers: group size 1 (2 < 1.5 x 1 fails), 1 full
    # and 2 state groups; a layer's state 18,304 B over 512 B per token of one attention layer: 36 tokens
    # of 16-aligned blocks -> 48; the MLP layers keep nothing
    g = kv_cache_groups(get_model(write(tmp_path, NEMOTRON)), 16)
    assert (g.full_groups, g.state_groups, g.layers_per_group, g.block_size, g.state_slots) == (1, 2, 1, 48, 35)
    # Qwen3-Next: 2 full and 2 delta-net layers, 1 group each of 2; 9,728 / 512 = 19 tokens -> 32
    g = kv_cache_groups(get_model(write(tmp_path, QWEN_NEXT)), 16)
    assert (g.full_groups, g.state_groups, g.layers_per_group, g.block_size, g.state_slots) == (1, 1, 2, 32, 19)


@pytest.mark.parametrize("change, words", [
    ({"hybrid_override_pattern": "M-E*-"}, "hybrid_override_pattern.*layer kind 'E' is not modelled"),
    ({"hybrid_override_pattern": "M-M*"}, "hybrid_override_pattern' lists 4 layers, the model has 5"),
    ({"hybrid_override_pattern": 5}, "hybrid_override_pattern' must be a string"),
    ({"mamba_ssm_cache_dtype": "int8"}, "mamba_ssm_cache_dtype' 'int8' is not modelled"),
    ({"n_groups": None}, "field 'n_groups' missing"),
])
def test_nemotron_h_refusals(tmp_path, change, words):
    cfg = {k: v for k, v in dict(NEMOTRON, **change).items() if v is not None}
    with pytest.raises(ConfigError, match=words):
        get_model(write(tmp_path, cfg))


@pytest.mark.parametrize("preset, config", [("nemotron-nano-9b-v2", "nemotron-h"), ("granite-4.0-h-tiny", "granite-4-h"),
                                            ("qwen3-next-80b-a3b", "qwen3-next")])
def test_the_presets_are_their_configs(tmp_path, preset, config):
    # each preset states its config.json (tests/sim/hybrid_configs.py: where each was read) field by field
    from dataclasses import replace
    from tests.sim.hybrid_configs import HYBRID_CONFIGS
    read = get_model(write(tmp_path, HYBRID_CONFIGS[config]))
    assert replace(read, name=preset) == get_model(preset)


def test_the_presets_against_their_published_sizes():
    # the round sizes their makers publish: "9 billion parameters" (NVIDIA), "80B" total with "3B
    # activated" (Qwen; here 3.25B without the LM head's 0.31B), "7B" (IBM's granite-4.0-h-tiny)
    assert get_model("nemotron-nano-9b-v2").num_params == pytest.approx(9e9, rel=0.02)
    qwen = get_model("qwen3-next-80b-a3b")
    assert qwen.num_params == pytest.approx(80e9, rel=0.01)
    assert qwen.active_params - qwen.vocab_size * qwen.hidden_size == pytest.approx(3e9, rel=0.1)
    assert get_model("granite-4.0-h-tiny").num_params == pytest.approx(7e9, rel=0.02)


def test_a_model_too_large_is_told_a_tensor_parallelism_it_runs_at():
    # Qwen3-Next-80B: 148.4 GiB of weights over 70 GiB (an H100 x 0.9 less 2 GiB) needs 3 GPUs, but 3
    # divides neither its 16 heads nor its delta-net heads: the suggestion is 4
    from pagesim.sim.specs import get_gpu, kv_capacity
    with pytest.raises(ConfigError, match="qwen3-next-80b-a3b needs 150.4 GiB of h100-80gb.s 72.0: try --tp 4"):
        kv_capacity(get_model("qwen3-next-80b-a3b"), get_gpu("h100-80gb"), tensor_parallel=1, states_in_pool=True)
