"""Hugging Face config.json reading, model families, presets, and what the cost model reads.

Every expected number is worked by hand in a comment from the rules in ``sim/specs/model.py``
(KV per token, parameters, weight bytes) and the shapes of the public config.json files.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from pagesim.sim.batch import StepBatch
from pagesim.sim.cli import main
from pagesim.sim.core.price import cost as C
from pagesim.sim.cost.roofline import RooflineCostModel
from pagesim.sim.errors import ConfigError
from pagesim.sim.specs.capacity import vattention_page_tokens
from pagesim.sim.specs import GPUS, MODELS, GiB, get_gpu, get_model, kv_capacity
from tests.sim.helpers import QWEN1_5_MOE

MiB = 1 << 20


def write(tmp_path, cfg: dict, folder: str = "some-folder"):
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg))
    return str(path)


def llama(**overrides):
    """meta-llama/Llama-3.1-8B-Instruct's config.json (the keys that matter)."""
    cfg = {"_name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "model_type": "llama", "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
           "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 131072,
           "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
           "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    cfg.update(overrides)
    return cfg


# Llama-3.1-8B by hand: per layer q 4096*4096 + k,v 2*4096*1024 + o 4096*4096 = 41,943,040 and
# MLP 3*4096*14336 = 176,160,768: 218,103,808 x 32 layers = 6,979,321,856 layer parameters;
# embedding 128,256 * 4,096 = 525,336,576 (and as much again for the untied LM head)
LLAMA8_LAYERS = 6_979_321_856
LLAMA8_EMBED = 525_336_576


DEEPSEEK_V3 = {
    "_name_or_path": "deepseek-ai/DeepSeek-V3", "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "vocab_size": 129280, "max_position_embeddings": 163840,
    "rope_scaling": {"factor": 40, "original_max_position_embeddings": 4096, "type": "yarn"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "num_nextn_predict_layers": 1,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]}}


def test_deepseek_v3_latent_kv_is_not_split_across_tp(tmp_path):
    # MLA caches one latent per token and layer: 61 x (512 + 64) x 2 B = 70,272 B, on every GPU
    m = get_model(write(tmp_path, DEEPSEEK_V3))
    for tp in (1, 8, 16):
        assert m.kv_bytes_per_token(tp) == 70_272
    # YaRN: original 4,096 x factor 40 = 163,840 (vLLM's rule), equal to max_position_embeddings
    assert m.max_seq_len == 163_840
    assert m.name == "deepseek-ai/DeepSeek-V3"


def test_deepseek_v3_parameters_total_active_and_fp8_bytes(tmp_path):
    m = get_model(write(tmp_path, DEEPSEEK_V3))
    # attention per layer: q_a 7168*1536 = 11,010,048; q_b 1536*128*192 = 37,748,736;
    #   kv_a 7168*576 = 4,128,768; kv_b 512*128*256 = 16,777,216; o 128*128*7168 = 117,440,512
    #   = 187,105,280, x 61 = 11,413,422,080
    # dense MLP (layers 0-2): 3*7168*18432 = 396,361,728, x 3 = 1,189,085,184
    # MoE (layers 3-60): 256 experts * 3*7168*2048 = 11,274,289,152 + shared 3*7168*2048 = 44,040,192
    #   + router 256*7168 = 1,835,008 = 11,320,164,352, x 58 = 656,569,532,416
    # embedding and untied head: 2 * 129,280*7168 = 1,853,358,080
    # total 671,025,397,760 (the "671B")
    assert m.num_params == 671_025_397_760
    # active MoE: 8 experts * 3*7168*2048 = 352,321,536 + shared 44,040,192 + router 1,835,008
    #   = 398,196,736, x 58 = 23,095,410,688; + attention 11,413,422,080 + dense 1,189,085,184
    #   + LM head 926,679,040 = 36,624,596,992 (the "37B activated" with the embedding)
    assert m.active_params == 36_624_596_992
    # FP8: layer weights 1 B each (671,025,397,760 - 1,853,358,080 = 669,172,039,680 B),
    # embedding and head in bf16 (3,706,716,160 B): 672,878,755,840 B
    assert m.weight_bytes == 672_878_755_840
    # a token reads 36,624,596,992 - 926,679,040 = 35,697,917,952 layer bytes + the bf16 head 1,853,358,080
    assert m.active_weight_bytes == 37_551_276_032


