"""pagesim's recurrent state per layer against vLLM 0.33.0's own model classes (tests/peers/README.md).

Skipped unless ``python -m tests.peers.fetch`` has put vLLM 0.33.0 in the cache folder and its
model modules import here (``vllm_state_shapes.py``; torch is needed). For each hybrid of
``tests/sim/hybrid_configs.py`` and each tensor-parallel size that divides its attention heads
(vLLM refuses the others, config/model.py:1557-1564): vLLM's state shapes and dtypes of one
layer, from the model class's ``get_mamba_state_shape_from_config`` /
``get_mamba_state_dtype_from_config``, summed into bytes, must be pagesim's
``state_bytes_per_layer`` of the model's recurrent kind; and the layers vLLM's model builds as
attention, as recurrent and as an MLP alone must be pagesim's count of each.
"""

from __future__ import annotations

import pytest

from tests.peers.importing import driver_or_skip

pytestmark = pytest.mark.peers
vllm_shapes = driver_or_skip("0.33.0", "tests.peers.vllm_state_shapes")
vllm_v1 = driver_or_skip("0.33.0", "tests.peers.vllm_v1")  # its MambaSpec (v1/kv_cache_interface.py)

from pagesim.sim.specs import get_model  # noqa: E402

from tests.sim.hybrid_configs import HYBRID_CONFIGS, write  # noqa: E402

VLLM = vllm_shapes.load()
MAMBA_SPEC = vllm_v1.load().MambaSpec

# pagesim's kind for each architecture's recurrent layers (sim/specs/model.py)
RECURRENT_KIND = {"NemotronHForCausalLM": "mamba2", "GraniteMoeHybridForCausalLM": "mamba2",
                  "Qwen3NextForCausalLM": "gated_delta_net"}
CASES = [(name, tp) for name, config in HYBRID_CONFIGS.items() for tp in (1, 2, 4, 8)
         if config["num_attention_heads"] % tp == 0]

# vLLM's bytes of one layer's state, worked out by hand from the configs (bf16: 2 B, fp32: 4 B).
# Mamba-2 (mamba_utils.py:186-211): conv (kernel - 1) x (width + 2 * groups * state) / tp, where
# groups that tp does not divide are replicated up to tp (:261-269); SSM heads / tp x head_dim x
# state. Nemotron-H keeps the SSM state in float32 (models/config.py:812-832), Granite in the
# model dtype (mamba_ssm_cache_dtype "auto", mamba_utils.py:105-106). Gated delta net (:272-293):
# conv 3 x (2 * key_heads * key_dim + value_heads * value_dim) / tp; value_heads / tp x
# value_dim x key_dim, both in the model dtype.
BY_HAND = {
    # width 128 * 80 = 10240 (heads x head_dim, not 2 x 4480); 3 * (10240 + 2*8*128) * 2 = 73,728
    # + 128 * 80 * 128 * 4 = 5,242,880
    ("nemotron-h", 1): 3 * (10240 + 2 * 8 * 128) * 2 + 128 * 80 * 128 * 4,  # 5,316,608
    ("nemotron-h", 2): 3 * (10240 + 2 * 8 * 128) // 2 * 2 + 64 * 80 * 128 * 4,  # 36,864 + 2,621,440
    # width 128 * 64 = 8192: 3 * (8192 + 2048) * 2 = 61,440 + 128 * 64 * 128 * 4 = 4,194,304
    ("nemotron-h-8b", 1): 3 * (8192 + 2 * 8 * 128) * 2 + 128 * 64 * 128 * 4,  # 4,255,744
    ("nemotron-h-8b", 2): 3 * (8192 + 2 * 8 * 128) // 2 * 2 + 64 * 64 * 128 * 4,  # 2,127,872
    # width 2 * 1536 = 3072 (mamba_expand x hidden, granitemoehybrid.py:634), one group
    ("granite-4-h", 1): 3 * (3072 + 2 * 1 * 128) * 2 + 48 * 64 * 128 * 2,  # 19,968 + 786,432
    # the one group replicated to 2: 3 * (3072 + 2*2*128) / 2 * 2 = 10,752, + 24 * 64 * 128 * 2
    ("granite-4-h", 2): 3 * (3072 + 2 * 2 * 128) // 2 * 2 + 24 * 64 * 128 * 2,  # 403,968
    ("granite-4-h", 4): 3 * (3072 + 2 * 4 * 128) // 4 * 2 + 12 * 64 * 128 * 2,  # 6,144 + 196,608
    # conv 3 * (2*16*128 + 32*128) * 2 = 49,152; 32 * 128 * 128 * 2 = 1,048,576
    ("qwen3-next", 1): 3 * (2 * 16 * 128 + 32 * 128) * 2 + 32 * 128 * 128 * 2,  # 1,097,728
    ("qwen3-next", 2): 3 * (2 * 16 * 128 + 32 * 128) // 2 * 2 + 16 * 128 * 128 * 2,  # 548,864
}

