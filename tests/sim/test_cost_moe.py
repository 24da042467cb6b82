"""A mixture of experts' weight reads grow with the step's tokens, and its fused-MoE kernel pads each
expert's tokens to whole blocks (``sim.core.cost.routed_expert_seconds``),
worked by hand for a small MoE on an A100-40GB.

The model: 2 layers, hidden 64, 4 heads of 16 (full multi-head attention), vocabulary 100 with a
tied LM head, fp16; both layers MoE with E = 8 routed experts of intermediate 32, k = 2 per
token, no shared expert.

* attention per layer: 4 x 64 x 64 = 16,384 parameters; router 8 x 64 = 512
* one routed expert: 3 x 64 x 32 = 6,144 parameters (gate, up, down)
* unrouted weights: 2 x (16,384 + 512) + LM head 100 x 64 = 40,192 parameters = 80,384 B
* one routed expert in each of the 2 layers: 2 x 6,144 x 2 B = 24,576 B
* memory: 2 x (16,384 + 8 x 6,144 + 512) + embedding 6,400 = 138,496 parameters = 276,992 B

A100-40GB streams at 1555e9 x 0.8 = 1.244e12 B/s. Distinct experts per layer for T tokens,
routing uniform: 8 x (1 - (3/4)^T):

* T = 1:  8 x 1/4 = 2 (a token's k): 80,384 + 2 x 24,576 = 129,536 B (the old lower bound, exact here)
* T = 2:  8 x (1 - 9/16) = 3.5: 80,384 + 3.5 x 24,576 = 166,400 B
* T = 64: (3/4)^64 = 1.0e-8, all 8 within 1e-7: 80,384 + 8 x 24,576 = 276,992 B, every
  weight in memory (the LM head is the tied embedding)
"""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.sim.batch import StepBatch
from pagesim.sim.core.price import cost as C
from pagesim.sim.core.price.cost import roofline_step_time
from pagesim.sim.cost.roofline import RooflineCostModel, all_to_all_constants
from pagesim.sim.specs import get_gpu, kv_capacity
from pagesim.sim.specs.model import MixtureOfExperts, ModelSpec
from tests.sim.helpers import QWEN1_5_MOE

BW = 1555e9 * 0.8
TINY_MOE = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16,
                     intermediate_size=128, vocab_size=100, max_seq_len=4096,
                     moe=MixtureOfExperts(num_experts=8, experts_per_token=2, expert_intermediate_size=32,
                                          layers=(0, 1)))


def test_spec_splits_the_weights_into_unrouted_and_one_expert():
    assert TINY_MOE.unrouted_weight_bytes == 80_384
    assert TINY_MOE.routed_expert_weight_bytes == 24_576
    assert TINY_MOE.active_weight_bytes == 129_536
    assert TINY_MOE.weight_bytes == 276_992


@pytest.mark.parametrize("tokens, read_bytes", [(1, 129_536), (2, 166_400), (64, 276_992)])
def test_weight_reads_grow_with_the_distinct_experts_the_tokens_visit(tokens, read_bytes):
    cm = RooflineCostModel(TINY_MOE, get_gpu("a100-40gb"))
    # memory-bound at every T here: 64 tokens x 129,536 FLOPs at 2.028e14 FLOP/s = 0.04 us
    assert cm.linear_time(tokens) == pytest.approx(read_bytes / BW, rel=1e-7)


def test_tensor_parallel_reads_a_slice_of_every_expert():
    # TP 2: each GPU holds half of every expert (and half of the rest): half of each read above
    one, two = (RooflineCostModel(TINY_MOE, get_gpu("a100-40gb"), tp) for tp in (1, 2))
    for tokens in (1, 2, 64):
        assert two.linear_time(tokens) == pytest.approx(one.linear_time(tokens) / 2, rel=1e-12)
    assert two.linear_time(2) == pytest.approx(166_400 / 2 / BW, rel=1e-7)


def test_decode_step_prices_the_expected_experts():
    # 2 sequences decoding, 100 + 300 tokens of context: 3 ms + 2 x 20 us, the weights of
    # T = 2 (166,400 B), and the KV: 2 layers x 2 x 64 x 2 B = 512 B per token, 400 tokens
    cm = RooflineCostModel(TINY_MOE, get_gpu("a100-40gb"))
    batch = StepBatch(decode_seq_ids=np.arange(2), decode_context=np.array([100, 300]))
    expected = 3e-3 + 2 * 20e-6 + 166_400 / BW + 400 * 512 / BW
    assert cm.step_time(batch) == pytest.approx(expected, rel=1e-9)
    # the compiled step function (the core's loop) gives the same float as the engine's
    c = np.array(cm.constants(), dtype=np.float64)
    for tokens in (1, 2, 3, 17, 64, 1000):
        assert roofline_step_time(c, tokens, tokens, 0, 0, 0.0, 0, 0, 0) == \
            cm.step_time(StepBatch(decode_seq_ids=np.arange(tokens), decode_context=np.zeros(tokens, np.int64)))


