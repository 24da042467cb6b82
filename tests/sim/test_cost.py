"""The roofline cost model's price of one iteration (``step_time(StepBatch)``), worked out by
hand for OPT-13B on an A100-40GB: the constants are derived in ``conftest.py``
(:class:`HandRoofline`), and each case below sums the terms in milliseconds."""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.sim.batch import StepBatch
from pagesim.sim.cost.models import make_cost_model
from pagesim.sim.specs import get_gpu, get_model


def ids(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


@pytest.fixture
def step_time():
    return make_cost_model(get_model("opt-13b"), get_gpu("a100-40gb")).step_time


def test_pure_decode_batch(step_time, opt13b_a100):
    # 8 sequences with 1024 tokens of context each (this step's token included):
    #   fixed            3 ms + 8 x 0.02 ms                       =  3.16 ms
    #   linear           8 tokens, weight-bound                     = 20.643577 ms
    #   decode attention 8192 tokens x 0.658521 us                  =  5.394603 ms
    #                                                               = 29.198180 ms
    batch = StepBatch(decode_seq_ids=ids(8), decode_context=np.full(8, 1024, np.int64))
    assert step_time(batch) == pytest.approx(29.198180e-3, rel=1e-7)
    assert step_time(batch) == pytest.approx(opt13b_a100.step(decode_contexts=[1024] * 8), rel=1e-12)


def test_prefill_batch(step_time, opt13b_a100):
    # two prompts, 512 and 256 tokens, nothing cached:
    #   fixed             3 ms + 2 x 0.02 ms                                  =  3.04 ms
    #   linear            768 tokens x 0.126630 ms (compute-bound: > 163)      = 97.252011 ms
    #   prefill attention (512 x 256 + 256 x 128) = 163,840 pairs x 819,200 FLOPs
    #                     = 1.342177e11 FLOPs at 1.56e14 FLOP/s                =  0.860370 ms
    #                                                                          = 101.152382 ms
    batch = StepBatch(prefill_seq_ids=ids(2), prefill_tokens=np.array([512, 256]),
                      prefill_context=np.array([512, 256]))
    assert step_time(batch) == pytest.approx(101.152382e-3, rel=1e-7)
    assert step_time(batch) == pytest.approx(opt13b_a100.step(prefills=[(512, 0), (256, 0)]), rel=1e-12)


def test_prefill_chunk_after_a_cached_prefix(step_time, opt13b_a100):
    # 128 new tokens after 512 computed ones (chunked prefill, or a prefix-cache hit):
    #   fixed             3 ms + 0.02 ms                                       =  3.02 ms
    #   linear            128 tokens, weight-bound                              = 20.643577 ms
    #   prefill attention 128 x (512 + 64) = 73,728 pairs x 819,200 FLOPs
    #                     at 1.56e14 FLOP/s                                     =  0.387166 ms
    #   cached prefix     512 tokens x 0.658521 us                              =  0.337163 ms
    #                                                                           = 24.387906 ms
    batch = StepBatch(prefill_seq_ids=ids(1), prefill_tokens=np.array([128]), prefill_context=np.array([640]))
    assert step_time(batch) == pytest.approx(24.387906e-3, rel=1e-7)
    assert step_time(batch) == pytest.approx(opt13b_a100.step(prefills=[(128, 512)]), rel=1e-12)


def test_swapped_tokens_cross_pcie(step_time, opt13b_a100):
    # one decode of context 100 plus 32 tokens swapped in and 16 out: the decode's price
    #   3.02 + 20.643577 + 100 x 0.658521 us = 23.729429 ms, plus 48 x 32.768 us = 1.572864 ms
    batch = StepBatch(decode_seq_ids=ids(1), decode_context=np.array([100]), swap_in_tokens=32,
                      swap_out_tokens=16)
    assert step_time(batch) == pytest.approx(25.302293e-3, rel=1e-7)
    assert step_time(batch) == pytest.approx(opt13b_a100.step(decode_contexts=[100], swapped_tokens=48),
                                             rel=1e-12)


@pytest.mark.parametrize("cost_model", ["roofline", "calibrated"])
def test_swap_pays_one_copy_latency_per_block_layer_and_k_or_v(cost_model):
    # OPT-13B has 40 layers: a block of B tokens moves in 2 x 40 = 80 cudaMemcpyAsync calls of
    # 5 us each (sim.core.cost.PCIE_COPY_LATENCY_S), 400 us per block whatever its size.
    # 64 tokens swapped: block size 1 -> 64 blocks = 25.6 ms; 16 -> 4 blocks = 1.6 ms;
    # 64 -> one block = 0.4 ms; no block size (a contiguous extent) -> nothing beyond the bytes
    model, gpu = get_model("opt-13b"), get_gpu("a100-80gb")  # the calibrated model ships for the 80 GB
    batch = StepBatch(decode_seq_ids=ids(1), decode_context=np.array([100]), swap_in_tokens=48,
                      swap_out_tokens=16)

    def price(block_tokens):
        return make_cost_model(model, gpu, cost_model=cost_model, swap_block_tokens=block_tokens).step_time(batch)

    bytes_only = price(0)
    for block_tokens, ms in [(1, 25.6), (16, 1.6), (64, 0.4)]:
        assert price(block_tokens) - bytes_only == pytest.approx(ms * 1e-3, rel=1e-9)
    no_swap = StepBatch(decode_seq_ids=ids(1), decode_context=np.array([100]))
    assert (make_cost_model(model, gpu, cost_model=cost_model, swap_block_tokens=1).step_time(no_swap)
            == make_cost_model(model, gpu, cost_model=cost_model).step_time(no_swap))


def test_tensor_parallel_decode_batch():
    # the decode batch of test_pure_decode_batch on each GPU of a TP=2 group:
    #   fixed            3 ms + 8 x 0.02 ms                                      =  3.16 ms
    #   linear           half the weights: 20.643577 / 2                         = 10.321788 ms
    #   all-reduce       2 per layer x 40 layers x (2 x 1/2 x 8 tokens x 5120 x 2 B
    #                    at 300e9 B/s = 0.273067 us, plus 10 us latency)          =  0.821845 ms
    #   decode attention half the heads: 8192 tokens x 409,600 B at 1.244e12 B/s =  2.697302 ms
    #                                                                            = 17.000934 ms
    cost_model = make_cost_model(get_model("opt-13b"), get_gpu("a100-40gb"), tensor_parallel=2)
    batch = StepBatch(decode_seq_ids=ids(8), decode_context=np.full(8, 1024, np.int64))
    assert cost_model.step_time(batch) == pytest.approx(17.000934e-3, rel=1e-7)


def test_paged_kernel_reads_whole_blocks_and_works_per_block():
    # vLLM v0's PagedAttention kernel (sim.core.cost) at block size 16, two decoding sequences
    # of 17 and 40 tokens: it reads 2 + 3 = 5 whole blocks, 80 tokens (not 57), and works per
    # block as much again as reading 0.23 x 16 = 3.68 tokens (Fig. 18a's overhead at block 16):
    #   fixed            3 ms + 2 x 0.02 ms                         =  3.04 ms
    #   linear           2 tokens, weight-bound                     = 20.643577 ms
    #   decode attention 80 tokens x 0.658521 us                    =  0.052682 ms
    #   per block        5 blocks x 3.68 tokens x 0.658521 us       =  0.012117 ms
    #                                                               = 23.748376 ms
    # at block size 1 it reads the 57 tokens, each a block: 57 x 4.68 x 0.658521 us = 0.175668 ms
    # (23.859245 ms); a kernel that is not paged (0) reads the 57: 0.037536 ms (23.721113 ms)
    model, gpu = get_model("opt-13b"), get_gpu("a100-40gb")
    batch = StepBatch(decode_seq_ids=ids(2), decode_context=np.array([17, 40]))

    def price(kernel_block):
        return make_cost_model(model, gpu, kernel_block_tokens=kernel_block).step_time(batch)

    assert price(16) == pytest.approx(23.748376e-3, rel=1e-7)
    assert price(1) == pytest.approx(23.859245e-3, rel=1e-7)
    assert price(0) == pytest.approx(23.721113e-3, rel=1e-7)


@pytest.mark.parametrize("block", [16, 1, 12])
def test_a_paged_kernel_reads_a_context_in_whole_blocks(block):
    # sim.core.cost.kernel_read_tokens: the context rounded up to whole blocks; a power of two
    # (16, 1) by its mask, another (12) by a division: 17 tokens read 32 of 16-token blocks, 17
    # of 1-token ones, 24 of 12-token ones; a whole block's context reads itself, none reads 0
    from pagesim.sim.core.compile.jit import interpreted
    from pagesim.sim.core.price.cost import kernel_read_tokens

    read = interpreted(kernel_read_tokens)
    context = np.array([0, 1, block, block + 1, 17, 2 * block])
    want = {16: [0, 16, 16, 32, 32, 32], 1: [0, 1, 1, 2, 17, 2], 12: [0, 12, 12, 24, 24, 24]}[block]
    assert read(context, block).tolist() == want
    assert [read(int(n), block) for n in context] == want


def test_the_paged_kernel_is_vllm_v0s_on_a_paged_cache():
    # whole-block reads and per-block work are vLLM v0's kernel's; FasterTransformer's (Orca's
    # contiguous cache) and today's FlashAttention / FlashInfer (vllm-v1, SGLang) read per token
    from pagesim.sim.config import SimConfig

    assert SimConfig.for_system("vllm", block_size=32).kernel_block_tokens == 32
    assert SimConfig.for_system("token").kernel_block_tokens == 1
    for system in ("orca-max", "orca-oracle", "static", "vllm-v1", "sglang", "vattention"):
        assert SimConfig.for_system(system).kernel_block_tokens == 0, system


def test_a_vllm_run_prices_its_decode_steps_with_the_paged_kernel():
    # one request on a block-4 cache, prompt 5, 3 tokens out: the decode steps hold 6 and 7
    # tokens, 2 blocks = 8 token slots read each, and 2 blocks' work at 3.68 / 4 of a read:
    #   3.02 ms + 20.643577 ms + 8 x 0.658521 us x (1 + 0.92) = 23.673692 ms per decode step
    # (a kernel reading the 6 or 7 tokens alone: 23.667528 / 23.668188 ms)
    from pagesim.sim.run import run_simulation
    from tests.sim.helpers import small_cfg, trace

    res = run_simulation(small_cfg("vllm", record_steps=True, gpu="a100-40gb"), trace([(0.0, 5, 3)]))
    decode = res.steps[res.steps["num_decode_tokens"] == 1]
    assert len(decode) == 2
    assert decode["dt_s"].to_numpy() == pytest.approx([23.673692e-3] * 2, rel=1e-7)


@pytest.mark.parametrize("cost_model", ["calibrated", "serving"])
def test_every_fitted_model_prices_the_paged_kernel_alike(cost_model):
    # the batch above under the calibrated and serving models: their decode attention is linear
    # in the tokens read at a fixed batch (slope s per token), so vLLM v0's kernel at block 16
    # costs s x (80 x 1.23 - 57) more than a kernel reading the 57 tokens once
    model, gpu = get_model("llama-2-7b"), get_gpu("a100-80gb")
    batch = StepBatch(decode_seq_ids=ids(2), decode_context=np.array([17, 40]))

    def price(kernel_block, b=batch):
        return make_cost_model(model, gpu, cost_model=cost_model, kernel_block_tokens=kernel_block).step_time(b)

    one_more = StepBatch(decode_seq_ids=ids(2), decode_context=np.array([17, 41]))
    slope = price(0, one_more) - price(0)
    assert slope > 0
    assert price(16) - price(0) == pytest.approx(slope * (80 * 1.23 - 57), rel=1e-6)


def test_a_hybrids_recurrent_states_are_read_and_written_once_a_step():
    # Jamba-1.5-Mini at TP 2 on an H100: each sequence keeps 28 Mamba layers x 155,648 B = 4,358,144 B
    # of state per GPU (tests/sim/test_model_configs.py). 4 decoding sequences read and write theirs:
    # 4 x 2 x 4,358,144 B at 3,350e9 x 0.8 B/s = 13.0094 us on top of the transformer's terms
    model = get_model("jamba-1.5-mini")
    cost_model = make_cost_model(model, get_gpu("h100-80gb"), tensor_parallel=2, cost_model="roofline")
    batch = StepBatch(decode_seq_ids=ids(4), decode_context=np.full(4, 512, np.int64))
    stateless = make_cost_model(model, get_gpu("h100-80gb"), tensor_parallel=2, cost_model="roofline")
    stateless._state_bytes_per_seq = 0.0  # the same step without the states' traffic
    assert cost_model.step_time(batch) - stateless.step_time(batch) == pytest.approx(13.00939e-6, rel=1e-5)
    # a prefill chunk's sequence reads its initial state and writes its final one: the same bytes
    prefill = StepBatch(prefill_seq_ids=ids(1), prefill_tokens=np.array([256]), prefill_context=np.array([256]))
    assert cost_model.step_time(prefill) - stateless.step_time(prefill) == pytest.approx(13.00939e-6 / 4, rel=1e-5)