def test_deepseek_preset_is_its_config(tmp_path):
    m = get_model(write(tmp_path, DEEPSEEK_V3))
    p = MODELS["deepseek-v3"]
    assert (m.kv_bytes_per_token(8), m.num_params, m.active_params, m.weight_bytes, m.active_weight_bytes) == \
        (p.kv_bytes_per_token(8), p.num_params, p.active_params, p.weight_bytes, p.active_weight_bytes)


def test_deepseek_v2_lite_without_query_compression(tmp_path):
    cfg = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
           "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
           "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64, "num_experts_per_tok": 6,
           "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": None,
           "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 102400,
           "max_position_embeddings": 163840, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    m = get_model(write(tmp_path, cfg))
    assert m.kv_bytes_per_token(4) == 27 * 576 * 2 == 31_104
    # attention per layer: q 2048*16*192 = 6,291,456; kv_a 2048*576 = 1,179,648; kv_b 512*16*256
    #   = 2,097,152; o 16*128*2048 = 4,194,304 -> 13,762,560, x 27 = 371,589,120
    # layer 0 dense 3*2048*10944 = 67,239,936; 26 MoE layers of 64*3*2048*1408 = 553,648,128
    #   + shared 3*2048*2816 = 17,301,504 + router 131,072 = 571,080,704 -> 14,848,098,304
    # embedding + head 2*102400*2048 = 419,430,400: total 15,706,357,760 (the "16B")
    assert m.num_params == 15_706_357_760
    # active: 26 x (6*3*2048*1408 = 51,904,512 + 17,301,504 + 131,072) = 1,802,764,288
    #   + 371,589,120 + 67,239,936 + head 209,715,200 = 2,451,308,544 (the "2.4B active")
    assert m.active_params == 2_451_308_544
    assert m.name == "deepseek_v2"  # no _name_or_path: the model_type, not the folder


FALCON_7B = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
             "multi_query": True, "new_decoder_architecture": False, "vocab_size": 65024, "torch_dtype": "bfloat16"}


def test_multi_query_falcon_7b_and_starcoder_keep_one_kv_head(tmp_path):
    # Falcon-7B: 32 layers x 2 x 1 head x 64 (4544 / 71) x 2 B = 8,192 B (71 heads would be 581,632)
    f7 = get_model(write(tmp_path, FALCON_7B, "f7"))
    assert (f7.num_kv_heads, f7.head_dim, f7.kv_bytes_per_token()) == (1, 64, 8_192)
    assert f7.intermediate_size == 4 * 4544 and not f7.gated_mlp and f7.max_seq_len == 2048
    # StarCoder (gpt_bigcode): 40 layers x 2 x 1 x 128 (6144 / 48) x 2 B = 20,480 B
    sc = get_model(write(tmp_path, {"model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48, "n_layer": 40,
                                    "n_inner": 24576, "n_positions": 8192, "vocab_size": 49152,
                                    "multi_query": True}, "sc"))
    assert sc.kv_bytes_per_token() == 20_480 and sc.max_seq_len == 8192
    # per layer q 6144^2 + k,v 2*6144*128 + o 6144^2 = 77,070,336, MLP 2*6144*24576 = 301,989,888:
    # 379,060,224 x 40 = 15,162,408,960 + tied embedding 49152*6144 = 301,989,888 = 15,464,398,848
    assert sc.num_params == 15_464_398_848


def test_falcon_40b_reads_its_kv_head_keys(tmp_path):
    # 60 layers x 2 x 8 heads x 64 (8192 / 128) x 2 B = 122,880 B, in both config formats
    new = {"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
           "multi_query": True, "new_decoder_architecture": True, "num_kv_heads": 8, "vocab_size": 65024}
    old = {"model_type": "RefinedWeb", "hidden_size": 8192, "n_head": 128, "n_layer": 60, "n_head_kv": 8,
           "multi_query": True, "vocab_size": 65024}
    assert get_model(write(tmp_path, new, "new")).kv_bytes_per_token() == 122_880
    assert get_model(write(tmp_path, old, "old")).kv_bytes_per_token() == 122_880