# transformers 5 (vLLM 0.33.0 requires transformers>=5.16.1) renames the layer types of older
# config.json files before vLLM reads them (_LEGACY_LAYER_TYPE_REMAP); Qwen3-Next's file has
# none, and transformers' Qwen3NextConfig makes every full_attention_interval-th layer full
# attention (configuration_qwen3_next.py, Qwen3NextConfig.__init__)
LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}


def vllm_bytes(name: str, tp: int) -> int:
    shapes, dtypes = vllm_shapes.state(VLLM, HYBRID_CONFIGS[name], tp)
    return vllm_shapes.state_bytes(shapes, dtypes)


def vllm_layers(config: dict) -> tuple[int, int, int]:
    """The layers vLLM's model builds as attention, as recurrent (Mamba or gated delta net) and
    with no token mixer (an MLP alone), by the model's own choice of a layer's class."""
    arch = config["architectures"][0]
    module = VLLM.modules[arch]
    if arch == "NemotronHForCausalLM":  # a class per pattern character (nemotron_h.py:597-602)
        built = [module.ALL_DECODER_LAYER_TYPES[c] for c in config["hybrid_override_pattern"]]
        return (built.count(module.NemotronHAttentionDecoderLayer), built.count(module.NemotronHMambaDecoderLayer),
                built.count(module.NemotronHMLPDecoderLayer))
    if arch == "GraniteMoeHybridForCausalLM":  # a class per layer type (granitemoehybrid.py:321-324, :350)
        built = [module.ALL_DECODER_LAYER_TYPES[LEGACY_LAYER_TYPES[t]] for t in config["layer_types"]]
        return (built.count(module.GraniteMoeHybridAttentionDecoderLayer),
                built.count(module.GraniteMoeHybridMambaDecoderLayer), 0)
    # Qwen3-Next: attention for "full_attention", a gated delta net for "linear_attention"
    # (qwen3_next.py:500-515)
    interval = config["full_attention_interval"]
    types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(config["num_hidden_layers"])]
    return types.count("full_attention"), types.count("linear_attention"), 0


@pytest.mark.parametrize("name, tp", list(BY_HAND))
def test_vllm_state_bytes_are_the_hand_worked_ones(name, tp):
    shapes, dtypes = vllm_shapes.state(VLLM, HYBRID_CONFIGS[name], tp)
    spec = MAMBA_SPEC(shapes=shapes, dtypes=dtypes, block_size=1, mamba_cache_mode="none")
    assert vllm_shapes.state_bytes(shapes, dtypes) == spec.page_size_bytes == BY_HAND[name, tp], \
        f"{name} at TP {tp}: vLLM {shapes} {dtypes}, page {spec.page_size_bytes} B, by hand {BY_HAND[name, tp]} B"


@pytest.mark.parametrize("name", list(HYBRID_CONFIGS))
def test_vllm_builds_the_configs_layers(name):
    config = HYBRID_CONFIGS[name]
    # by hand: Nemotron-Nano-9B-v2's pattern has 4 '*', 27 'M' and 25 '-' (an MLP alone);
    # the 8B's 4, 24 and 24; granite-4.0-h-tiny 4 attention of 40; Qwen3-Next 48 / 4 = 12
    assert vllm_layers(config) == {"nemotron-h": (4, 27, 25), "nemotron-h-8b": (4, 24, 24), "granite-4-h": (4, 36, 0),
                                   "qwen3-next": (12, 36, 0)}[name]


@pytest.mark.parametrize("name, tp", CASES)
def test_pagesim_state_bytes_are_vllms(tmp_path, name, tp):
    config = HYBRID_CONFIGS[name]
    kind = RECURRENT_KIND[config["architectures"][0]]
    ours = get_model(str(write(tmp_path, config))).state_bytes_per_layer(kind, tp)
    theirs = vllm_bytes(name, tp)
    assert ours == theirs, f"{name} at TP {tp}, one {kind} layer: pagesim {ours:,} B, vLLM 0.33.0 {theirs:,} B"


@pytest.mark.parametrize("name", list(HYBRID_CONFIGS))
def test_pagesim_layer_counts_are_vllms(tmp_path, name):
    config = HYBRID_CONFIGS[name]
    kind = RECURRENT_KIND[config["architectures"][0]]
    model = get_model(str(write(tmp_path, config)))
    ours = (model.num_attention_layers, model.kinds.count(kind), model.kinds.count("mlp"))
    theirs = vllm_layers(config)
    assert ours == theirs, f"{name}: (attention, {kind}, mlp) layers: pagesim {ours}, vLLM 0.33.0 {theirs}"
