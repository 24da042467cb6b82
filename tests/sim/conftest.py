"""Shared by the simulator's behaviour tests: a run on the core, tiny traces and configurations
written by hand, and the roofline step price of OPT-13B on an A100-40GB worked out by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from pagesim.sim.config import SimConfig
from pagesim.sim.run import run_simulation
from pagesim.traces.schema import CANONICAL_COLUMNS, validate_canonical

@pytest.fixture
def simulate():
    """simulate(cfg, trace) -> SimResult: a run on the core (``run_simulation``), which must
    say so in its summary (``core``, or ``core-cpython`` without numba)."""
    def run(cfg: SimConfig, trace: pd.DataFrame):
        result = run_simulation(cfg, trace)
        assert result.summary["engine"].startswith("core")
        return result
    return run


@pytest.fixture
def tiny_trace():
    """tiny_trace((arrival_s, prompt_tokens, output_tokens), ...) -> a canonical trace whose
    request ids are "r0", "r1", ... in row order."""
    def build(*rows: tuple[float, int, int]) -> pd.DataFrame:
        arrival, prompt, output = zip(*rows)
        df = pd.DataFrame(dict(zip(CANONICAL_COLUMNS, (
            [f"r{i}" for i in range(len(rows))], [float(a) for a in arrival], list(prompt), list(output)))))
        return validate_canonical(df, source="tiny_trace")
    return build


# KV bytes of one OPT-13B token: K and V x 40 layers x 40 heads x 128 dims x 2 bytes (fp16)
OPT13B_KV_BYTES_PER_TOKEN = 2 * 40 * 40 * 128 * 2  # 819,200 B


@pytest.fixture
def opt13b_config():
    """opt13b_config(kv_slots, **settings) -> the vllm system's SimConfig for OPT-13B on an
    A100-40GB with a KV pool of exactly ``kv_slots`` token slots and no watermark (so a pool
    of a few blocks behaves as worked out by hand); ``settings`` override anything."""
    def make(kv_slots: int, **settings) -> SimConfig:
        settings.setdefault("watermark", 0.0)
        return SimConfig.for_system("vllm", model="opt-13b", gpu="a100-40gb",
                                    kv_gib=kv_slots * OPT13B_KV_BYTES_PER_TOKEN / 2**30, **settings)
    return make


@pytest.fixture
def swap_gib_for():
    """swap_gib_for(tokens) -> the --swap-gib of a CPU swap space of exactly ``tokens`` OPT-13B tokens."""
    return lambda tokens: tokens * OPT13B_KV_BYTES_PER_TOKEN / 2**30


class HandRoofline:
    """The roofline price of one iteration (sim/cost/roofline.py's docstring) for OPT-13B on one
    A100-40GB, every constant worked out by hand from the public shapes and datasheet:

    OPT-13B (facebook/opt-13b config.json): 40 layers, hidden 5120, 40 heads of 128, FFN
    20480 (two matrices, no gate), vocabulary 50272, fp16. Linear parameters per layer:
    Q, K, V, O 4 x 5120^2 = 104,857,600, FFN 2 x 5120 x 20480 = 209,715,200, together
    314,572,800; 40 layers 12,582,912,000, plus the LM head 50272 x 5120 = 257,392,640:
    P = 12,840,304,640.

    A100-40GB: 312e12 dense fp16 FLOP/s, 1555e9 B/s HBM, 25e9 B/s PCIe. Efficiencies: GEMMs
    0.65 (2.028e14 FLOP/s), streaming 0.8 (1.244e12 B/s), prefill attention 0.5 (1.56e14).

    * linear layers: the larger of reading the weights once, 2P = 25,680,609,280 B at
      1.244e12 B/s = 20.6436 ms, and 2P FLOPs per token at 2.028e14 = 0.126630 ms per token
      (compute-bound above 163 tokens);
    * decode attention reads every cached K and V once: 819,200 B per context token at
      1.244e12 B/s = 0.658521 us per token;
    * prefill attention: QK^T and PV, 2 FLOPs x 2 matmuls x 40 layers x 40 heads x 128 =
      819,200 FLOPs per (new token, attended token) pair, n (b + n / 2) pairs for n new tokens
      after b cached ones (causal half), at 1.56e14 FLOP/s; plus reading the b cached tokens;
    * swapping: 819,200 B per token over PCIe at 25e9 B/s = 32.768 us per token, plus one
      5 us copy per block for K and for V of each of the 40 layers: 400 us per block of the
      paged cache (``block_size`` tokens), spread over its tokens;
    * fixed: 3 ms per iteration and 20 us per scheduled sequence;
    * vLLM v0's paged kernel (``kernel_block`` B: the vllm system's block size) reads each
      decoding sequence's K/V in whole blocks, ceil(context / B) x B tokens, and works per
      block as much as reading 0.23 x 16 = 3.68 tokens (the paper's Fig. 18a overhead at 16).
    """

    LINEAR_WEIGHT_READ_S = 2 * 12_840_304_640 / 1.244e12
    LINEAR_S_PER_TOKEN = 2 * 12_840_304_640 / 2.028e14
    KV_READ_S_PER_TOKEN = 819_200 / 1.244e12
    ATTENTION_FLOPS_PER_PAIR = 819_200
    PREFILL_ATTENTION_FLOPS_PER_S = 1.56e14
    SWAP_S_PER_TOKEN = 819_200 / 25e9
    SWAP_COPY_S_PER_BLOCK = 2 * 40 * 5e-6
    STEP_OVERHEAD_S = 3e-3
    PER_SEQ_OVERHEAD_S = 20e-6
    PAGED_BLOCK_OVERHEAD_TOKENS = 0.23 * 16

    def step(self, *, decode_contexts=(), prefills=(), swapped_tokens=0, block_size=0, kernel_block=0) -> float:
        """Seconds for an iteration decoding sequences whose contexts (including this step's
        token) are ``decode_contexts`` and prefilling ``prefills``, (new, cached) token pairs,
        with ``swapped_tokens`` moved over PCIe in blocks of ``block_size`` (0: one extent,
        no copy latency), under vLLM v0's paged kernel of ``kernel_block`` tokens (0: none)."""
        read = sum(decode_contexts)
        if kernel_block:
            read = sum(-(-c // kernel_block) for c in decode_contexts) * (kernel_block + self.PAGED_BLOCK_OVERHEAD_TOKENS)
        num_seqs = len(decode_contexts) + len(prefills)
        num_tokens = len(decode_contexts) + sum(n for n, _ in prefills)
        pairs = sum(n * (b + n / 2) for n, b in prefills)
        cached = sum(b for _, b in prefills)
        return (self.STEP_OVERHEAD_S + self.PER_SEQ_OVERHEAD_S * num_seqs
                + max(self.LINEAR_WEIGHT_READ_S, self.LINEAR_S_PER_TOKEN * num_tokens)
                + read * self.KV_READ_S_PER_TOKEN
                + pairs * self.ATTENTION_FLOPS_PER_PAIR / self.PREFILL_ATTENTION_FLOPS_PER_S
                + cached * self.KV_READ_S_PER_TOKEN
                + swapped_tokens * self.SWAP_S_PER_TOKEN
                + (swapped_tokens * self.SWAP_COPY_S_PER_BLOCK / block_size if block_size else 0.0))


@pytest.fixture
def opt13b_a100():
    """The hand-worked roofline of OPT-13B on an A100-40GB (:class:`HandRoofline`)."""
    return HandRoofline()