JAMBA = {"_name_or_path": "ai21labs/Jamba-v0.1", "model_type": "jamba", "hidden_size": 4096,
         "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
         "attn_layer_period": 8, "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1,
         "num_experts": 16, "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
         "mamba_dt_rank": 256, "vocab_size": 65536, "max_position_embeddings": 262144, "sliding_window": None,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def test_jamba_counts_only_its_attention_layers(tmp_path):
    m = get_model(write(tmp_path, JAMBA))
    # attention at layers 4, 12, 20, 28: 4 x 2 x 8 x 128 x 2 B = 16,384 B (all 32 layers: 131,072)
    assert m.num_attention_layers == 4 and m.kv_bytes_per_token() == 16_384
    # each of the 28 Mamba layers keeps d_inner = 2*4096 = 8192 x (d_conv - 1 + d_state = 19) x 2 B
    # = 311,296 B per sequence: 8,716,288 B; at TP 2 half of it
    assert m.state_bytes_per_seq() == 8_716_288 and m.state_bytes_per_seq(2) == 4_358_144
    # attention 4 x (2*4096^2 + 2*4096*1024 + ...) = 4 x 41,943,040 = 167,772,160
    # mamba 28 x (in 4096*16384 = 67,108,864 + conv 8192*4 = 32,768 + x 8192*288 = 2,359,296
    #   + dt 256*8192 = 2,097,152 + A 8192*16 = 131,072 + out 8192*4096 = 33,554,432) = 28 x 105,283,584
    #   = 2,947,940,352
    # MoE on odd layers 16 x (16*3*4096*14336 + router 16*4096 = 2,818,637,824) = 45,098,205,184
    # dense MLP on even layers 16 x 3*4096*14336 = 2,818,572,288; embedding + head 2*65536*4096
    # = 536,870,912; total 51,569,360,896 (the "52B"), active (2 experts) 11,840,913,408 ("12B")
    assert m.num_params == 51_569_360_896
    assert m.active_params == 11_840_913_408


def test_jamba_state_slots_come_out_of_the_kv_pool(tmp_path):
    m = get_model(write(tmp_path, JAMBA))
    # H100 at TP 2: 80 GiB x 0.9 = 77,309,411,328 - weights 2*51,569,360,896/2 = 51,569,360,896
    # - activations 2,147,483,648 - 256 sequences x 4,358,144 = 1,115,684,864 -> 22,476,881,920 B;
    # 8,192 B/token (4 layers x 2 x 4 heads x 128 x 2) -> 2,743,760 tokens
    b = kv_capacity(m, get_gpu("h100-80gb"), tensor_parallel=2, max_num_seqs=256)
    assert (b.kv_bytes, b.capacity_tokens) == (22_476_881_920, 2_743_760)
    with pytest.raises(ConfigError, match="max_num_seqs"):
        kv_capacity(m, get_gpu("h100-80gb"), tensor_parallel=2)
    # a given KV size is the pool itself: no state comes out of it
    assert kv_capacity(m, kv_bytes=8192 * 100).capacity_tokens == 100 // 2


def test_jamba_block_type_list(tmp_path):
    kinds = ["mamba", "attention"] * 16
    cfg = dict(JAMBA, layers_block_type=kinds)
    assert get_model(write(tmp_path, cfg)).num_attention_layers == 16
    with pytest.raises(ConfigError, match="layers_block_type.*'conv'"):
        get_model(write(tmp_path, dict(JAMBA, layers_block_type=["conv"] * 32), "bad"))


def test_minimax_lightning_layers_keep_a_state_not_kv(tmp_path):
    # MiniMax-Text-01: 80 layers, softmax attention every 8th (attn_type_list 1), the rest lightning (0)
    types = [0] * 7 + [1]
    cfg = {"model_type": "minimax_text_01", "hidden_size": 6144, "intermediate_size": 9216,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 80,
           "attn_type_list": types * 10, "num_local_experts": 32, "num_experts_per_tok": 2,
           "vocab_size": 200064, "max_position_embeddings": 10240000, "tie_word_embeddings": False}
    m = get_model(write(tmp_path, cfg))
    # 10 attention layers x 2 x 8 x 128 x 2 B = 40,960 B (all 80 layers: 327,680)
    assert m.kv_bytes_per_token() == 40_960
    # 70 lightning layers x 64 heads x 128 x 128 x 2 B = 146,800,640 B per sequence (140 MiB)
    assert m.state_bytes_per_seq() == 146_800_640
    # lightning layer: qkv 3*6144*8192 + output gate 6144*8192 + out 8192*6144 = 251,658,240;
    # softmax layer: 6144*8192 + 2*6144*1024 + 8192*6144 = 113,246,208; MoE 32*3*6144*9216
    # + router 32*6144 = 5,436,014,592 (active: 2 experts 339,935,232); embedding + head 2*200064*6144
    # total 70 x 5,687,672,832 + 10 x 5,549,260,800 + 2,458,386,432 = 456,088,092,672 (the "456B")
    assert m.num_params == 456_088_092_672
    # active 70 x 591,593,472 + 10 x 453,181,440 + head 1,229,193,216 = 47,172,550,656
    # (the "45.9B activated" without the head)
    assert m.active_params == 47_172_550_656
    with pytest.raises(ConfigError, match="attn_type_list.*2"):
        get_model(write(tmp_path, dict(cfg, attn_type_list=[2] * 80), "bad"))


MIXTRAL = {"_name_or_path": "mistralai/Mixtral-8x7B-Instruct-v0.1", "model_type": "mixtral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
           "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
           "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def test_mixtral_memory_holds_every_expert(tmp_path):
    m = get_model(write(tmp_path, MIXTRAL))
    # per layer attention 41,943,040 + 8 experts * 3*4096*14336 = 1,409,286,144 + router 32,768
    # = 1,451,261,952, x 32 = 46,440,382,464 + embedding and head 2*32000*4096 = 262,144,000
    # = 46,702,526,464 parameters, 93,405,052,928 B = 86.99 GiB: not on one H100
    assert m.num_params == 46_702_526_464 and m.weight_bytes == 93_405_052_928
    # active: (41,943,040 + 2 experts 352,321,536 + router 32,768) x 32 + head 131,072,000
    assert m.active_params == 12_748_587_008 and m.active_weight_bytes == 2 * 12_748_587_008
    # with the 2 GiB activation reserve, 88.99 GiB of an H100's 80 x 0.9 = 72 GiB: TP 2 splits it
    with pytest.raises(ConfigError, match="needs 89.0 GiB of h100-80gb's 72.0: try --tp 2"):
        kv_capacity(m, get_gpu("h100-80gb"))
    assert kv_capacity(m, get_gpu("h100-80gb"), tensor_parallel=2).capacity_tokens > 0


def test_qwen_moe_shared_expert_and_sparse_step(tmp_path):
    cfg = dict(QWEN1_5_MOE)
    m = get_model(write(tmp_path, cfg))
    # Qwen1.5-MoE-A2.7B: per layer attention 4*2048^2 = 16,777,216 + 60 experts * 3*2048*1408
    # = 519,045,120 + shared 3*2048*5632 = 34,603,008 + router 60*2048 = 122,880 = 570,548,224,
    # x 24 = 13,693,157,376 + embedding and head 2*151936*2048 = 622,329,856 = 14,315,487,232 ("14.3B")
    assert m.num_params == 14_315_487_232
    # active: (16,777,216 + 4*3*2048*1408 = 34,603,008 + 34,603,008 + 122,880) x 24 + head 311,164,928
    assert m.active_params == 2_377_711_616
    # decoder_sparse_step 2: layers 1, 3, ..., 23 sparse; the 12 others dense (3*2048*5632 = 34,603,008
    # each instead of 553,771,008): 12 x 519,168,000 fewer
    sparse2 = get_model(write(tmp_path, dict(cfg, decoder_sparse_step=2), "step2"))
    assert m.num_params - sparse2.num_params == 12 * 519_168_000
    assert sparse2.moe.layers[:3] == (1, 3, 5)  # (i + 1) % decoder_sparse_step == 0
    assert sparse2.sliding_window is None  # use_sliding_window false: Qwen ignores the window


def test_tp_beyond_kv_heads_replicates_them():
    m = get_model("llama-3-70b")
    # 8 KV heads: TP 4 -> 2 per GPU: 80 x 2 x 2 x 128 x 2 B = 81,920; TP 8 and TP 16 -> 1 per GPU
    # (replicated at 16, as vLLM does): 80 x 2 x 1 x 128 x 2 = 40,960
    assert [m.kv_bytes_per_token(tp) for tp in (4, 8, 16)] == [81_920, 40_960, 40_960]
    with pytest.raises(ConfigError, match="num_attention_heads=64"):
        kv_capacity(m, kv_bytes=GiB, tensor_parallel=3)


def test_quantized_weight_bytes(tmp_path):
    # Llama-3.1-8B layers 6,979,321,856 parameters; embedding + untied head 1,050,673,152 at 2 B
    # = 2,101,346,304 B in every quantized checkpoint
    head = 2 * LLAMA8_EMBED * 2
    fp8 = get_model(write(tmp_path, llama(quantization_config={"quant_method": "fp8",
                                                                "activation_scheme": "dynamic"}), "fp8"))
    assert fp8.weight_bytes == LLAMA8_LAYERS + head == 9_080_668_160  # 1 B per layer weight
    # AWQ 4-bit, group 128, zero point: 4 bits + (16-bit scale + 4-bit zero) / 128 per weight:
    # (27,917,287,424 + 54,525,952 groups x 20) bits / 8 = 3,625,975,808 B
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    assert get_model(write(tmp_path, llama(quantization_config=awq), "awq")).weight_bytes == 3_625_975_808 + head
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
    assert get_model(write(tmp_path, llama(quantization_config=gptq), "gptq")).weight_bytes == 3_625_975_808 + head
    # compressed-tensors W4A16, symmetric: scales only, (27,917,287,424 + 54,525,952 x 16) / 8
    ct = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
          "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                        "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                                    "group_size": 128, "symmetric": True}}}}
    assert get_model(write(tmp_path, llama(quantization_config=ct), "ct")).weight_bytes == 3_598_712_832 + head
    # float32 checkpoints are served in float16 (vLLM's dtype "auto"): 2 B per KV value
    assert get_model(write(tmp_path, llama(torch_dtype="float32"), "f32")).kv_bytes_per_token() == 131_072


