"""Prefill attention never builds a per-length plan: the runner's SDPA may use flash,
memory-efficient or math attention, never cuDNN (which built a plan for every new sequence length
on the H100 of 2026-11-23: 72 ms the first time; benchmarks/results/2026-11-23-h100-80gb-hbm3)."""

from __future__ import annotations

import pytest


def test_prefill_sdpa_backends_exclude_cudnn(monkeypatch):
    torch = pytest.importorskip("torch")
    attention = pytest.importorskip("torch.nn.attention")
    from pagesim.gpu.model_runner import TorchCupyBackend
    seen = []

    def sdpa_kernel(backends):
        seen.append(list(backends))
        import contextlib
        return contextlib.nullcontext()

    monkeypatch.setattr(attention, "sdpa_kernel", sdpa_kernel)
    be = TorchCupyBackend(dtype="float32", device="cpu")
    be.torch, be.KVH, be.H = torch, 2, 2
    q = torch.randn(1, 2, 5, 8)
    be._sdpa(q, q, q, causal=True)
    B = attention.SDPBackend
    assert seen == [[B.FLASH_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH]]
