"""The element-wise parts of the runner's decoder layer, two ways (``TorchCupyBackend(ops=...)``):

* ``EagerLayers`` ("eager"): torch ops one by one, the residual stream ``x`` added after each
  block: RMSNorm ~8 kernels, rotary ~9, SiLU-and-mul 3 (counted on the H100 of 2026-11-23). The
  reference: every fused result is checked against it (tests/gpu/test_layer_ops_emulated.py).
* ``FusedLayers`` ("fused"): the kernels of ``gpu/fused_ops.py``, as vLLM runs a LLaMA layer
  (vllm 0.33.0 model_executor/models/llama.py:322-328): the state is (h, residual), the norm before
  attention and the one before the MLP each add the previous block's output into the residual
  and normalize it in one kernel; rotary and the KV-cache write are one kernel; SiLU-and-mul one.
  The first layer's norm copies its input into the residual (``add=False``); the final norm adds
  the last MLP's output, on the sampled rows only.

Each takes the backend (shapes, weights, rotary tables) and keeps no state between steps:
``start(x) -> state``, ``qkv(state, w, pos, kc, vc, slots) -> (state, q, k, v)`` (the new K/V
written to their slots), ``finish(state, att, w) -> state``, ``final(state, rows) -> hidden``.
"""

from __future__ import annotations

#: RMSNorm's epsilon (LLaMA's; both paths)
RMS_EPS = 1e-6
OPS = ("fused", "eager")


class EagerLayers:
    def __init__(self, be):
        self.be = be

    def start(self, x):
        return x

    def qkv(self, x, w, pos, kc, vc, slots):
        q, k, v = self.be._qkv(x, w, pos)
        self.be._write(kc, vc, k, v, slots)
        return x, q, k, v

    def finish(self, x, att, w):
        x = x + att.reshape(x.shape[0], -1) @ w["o"]
        return self.be._mlp(x, w)

    def final(self, x, rows):
        return self.be._rms(x.index_select(0, rows), self.be.ln_f)


class FusedLayers:
    def __init__(self, be):
        from pagesim.gpu import fused_ops
        self.be, self.ops = be, fused_ops

    def start(self, x):
        return x, self.be.torch.empty_like(x), True

    def qkv(self, state, w, pos, kc, vc, slots):
        h, residual, first = state
        be = self.be
        H, KVH, D, T = be.H, be.KVH, be.D, h.shape[0]
        self.ops.fused_add_rms_norm(h, residual, w["ln1"], RMS_EPS, add=not first)
        qkv = h @ w["qkv"]
        self.ops.rotary_and_cache(qkv, pos, be.cos, be.sin, H, KVH, kc, vc, slots)
        q = qkv[:, :H * D].view(T, H, D)
        k = qkv[:, H * D:(H + KVH) * D].view(T, KVH, D)
        return (h, residual, False), q, k, qkv[:, (H + KVH) * D:].view(T, KVH, D)

    def finish(self, state, att, w):
        _, residual, _ = state
        be = self.be
        h = att.reshape(residual.shape[0], -1) @ w["o"]
        self.ops.fused_add_rms_norm(h, residual, w["ln2"], RMS_EPS)
        m = h @ w["up"]
        if be.gated:
            act = be.torch.empty((m.shape[0], m.shape[1] // 2), device=m.device, dtype=m.dtype)
            self.ops.silu_and_mul(m, act)
        else:
            act = be.torch.nn.functional.relu(m)
        return act @ w["down"], residual, False

    def final(self, state, rows):
        h, residual, first = state
        hs = h.index_select(0, rows)
        self.ops.fused_add_rms_norm(hs, residual.index_select(0, rows), self.be.ln_f, RMS_EPS, add=not first)
        return hs


def layer_ops(name: str, be):
    return {"fused": FusedLayers, "eager": EagerLayers}[name](be)