@pytest.mark.parametrize("quant, needle", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method' 'bitsandbytes' is not modelled"),
    ({"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["model.layers.0.self_attn.q_proj", "lm_head"]},
     "modules_to_not_convert.*self_attn"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int"}}}}, "input_activations"),
])
def test_unmodelled_quantization_is_refused_naming_the_key(tmp_path, quant, needle):
    with pytest.raises(ConfigError, match=needle):
        get_model(write(tmp_path, llama(quantization_config=quant)))


def test_untied_lm_head_counts_in_memory_not_in_reads(tmp_path):
    tied = get_model(write(tmp_path, llama(tie_word_embeddings=True), "tied"))
    untied = get_model(write(tmp_path, llama(), "untied"))
    # the head is a second 128,256 x 4,096 matrix: 1,050,673,152 B in bf16 (~1 GiB)
    assert untied.weight_bytes - tied.weight_bytes == 1_050_673_152
    assert untied.weight_bytes == (LLAMA8_LAYERS + 2 * LLAMA8_EMBED) * 2
    assert untied.active_weight_bytes == tied.active_weight_bytes == (LLAMA8_LAYERS + LLAMA8_EMBED) * 2
    assert untied.max_seq_len == 131_072  # llama3 RoPE: the length already includes the scaling


def test_max_length_as_vllm_derives_it(tmp_path):
    qwen = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
            "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064, "max_position_embeddings": 32768}
    assert get_model(write(tmp_path, qwen, "plain")).max_seq_len == 32768
    # Qwen2.5's YaRN recipe: original 32,768 x factor 4 = 131,072; linear scaling multiplies the length
    yarn = dict(qwen, rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert get_model(write(tmp_path, yarn, "yarn")).max_seq_len == 131_072
    linear = dict(qwen, max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 2.0})
    assert get_model(write(tmp_path, linear, "linear")).max_seq_len == 8192
    # the smallest length key wins; none at all: 2,048
    assert get_model(write(tmp_path, dict(qwen, seq_length=2000), "two")).max_seq_len == 2000
    gptj = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28, "vocab_size": 50400}
    assert get_model(write(tmp_path, gptj, "gptj")).max_seq_len == 2048