def test_dense_model_reads_every_weight_whatever_the_batch():
    # a dense model has no routed expert: the constants say so and the weight read is one
    # constant at any T (the pre-MoE term, bit for bit)
    from pagesim.sim.specs import get_model

    cm = RooflineCostModel(get_model("opt-13b"), get_gpu("a100-40gb"))
    c = cm.constants()
    assert (c[C.ROUTED_EXPERTS], c[C.EXPERTS_PER_TOKEN], c[C.EXPERT_WEIGHT_TIME_S]) == (0.0, 0.0, 0.0)
    for tokens in (1, 8, 100):
        assert cm.linear_time(tokens) == c[C.LINEAR_WEIGHT_TIME_S] == 2 * 12_840_304_640 / (1555e9 * 0.8)


def test_memory_holds_every_expert():
    # the KV pool is what is left after all 8 experts' weights (276,992 B), not a token's 2
    gpu = get_gpu("a100-40gb")
    budget = kv_capacity(TINY_MOE, gpu, activation_reserve_bytes=0)
    assert budget.kv_bytes == int(gpu.mem_bytes * 0.9 - 276_992)


# The fused-MoE kernel's FLOPs (sim.core.cost.routed_expert_seconds): one row of a token through
# one routed expert of both layers is 2 x 2 x 6,144 = 24,576 FLOPs. At eff_moe 1e-6 the kernel
# runs at 312e12 x 0.65 x 1e-6 = 2.028e8 FLOP/s, so its FLOPs, not its reads, bound it; the dense
# GEMMs (40,192 parameters a token) stay read-bound: 80,384 B.
EXPERT_ROW_FLOPS = 24_576
SLOW_MOE = 312e12 * 0.65 * 1e-6


def test_expert_flops_per_row_and_the_dense_gemms_without_the_routed_experts():
    c = RooflineCostModel(TINY_MOE, get_gpu("a100-40gb"), eff_moe=0.5).constants()
    assert c[C.EXPERT_FLOPS_PER_ROW] == EXPERT_ROW_FLOPS
    assert c[C.LINEAR_FLOPS_PER_TOKEN] == 2 * 40_192  # the unrouted parameters alone
    assert c[C.EXPERT_FLOPS] == 312e12 * 0.65 * 0.5


@pytest.mark.parametrize("tokens, rows", [
    (1, 2 * 16),  # 2 experts of 1 token each, each a block of BLOCK_SIZE_M = 16 rows
    # 33 tokens: 8 x (1 - 0.75^33) = 7.99940 experts of 66 / 7.99940 = 8.25 tokens, BLOCK_SIZE_M
    # 32 (M > 32): one block each
    (33, 8 * (1 - 0.75 ** 33) * 32),
    # 600 tokens: all 8 experts (0.75^600 underflows), 150 tokens each, BLOCK_SIZE_M 128 (M > 512):
    # two blocks, 256 rows, where 150 are tokens
    (600, 8 * 256),
])
def test_fused_moe_pads_each_experts_tokens_to_whole_blocks(tokens, rows):
    cm = RooflineCostModel(TINY_MOE, get_gpu("a100-40gb"), eff_moe=1e-6)
    dense = max(tokens * 80_384 / (312e12 * 0.65), 80_384 / BW)  # 600 tokens: their FLOPs, 0.24 us
    assert cm.linear_time(tokens) == pytest.approx(dense + rows * EXPERT_ROW_FLOPS / SLOW_MOE, rel=1e-9)


def test_the_block_size_follows_vllms_default_config():
    # get_default_config (fused_moe.py of vLLM 0.33.0, lines 1376-1383): M <= 32: 16, <= 96: 32,
    # <= 512: 64, above: 128
    assert [C.fused_moe_block_m(m) for m in (1, 32, 33, 96, 97, 512, 513, 8192)] == [16, 16, 32, 32, 64, 64, 128, 128]


