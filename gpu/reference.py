"""numpy references (fp32 math) for the GPU kernels, and the split-K combine math.

Everything here is CPU-only and is what the GPU tests compare against:

* ``paged_attention_ref``: gathers each sequence's K/V through its block table (only the
  first ceil(ctx / block_size) entries), GQA head h uses KV head h // (num_heads / num_kv_heads).
* ``partition_stats`` / ``combine_partitions``: the FlashDecoding split: per partition the
  max logit m_p, the exp sum l_p and the normalized partial output o_p; combined as
  M = max m_p, w_p = l_p exp(m_p - M), out = sum w_p o_p / sum w_p (what the reduce kernel does).
* ``reshape_and_cache_ref``, ``copy_blocks_ref``, ``swap_blocks_ref``.
* ``fused_add_rms_norm_ref``, ``rotary_cache_ref``, ``silu_and_mul_ref``: the fused element-wise
  kernels, compared within two units in the last place (``assert_fused_close``).
* bf16 helpers: numpy has no bfloat16, bf16 values travel as uint16 bits
  (``f32_to_bf16_bits`` rounds to nearest even, like the kernel and torch).
* ``sdpa_ref``: the same attention with ``torch.nn.functional.scaled_dot_product_attention``
  on gathered contiguous KV (None when torch is not importable).

Tolerances, tied to the error observed in the CPU emulation of the kernels (every test case of
tests/gpu/test_emulated_kernels.py, 3 seeds, 171 rows; the reference is float64 on the same
rounded inputs): fp16 per-row ||out - ref|| / ||ref|| at most 2.3e-4 (median 2.0e-4), largest
element error 8.9e-4, never more than 2^-11 |ref| + 5e-8; bf16 1.75e-3 (median 1.6e-3), largest
element error 3.9e-3, never more than 2^-8 |ref|. Both are the output's rounding (fp16 unit
roundoff 2^-11 = 4.9e-4, bf16 2^-8 = 3.9e-3); the fp32 accumulation adds ~1e-7. The bounds
(``assert_attention_close``) take about twice that: per row ``REL_NORM_TOL`` (fp16 5e-4, bf16
4e-3), per element ``TOLERANCES`` (rtol twice the unit roundoff; atol far above the observed
excess near zero). A row that loses 1,024 of its 20,000 tokens is off by ~0.2 per row: caught.
The inputs given to the reference are the same rounded fp16/bf16 values the kernel reads.
"""

from __future__ import annotations

import math

import numpy as np

TOLERANCES = {"float16": dict(atol=1e-5, rtol=1e-3), "bfloat16": dict(atol=1e-4, rtol=8e-3),
              "float32": dict(atol=1e-5, rtol=1e-5)}
#: per output row (one sequence's heads), ||out - ref|| / ||ref||
REL_NORM_TOL = {"float16": 5e-4, "bfloat16": 4e-3, "float32": 1e-5}


def rel_norm_errors(got, want) -> np.ndarray:
    """||got - want|| / ||want|| per leading index (sequence); 0 where both rows are zero."""
    g = np.asarray(got, dtype=np.float64).reshape(len(got), -1)
    w = np.asarray(want, dtype=np.float64).reshape(len(want), -1)
    num, den = np.linalg.norm(g - w, axis=1), np.linalg.norm(w, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.where(num > 0, np.inf, 0.0))


def assert_attention_close(got, want, dtype: str) -> None:
    """Kernel output vs reference (both fp32 values): no NaN, every element within TOLERANCES,
    every row within REL_NORM_TOL (see the module docstring for where the numbers come from)."""
    got = np.asarray(got, dtype=np.float32)
    assert not np.isnan(got).any(), "NaN in the kernel's output (an unwritten or poisoned element)"
    np.testing.assert_allclose(got, want, **TOLERANCES[dtype])
    err = rel_norm_errors(got, want)
    bad = np.flatnonzero(err > REL_NORM_TOL[dtype])
    assert not len(bad), (f"rows {bad[:8].tolist()}: ||out - ref|| / ||ref|| = {err[bad[:8]].tolist()} "
                          f"> {REL_NORM_TOL[dtype]} ({dtype})")


# ---- bf16 bits ---------------------------------------------------------------------------
def f32_to_bf16_bits(x) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, np.uint16(0x7FC0), r)


def bf16_bits_to_f32(b) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def as_f32(x, dtype: str | None = None) -> np.ndarray:
    """fp32 values of a float array or of bf16 bits (uint16/int16 with dtype='bfloat16')."""
    x = np.asarray(x)
    if dtype == "bfloat16" or x.dtype in (np.uint16, np.int16):
        return bf16_bits_to_f32(x.view(np.uint16))
    return x.astype(np.float32)