def test_sliding_window_layers_are_recorded(tmp_path):
    gemma2 = {"_name_or_path": "google/gemma-2-27b", "model_type": "gemma2", "hidden_size": 4608,
              "intermediate_size": 36864, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
              "num_hidden_layers": 46, "sliding_window": 4096, "vocab_size": 256000,
              "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
    m = get_model(write(tmp_path, gemma2, "g2"))
    # Hugging Face's rule: layer i is sliding unless (i + 1) % 2 == 0: 0 sliding, 1 full, ...
    assert m.kinds[:3] == ("sliding_attention", "full_attention", "sliding_attention")
    assert m.sliding_window == 4096
    # every layer still counts the whole context (vLLM v0's interleaved rule): 46 x 2 x 16 x 128 x 2 B
    assert m.kv_bytes_per_token() == 376_832
    assert m.tie_word_embeddings  # Gemma's config class ties by default
    assert replace(MODELS["gemma-2-27b"], name=m.name) == m  # the preset is its config
    mistral = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
               "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
               "max_position_embeddings": 32768, "sliding_window": 4096}
    assert set(get_model(write(tmp_path, mistral, "m")).kinds) == {"sliding_attention"}
    qwen = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
            "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
            "max_position_embeddings": 32768, "use_sliding_window": True, "sliding_window": 4096,
            "max_window_layers": 20}
    q = get_model(write(tmp_path, qwen, "q"))
    assert q.kinds.count("full_attention") == 20 and q.kinds[20:] == ("sliding_attention",) * 8
    with pytest.raises(ConfigError, match="sliding_window.*llama"):
        get_model(write(tmp_path, llama(sliding_window=4096), "l"))