def test_experts_and_dense_gemms_are_kernels_of_their_own():
    # 200 tokens at eff_moe 1: the dense GEMMs are bound by their FLOPs, 200 x 80,384 / 2.028e14
    # = 79.3 ns over their 64.6 ns of reads; the experts by their reads, all 8 (1 - 0.75^200 =
    # 1 - 1e-25): 8 x 24,576 B / 1.244e12 = 158.0 ns over their FLOPs (25 tokens each, one block
    # of 64 rows: 512 x 24,576 / 2.028e14 = 62.0 ns). The step pays each bound: 237.3 ns
    cm = RooflineCostModel(TINY_MOE, get_gpu("a100-40gb"))
    flops = 312e12 * 0.65
    assert cm.linear_time(200) == pytest.approx(200 * 80_384 / flops + 8 * 24_576 / BW, rel=1e-12)


def test_router_and_shared_expert_are_dense_gemms_read_from_the_hf_config(tmp_path):
    # Qwen1.5-MoE-A2.7B's config.json: the router (num_experts x hidden = 60 x 2048 = 122,880) and
    # the shared expert (shared_expert_intermediate_size: 3 x 2048 x 5632 = 34,603,008) are in
    # every token's dense GEMMs and every step's reads, beside attention (4 x 2048^2 = 16,777,216):
    # 51,503,104 x 24 layers + LM head 151,936 x 2048 = 311,164,928 -> 1,547,239,424 parameters.
    # A row through one routed expert (moe_intermediate_size 1408) of the 24 layers:
    # 2 x 24 x 3 x 2048 x 1408 = 415,236,096 FLOPs. (Hugging Face's shared_expert_gate, 2,048 a
    # layer, is not counted: 0.003 %.)
    import json

    from pagesim.sim.specs import get_model

    cfg = dict(QWEN1_5_MOE)
    path = tmp_path / "qwen-moe" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    m = get_model(str(path))
    c = RooflineCostModel(m, get_gpu("h100-80gb")).constants()
    assert c[C.LINEAR_FLOPS_PER_TOKEN] == 2 * 1_547_239_424
    assert c[C.LINEAR_WEIGHT_TIME_S] == 2 * 1_547_239_424 / (3350e9 * 0.8)
    assert c[C.EXPERT_FLOPS_PER_ROW] == 415_236_096


# Expert parallel (vLLM's --enable-expert-parallel): the routed experts split whole over the GPUs,
# and with data-parallel ranks each rank's tokens meet the others' at every MoE layer
# (sim.core.cost.routed_expert_seconds, busiest_group_experts; sim.cost.roofline.all_to_all_constants).
# One token visits an expert with probability p = 1 - (3/4)^T here. Over 2 GPUs each holds 4 of the
# 8 experts; the step waits for the busier: E[max of 2 draws of Binomial(4, p)] = sum over x < 4 of
# 1 - F(x)^2. At T = 1 (p = 1/4): F = 0.31640625, 0.73828125, 0.94921875, 0.99609375, so
# 0.8998871 + 0.4549408 + 0.0989838 + 0.0077972 = 1.4616089 experts, against the 2 x 1/2 = 1
# expert's bytes a TP-sharded GPU reads.
BUSIEST_AT_ONE_TOKEN = 1.4616089


def test_busiest_gpu_of_an_expert_parallel_group_by_hand():
    assert C.busiest_group_experts(8.0, 2.0, 0.25) == pytest.approx(BUSIEST_AT_ONE_TOKEN, abs=1e-7)
    # 512 experts over 2 GPUs, each visited with p = 0.95: 245.158, as scipy.stats.binom's cdf
    # gives it (a product of the binomial's terms underflows to 0 and gives all 256); the mean of
    # Binomial(256, 0.95) is 243.2
    assert C.busiest_group_experts(512.0, 2.0, 0.95) == pytest.approx(245.15818, abs=1e-5)
    # one group: the mean, E x p (every expert on the one GPU)
    assert C.busiest_group_experts(8.0, 1.0, 0.25) == pytest.approx(2.0, rel=1e-12)
    # every expert visited: the busiest holds ceil(E / G); none visited: none
    assert C.busiest_group_experts(8.0, 2.0, 1.0) == 4.0 and C.busiest_group_experts(7.0, 2.0, 1.0) == 4.0
    assert C.busiest_group_experts(8.0, 2.0, 0.0) == 0.0


def test_expert_parallel_waits_for_its_busiest_gpu():
    """TP 2 with the experts split whole over the 2 GPUs: a GPU reads whole experts; at one token
    the busier GPU reads 1.4616 of them (above) where a TP-sharded GPU reads half of each of the
    token's 2; once every expert is visited (T = 64) both read 4 experts' worth."""
    gpu = get_gpu("a100-40gb")
    sharded, split = (RooflineCostModel(TINY_MOE, gpu, 2, expert_group=ep) for ep in (1, 2))
    unrouted = 80_384 / 2
    assert sharded.linear_time(1) == pytest.approx((unrouted + 2 * 24_576 / 2) / BW, rel=1e-7)
    assert split.linear_time(1) == pytest.approx((unrouted + BUSIEST_AT_ONE_TOKEN * 24_576) / BW, rel=1e-7)
    assert split.linear_time(64) == pytest.approx(sharded.linear_time(64), rel=1e-6)