def round_to(x, dtype: str) -> np.ndarray:
    """fp32 -> storage dtype (float16 array, or uint16 bf16 bits)."""
    if dtype == "float16":
        return np.asarray(x, dtype=np.float32).astype(np.float16)
    if dtype == "bfloat16":
        return f32_to_bf16_bits(x)
    return np.asarray(x, dtype=np.float32)


# ---- attention -----------------------------------------------------------------------------
def gather_kv(cache: np.ndarray, table, ctx: int, block_size: int) -> np.ndarray:
    """[ctx, num_kv_heads, head_dim] rows of one sequence, read through its block table."""
    nblk = -(-int(ctx) // block_size)
    blocks = np.asarray(table[:nblk], dtype=np.int64)
    rows = cache[blocks].reshape(nblk * block_size, *cache.shape[2:])
    return rows[:ctx]


def attention_one(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """q [H, D], k/v [L, KVH, D] (fp32) -> [H, D]; GQA by head grouping; L == 0 -> zeros."""
    H, D = q.shape
    L, KVH, _ = k.shape
    if L == 0:
        return np.zeros((H, D), dtype=np.float32)
    g = H // KVH
    kh = np.repeat(k, g, axis=1)  # [L, H, D]: head h uses KV head h // g
    vh = np.repeat(v, g, axis=1)
    logits = np.einsum("hd,lhd->hl", q.astype(np.float64), kh.astype(np.float64)) * scale
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return np.einsum("hl,lhd->hd", p, vh.astype(np.float64)).astype(np.float32)


def paged_attention_ref(query, key_cache, value_cache, block_tables, context_lens, block_size: int,
                        scale: float | None = None, dtype: str | None = None) -> np.ndarray:
    """fp32 output [num_seqs, num_heads, head_dim] (float16 / bf16-bit inputs accepted)."""
    q = as_f32(query, dtype)
    kc, vc = as_f32(key_cache, dtype), as_f32(value_cache, dtype)
    S, H, D = q.shape
    if H % kc.shape[2]:
        raise ValueError("num_heads must be a multiple of num_kv_heads")
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = np.zeros((S, H, D), dtype=np.float32)
    for s in range(S):
        L = int(context_lens[s])
        out[s] = attention_one(q[s], gather_kv(kc, block_tables[s], L, block_size),
                               gather_kv(vc, block_tables[s], L, block_size), scale)
    return out


def contiguous_attention_ref(query, key, value, context_lens, scale=None, dtype=None) -> np.ndarray:
    """Contiguous layout [num_seqs, max_ctx, num_kv_heads, head_dim]."""
    q, k, v = as_f32(query, dtype), as_f32(key, dtype), as_f32(value, dtype)
    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else scale
    return np.stack([attention_one(q[s], k[s, :int(context_lens[s])], v[s, :int(context_lens[s])], scale)
                     for s in range(q.shape[0])]) if q.shape[0] else np.zeros(q.shape, np.float32)


def partition_stats(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, partition_size: int):
    """Per-partition (m [P, H], l [P, H], o [P, H, D]) of one sequence, as the v2 kernel writes them."""
    H, D = q.shape
    L, KVH, _ = k.shape
    g = H // KVH
    ms, ls, os_ = [], [], []
    for start in range(0, L, partition_size):
        kp = np.repeat(k[start:start + partition_size], g, axis=1).astype(np.float64)
        vp = np.repeat(v[start:start + partition_size], g, axis=1).astype(np.float64)
        logits = np.einsum("hd,lhd->hl", q.astype(np.float64), kp) * scale
        m = logits.max(axis=1)
        p = np.exp(logits - m[:, None])
        l_ = p.sum(axis=1)
        ms.append(m)
        ls.append(l_)
        os_.append(np.einsum("hl,lhd->hd", p, vp) / l_[:, None])
    if not ms:
        return np.zeros((0, H)), np.zeros((0, H)), np.zeros((0, H, D))
    return np.stack(ms), np.stack(ls), np.stack(os_)


def combine_partitions(m: np.ndarray, l_: np.ndarray, o: np.ndarray) -> np.ndarray:
    """The reduce kernel's math: m, l [P, H], o [P, H, D] -> [H, D] (zeros when P == 0)."""
    if len(m) == 0:
        return np.zeros(o.shape[1:], dtype=np.float32)
    M = m.max(axis=0)
    w = l_ * np.exp(m - M[None, :])
    return ((w[:, :, None] * o).sum(axis=0) / w.sum(axis=0)[:, None]).astype(np.float32)


# ---- cache ops -----------------------------------------------------------------------------
def reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping) -> None:
    """In place: cache.reshape(-1, KVH, D)[slot] = key[i] for slot >= 0."""
    bs = key_cache.shape[1]
    for i, slot in enumerate(np.asarray(slot_mapping, dtype=np.int64)):
        if slot < 0:
            continue
        b, off = divmod(int(slot), bs)
        key_cache[b, off] = key[i]
        value_cache[b, off] = value[i]


def copy_blocks_ref(key_cache, value_cache, block_mapping) -> None:
    for s, d in np.asarray(block_mapping, dtype=np.int64).reshape(-1, 2):
        key_cache[d] = key_cache[s]
        value_cache[d] = value_cache[s]


def swap_blocks_ref(src, dst, block_mapping) -> None:
    for s, d in np.asarray(block_mapping, dtype=np.int64).reshape(-1, 2):
        dst[d] = src[s]


# ---- fused element-wise kernels (gpu/kernels/fused_ops.cu) -----------------------------------
#: two units in the last place of the storage type, relative: the fused kernels and these references
#: do the same fp32 arithmetic and round at the same points, so they differ where fp32 summation
#: order or expf moved a value across a rounding boundary (one unit), carried through a second
#: rounding (the norm's weight: two units, seen in the emulation at hidden 33)
FUSED_RTOL = {"float16": 2.0 ** -9, "bfloat16": 2.0 ** -6}


def assert_fused_close(got, want, dtype: str) -> None:
    """Storage-type outputs (float16, or bf16 bits) within two units in the last place."""
    g, w = as_f32(got, dtype), as_f32(want, dtype)
    assert not np.isnan(g).any(), "NaN in the kernel's output"
    np.testing.assert_allclose(g, w, rtol=FUSED_RTOL[dtype], atol=1e-6)


def fused_add_rms_norm_ref(x, residual, weight, eps: float, dtype: str, add: bool = True):
    """(normed, new residual), storage dtype: z = x + residual rounded (the new residual), then
    (z / rms(z)) rounded, times weight, rounded (vLLM's roundings; see fused_ops.cu)."""
    z = as_f32(x, dtype) + (as_f32(residual, dtype) if add else 0.0)
    z = as_f32(round_to(z, dtype), dtype)
    inv = 1.0 / np.sqrt((z.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps)
    normed = as_f32(round_to(z * inv, dtype), dtype)
    return round_to(normed * as_f32(weight, dtype), dtype), round_to(z, dtype)


def rotary_cache_ref(qkv, positions, cos, sin, num_heads: int, num_kv_heads: int, key_cache, value_cache,
                     slot_mapping, dtype: str):
    """The rotated qkv rows (storage dtype); the caches are written in place (rotated k, v)."""
    T = len(qkv)
    D = key_cache.shape[-1]
    half = D // 2
    f = as_f32(qkv, dtype).reshape(T, num_heads + 2 * num_kv_heads, D).copy()
    c = as_f32(cos, dtype)[np.asarray(positions)][:, None, :]
    s = as_f32(sin, dtype)[np.asarray(positions)][:, None, :]
    rot = slice(0, num_heads + num_kv_heads)
    x, y = f[:, rot, :half].copy(), f[:, rot, half:].copy()
    f[:, rot, :half], f[:, rot, half:] = x * c - y * s, y * c + x * s
    out = round_to(f.reshape(T, -1), dtype)
    heads = out.reshape(T, num_heads + 2 * num_kv_heads, D)
    k, v = heads[:, num_heads:num_heads + num_kv_heads], heads[:, num_heads + num_kv_heads:]
    reshape_and_cache_ref(k, v, key_cache, value_cache, slot_mapping)
    return out


def silu_and_mul_ref(x, dtype: str):
    """silu(gate) rounded, times up, rounded; x = [gate | up] along the last axis."""
    f = as_f32(x, dtype)
    d = f.shape[-1] // 2
    g = f[..., :d].astype(np.float64)
    act = as_f32(round_to(g / (1.0 + np.exp(-g)), dtype), dtype)
    return round_to(act * f[..., d:], dtype)


# ---- torch SDPA as a second reference --------------------------------------------------------
def sdpa_ref(query, key_cache, value_cache, block_tables, context_lens, block_size: int, scale=None,
             dtype: str | None = None):
    """Same as ``paged_attention_ref`` via torch SDPA (fp32, CPU); None when torch is missing."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception:
        return None
    q = as_f32(query, dtype)
    kc, vc = as_f32(key_cache, dtype), as_f32(value_cache, dtype)
    S, H, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = np.zeros((S, H, D), dtype=np.float32)
    for s in range(S):
        L = int(context_lens[s])
        if L == 0:
            continue
        k = torch.from_numpy(np.ascontiguousarray(gather_kv(kc, block_tables[s], L, block_size))).transpose(0, 1)
        v = torch.from_numpy(np.ascontiguousarray(gather_kv(vc, block_tables[s], L, block_size))).transpose(0, 1)
        g = H // k.shape[0]
        k = k.repeat_interleave(g, dim=0)[None]  # [1, H, L, D]
        v = v.repeat_interleave(g, dim=0)[None]
        qt = torch.from_numpy(q[s])[None, :, None, :]  # [1, H, 1, D]
        o = F.scaled_dot_product_attention(qt, k, v, scale=scale)
        out[s] = o[0, :, 0, :].numpy()
    return out