def test_multimodal_reads_its_text_config(tmp_path):
    cfg = {"_name_or_path": "llava-hf/llava-1.5-7b-hf", "model_type": "llava",
           "text_config": {"model_type": "llama", "vocab_size": 32064, "max_position_embeddings": 4096,
                           "torch_dtype": "float16"},
           "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
                             "num_hidden_layers": 24, "num_attention_heads": 16}}
    m = get_model(write(tmp_path, cfg))
    # the text config omits the Llama shapes: LlamaConfig's defaults (4096 wide, 32 layers of 32 heads)
    assert m.kv_bytes_per_token() == 32 * 2 * 32 * 128 * 2 == 524_288
    # layers 32 x (4*4096^2 + 3*4096*11008) = 6,476,005,376; embedding + untied head 2*32064*4096
    # = 262,668,288; CLIP ViT-L 24 x (4*1024^2 + 2*1024*4096) = 301,989,888: x 2 B = 14,081,327,104
    assert m.weight_bytes == 14_081_327_104
    assert (m.name, m.max_seq_len, m.vocab_size) == ("llava-hf/llava-1.5-7b-hf", 4096, 32064)
    gemma3 = {"_name_or_path": "google/gemma-3-27b-it", "model_type": "gemma3", "torch_dtype": "bfloat16",
              "text_config": {"model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376,
                              "intermediate_size": 21504, "num_attention_heads": 32, "num_hidden_layers": 62,
                              "num_key_value_heads": 16, "sliding_window": 1024,
                              "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
              "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                                "num_hidden_layers": 27, "num_attention_heads": 16}}
    g3 = get_model(write(tmp_path, gemma3, "g3"))
    # Gemma3TextConfig's defaults: 262,208 tokens, 131,072 positions (already scaled: vLLM skips
    # Gemma-3's RoPE factor), every 6th layer full attention: layers 5, 11, ..., 59
    assert (g3.vocab_size, g3.max_seq_len, g3.kinds.count("full_attention")) == (262_208, 131_072, 10)
    assert g3.kinds[5] == "full_attention" and g3.sliding_window == 1024
    # KV 62 x 2 x 16 x 128 x 2 B = 507,904; weights: layers 62 x (3*5376*4096 + 2*5376*2048
    # + 3*5376*21504) = 25,598,361,600, tied embedding 262,208*5,376 = 1,409,630,208, SigLIP
    # 27 x (4*1152^2 + 2*1152*4304) = 411,070,464: x 2 B = 54,838,124,544
    assert g3.kv_bytes_per_token() == 507_904 and g3.weight_bytes == 54_838_124_544
    with pytest.raises(ConfigError, match="'text_config.hidden_size' missing"):
        del gemma3["text_config"]["hidden_size"]
        get_model(write(tmp_path, gemma3, "g3-bad"))


def test_unreadable_configs_and_checkpoint_folders(tmp_path):
    folder = write(tmp_path, llama(), "Llama-3.1-8B")
    assert get_model(str(tmp_path / "Llama-3.1-8B")).kv_bytes_per_token() == get_model(folder).kv_bytes_per_token()
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="binary.json: not a text file"):
        get_model(str(binary))
    with pytest.raises(ConfigError, match="empty/config.json: model config file not found"):
        (tmp_path / "empty").mkdir()
        get_model(str(tmp_path / "empty"))


@pytest.mark.parametrize("change, needle", [
    ({"num_attention_heads": 0}, "'num_attention_heads' must be >= 1, got 0"),
    ({"num_attention_heads": "32"}, "'num_attention_heads' must be an integer"),
    ({"num_hidden_layers": True}, "'num_hidden_layers' must be an integer"),
    ({"num_key_value_heads": 5}, "not a multiple"),
    ({"model_type": "t5"}, "model_type' 't5' is not modelled"),
    ({"torch_dtype": "int8"}, "torch_dtype' 'int8' is not modelled"),
    ({"layer_types": ["full_attention"] * 31 + ["chunked_attention"]}, "'chunked_attention' is not modelled"),
    ({"model_type": "qwen2", "vocab_size": None}, "'vocab_size' missing"),
])
def test_bad_configs_give_one_line(tmp_path, change, needle):
    with pytest.raises(ConfigError, match=needle):
        get_model(write(tmp_path, llama(**change)))


def test_cli_refuses_in_one_line_and_names_the_run_by_its_config(tmp_path, capsys):
    bad = write(tmp_path, llama(num_attention_heads=0), "bad")
    assert main(["simulate", "--model", bad, "--duration", "5", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim: error:") and "num_attention_heads" in err
    assert "Traceback" not in err and err.count("\n") == 1
    good = write(tmp_path, llama(_name_or_path=None), "my-checkpoint-folder")
    assert main(["simulate", "--model", good, "--gpu", "h100", "--kv-gib", "4", "--max-seq-len", "4096",
                 "--duration", "5", "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "llama"  # model_type, not the folder


# the cost model reads the new spec fields; for the dense 16-bit presets they are the old terms
OLD_PRESETS = ["opt-13b", "opt-66b", "opt-175b", "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b",
               "llama-3-70b", "mistral-7b"]


@pytest.mark.parametrize("name", OLD_PRESETS)
def test_dense_presets_cost_constants_are_the_pre_moe_formula(name):
    m = get_model(name)
    h, q, kv = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    # the roofline before MoE, quantization and latent attention were modelled
    linear = m.num_layers * (h * q + 2 * h * kv + q * h + (3 if m.gated_mlp else 2) * h * m.intermediate_size) \
        + m.vocab_size * h
    for gpu in GPUS.values():
        for tp in (1, 2, 4, 8):
            if m.num_kv_heads % tp or m.num_heads % tp:
                continue
            c = RooflineCostModel(m, gpu, tp).constants()
            assert c[C.LINEAR_FLOPS_PER_TOKEN] == 2.0 * linear / tp
            assert c[C.LINEAR_WEIGHT_TIME_S] == linear * m.dtype_bytes / tp / (gpu.mem_bw * 0.8)
            assert c[C.FLOPS] == gpu.peak_flops * 0.65
            assert c[C.ATTENTION_FLOPS_COEF] == 4.0 * m.num_layers * m.num_heads * m.head_dim / tp
            assert c[C.KV_BYTES_PER_TOKEN] == 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes / tp


def test_opt13b_decode_step_time_is_pinned():
    # OPT-13B on A100-40GB, 8 sequences decoding with 4,000 cached tokens in all:
    # linear params 40 x (4*5120^2 + 2*5120*20480) + 50272*5120 = 12,840,304,640
    # overhead 3 ms + 8 x 20 us; weights read once 2 x 12,840,304,640 B / (1,555 GB/s x 0.8) beat
    # 8 tokens x 2 x 12,840,304,640 FLOPs / (312 TFLOP/s x 0.65); KV 4,000 x 819,200 B / (1,555 GB/s x 0.8)
    p, bw = 12_840_304_640, 1555e9 * 0.8
    expected = 3e-3 + 20e-6 * 8
    expected += max(8 * (2.0 * p) / (312e12 * 0.65), p * 2 / bw)
    expected += 0.0  # no all-reduce at TP 1
    expected += 4000 * 819_200.0 / bw
    cm = RooflineCostModel(get_model("opt-13b"), get_gpu("a100-40gb"))
    assert cm.step_time(StepBatch(decode_seq_ids=np.arange(8), decode_context_sum=4000)) == expected  # bit for bit


def test_cost_model_reads_active_experts_and_fp8_peak(tmp_path):
    mixtral = get_model(write(tmp_path, MIXTRAL))
    h100 = get_gpu("h100-80gb")
    c = RooflineCostModel(mixtral, h100, 2).constants()
    # the dense GEMMs' FLOPs: the 12,748,587,008 active params but the 2 routed experts
    # (2 x 32 x 3 x 4096 x 14336 = 11,274,289,152), over TP 2; a token's row through one expert of
    # every layer, 2 x 32 x 3 x 4096 x 14336 / 2, is the fused-MoE kernel's (sim.core.cost)
    assert c[C.LINEAR_FLOPS_PER_TOKEN] == 2.0 * 1_474_297_856 / 2
    assert c[C.EXPERT_FLOPS_PER_ROW] == 2.0 * 5_637_144_576 / 2
    # weight reads: every step the unrouted weights, (41,943,040 attention + 32,768 router) x 32
    # + head 131,072,000 = 1,474,297,856 params x 2 B; then per distinct expert one expert of
    # each of the 32 layers, 3 x 4096 x 14336 x 32 x 2 B = 11,274,289,152 B; over TP 2
    assert c[C.LINEAR_WEIGHT_TIME_S] == 2_948_595_712 / 2 / (3350e9 * 0.8)
    assert c[C.EXPERT_WEIGHT_TIME_S] == 11_274_289_152 / 2 / (3350e9 * 0.8)
    assert (c[C.ROUTED_EXPERTS], c[C.EXPERTS_PER_TOKEN]) == (8.0, 2.0)
    # one token reads its 2 experts: the active weights, 25,497,174,016 B
    assert RooflineCostModel(mixtral, h100, 2).linear_time(1) == pytest.approx(25_497_174_016 / 2 / (3350e9 * 0.8),
                                                                                rel=1e-12)
    # W8A8 FP8 runs its GEMMs at H100's FP8 peak (1,979 TFLOP/s); A100 has none: 312 TFLOP/s
    fp8 = get_model(write(tmp_path, llama(quantization_config={"quant_method": "fp8"}), "fp8"))
    assert RooflineCostModel(fp8, h100).constants()[C.FLOPS] == 1979e12 * 0.65
    assert RooflineCostModel(fp8, get_gpu("a100-80gb")).constants()[C.FLOPS] == 312e12 * 0.65
    # its weight reads: layers at 1 B (6,979,321,856) + the bf16 LM head 525,336,576 x 2 B
    assert RooflineCostModel(fp8, h100).constants()[C.LINEAR_WEIGHT_TIME_S] == 8_029_995_008 / 1 / (3350e9 * 0.8)
    # prefill attention of latent attention: per (query, key) pair 2 x 128 heads x (192 + 128) x 61 layers
    ds = RooflineCostModel(MODELS["deepseek-v3"], get_gpu("h200"), 8).constants()
    assert ds[C.ATTENTION_FLOPS_COEF] == 61 * 2 * 128 * (192 + 128) / 8
    assert ds[C.KV_BYTES_PER_TOKEN] == 70_272


def test_new_gpu_presets_size_the_pool_from_their_datasheets():
    # Llama-3.1-70B (untied) on one B200: 183,359 MiB x 0.9 = 173,033,672,294.4 B
    # - weights (80 x 855,638,016 + 2 x 1,050,673,152) x 2 B = 141,104,775,168 - 2 GiB activations
    # = 29,787,003,289.6 B; 327,680 B per token -> 90,902 tokens
    b = kv_capacity(get_model("llama-3.1-70b"), get_gpu("b200"))
    assert b.capacity_tokens == 90_902
    assert get_gpu("mi300x").mem_bytes == 205_822_885_888 and get_gpu("h20").mem_bytes == 97_871 * MiB


def test_vattention_page_follows_the_latent_size():
    # one page holds one layer: 64 KiB / (512 + 64) x 2 B = 56 tokens of DeepSeek-V3's latent
    assert vattention_page_tokens(MODELS["deepseek-v3"], 64 * 1024, tensor_parallel=8) == 56


def test_jamba_preset_is_its_config(tmp_path):
    # the preset states AI21-Jamba-1.5-Mini's config.json (Jamba-v0.1's shapes) field by field
    from dataclasses import replace
    read = get_model(write(tmp_path, JAMBA))
    assert replace(read, name="jamba-1.5-mini") == get_model("jamba-1.5-mini")