def test_data_parallel_ranks_meet_at_every_moe_layer():
    """Two ranks at TP 1, the experts split over their 2 GPUs: each rank's experts run over both
    ranks' tokens (as many as its own: 2 at one token each, p = 1 - (3/4)^2 = 7/16), and each MoE
    layer dispatches and combines: per token of this rank, 2 layers x 1 other rank x (hidden 64 x
    2 B + top-2 weights and ids 2 x 8 B, then 64 x 2 B back) = 544 B over the link, and 2
    collectives x 2 layers of latency. The busier GPU's experts at p = 7/16: Binomial(4, 7/16)
    has F = 0.1001129, 0.4115753, 0.7749481, 0.9633331, so 0.9899774 + 0.8306058 + 0.3994554 +
    0.0719930 = 2.2919691 (2.2919690562 in fractions)."""
    gpu = get_gpu("a100-40gb")
    cm = RooflineCostModel(TINY_MOE, gpu, 1, expert_group=2, data_parallel=2, allreduce_latency_s=10e-6)
    assert C.busiest_group_experts(8.0, 2.0, 7 / 16) == pytest.approx(2.2919690562, abs=1e-10)
    assert cm.linear_time(1) == pytest.approx((80_384 + 2.2919690562 * 24_576) / BW, rel=1e-9)
    fixed, per_token = all_to_all_constants(TINY_MOE, 2, gpu.interconnect_bw, 10e-6)
    assert (fixed, per_token) == (pytest.approx(4 * 10e-6), pytest.approx(544 / gpu.interconnect_bw))
    c = np.asarray(cm.constants())
    step = roofline_step_time(c, 1, 1, 0, 0, 0.0, 0, 0, 0)
    assert step == pytest.approx(cm.overhead_s + cm.per_seq_overhead_s + cm.linear_time(1) + fixed + per_token,
                                 rel=1e-9)
    assert all_to_all_constants(TINY_MOE, 1, gpu.interconnect_bw, 10e-6) == (0.0, 0.0)
    # a link without latency still carries the bytes
    free = RooflineCostModel(TINY_MOE, gpu, 1, expert_group=2, data_parallel=2, allreduce_latency_s=0.0)
    assert roofline_step_time(np.asarray(free.constants()), 1, 1, 0, 0, 0.0, 0, 0, 0) == pytest.approx(
        free.overhead_s + free.per_seq_overhead_s + free.linear_time(1) + per_token, rel=1e-9)


def test_expert_parallel_memory_holds_a_share_of_the_experts():
    """Each of 2 GPUs holds the 80,384 B of unrouted weights and embedding (TP 1) and 4 of the 8
    experts whole (4 x 24,576 = 98,304 B); over 3 GPUs the fullest holds 3 (8 = 3 + 3 + 2)."""
    assert TINY_MOE.weight_bytes_per_gpu(1, 2) == 80_384 + 98_304
    assert TINY_MOE.weight_bytes_per_gpu(1, 3) == 80_384 + 3 * 24_576
    assert TINY_MOE.weight_bytes_per_gpu(2, 1) == 276_992 / 2
    assert TINY_MOE.weight_bytes_per_gpu(2, 4) == 80_384 / 2 + 196_608 / 4


def test_the_compiled_price_of_an_expert_parallel_group_is_the_interpreted_one():
    """The core's loop (compiled) and the engine's cost model (interpreted) give the same float for
    a group's step, as for every other: Qwen3-30B-A3B's 128 experts over 2 ranks of 1 GPU, and
    512 experts over 8 (the busiest GPU's sum in logarithms and float powers in both)."""
    from pagesim.sim.specs import get_model

    for model, ranks in (("Qwen/Qwen3-30B-A3B", 2), ("qwen3-next-80b-a3b", 8)):
        cm = RooflineCostModel(get_model(model), get_gpu("h100-80gb"), 1, expert_group=ranks, data_parallel=ranks)
        c = np.array(cm.constants(), dtype=np.float64)
        for tokens in (1, 2, 3, 17, 64, 150, 1000, 8192):
            assert roofline_step_time(c, tokens, tokens, 0, 0, 0.0, 0, 0, 0) == \
                cm.step_time(StepBatch(decode_seq_ids=np.arange(tokens), decode_context=np.zeros(tokens, np.int64)))
