"""The fused element-wise kernels of a decoder layer (``gpu/kernels/fused_ops.cu``), where serving
engines fuse them. Inputs are torch CUDA tensors or CuPy arrays (``gpu._arrays``), 2-D rows whose
last axis is contiguous (rows may be strided, e.g. views into a fused QKV output); every call is
asynchronous on the current stream, allocates nothing on the device (so it can be captured in a
CUDA graph) and works in place or into ``out``.

* ``fused_add_rms_norm(x, residual, weight, eps)``: ``residual += x; x = RMSNorm(residual) *
  weight``; ``add=False``: ``residual = x; x = RMSNorm(x) * weight`` (the first layer). vLLM calls
  it for every norm after the first (vllm 0.33.0: model_executor/layers/layernorm.py:93,
  _custom_ops.py:332; llama.py:324 and 328).
* ``rotary_and_cache(qkv, positions, cos, sin, num_heads, num_kv_heads, key_cache, value_cache,
  slot_mapping)``: neox rotary of q and k in place and the rotated k and the v rows written to
  their cache slots, one kernel. SGLang fuses the cache write into its rotary kernel
  (sglang 0.5.23: srt/layers/rotary_embedding/base.py:453-474, ``fused_set_kv_buffer_arg``);
  vLLM rotates q and k in one in-place kernel (vllm 0.33.0:
  model_executor/layers/rotary_embedding/base.py:242-250, llama.py:231) and writes the cache in
  its attention backend's ``reshape_and_cache_flash`` (_custom_ops.py:2613): one launch more a
  layer.
* ``silu_and_mul(x, out)``: ``out = silu(x[:, :d]) * x[:, d:]`` (vllm 0.33.0:
  model_executor/layers/activation.py:116-138).

``check=True`` reads the slot mapping and positions back to the host to refuse one past the
caches or the rotary tables (a synchronization: hot paths whose plan was checked pass False).
"""

from __future__ import annotations

import numpy as np

from pagesim.gpu._arrays import stream_ctx, wrap
from pagesim.gpu._loader import get_kernel
from pagesim.gpu.kernels_src import fused_kernel_name

SRC = "fused_ops.cu"
#: threads per block: one block per token, as many threads as elements up to this (vLLM launches
#: min(hidden, 1024) for its norms)
MAX_THREADS = 1024


def _threads(work: int) -> int:
    return int(min(MAX_THREADS, max(32, -(-work // 32) * 32)))


def _rows(w, name: str) -> int:
    """Row stride in elements of a 2-D array whose last axis is contiguous."""
    a = w.arr
    if a.ndim != 2 or a.strides[1] != a.itemsize or a.itemsize != 2:
        raise ValueError(f"{name}: expected 2-D rows of 2-byte elements, contiguous along the last axis, got "
                         f"shape {a.shape} strides {a.strides}")
    return a.strides[0] // a.itemsize


def _same_dtype(*ws) -> str:
    dts = {w.dtype for w in ws}
    if len(dts) != 1 or not dts <= {"float16", "bfloat16"}:
        raise TypeError(f"the fused kernels take one 2-byte dtype (float16 or bfloat16), got {sorted(dts)}")
    return dts.pop()


def fused_add_rms_norm(x, residual, weight, eps: float = 1e-6, *, add: bool = True) -> None:
    xw, rw, ww = wrap(x, "x", "bfloat16"), wrap(residual, "residual", "bfloat16"), wrap(weight, "weight", "bfloat16")
    dtype = _same_dtype(xw, rw, ww)
    n, hidden = xw.arr.shape if xw.arr.ndim == 2 else (None, None)
    xs, rs = _rows(xw, "x"), _rows(rw, "residual")
    if rw.arr.shape != (n, hidden) or ww.arr.shape != (hidden,):
        raise ValueError(f"residual {rw.arr.shape} and weight {ww.arr.shape} do not match x {xw.arr.shape}")
    if n == 0:
        return
    with stream_ctx(xw):
        get_kernel(SRC, fused_kernel_name("fused_add_rms_norm", dtype))(
            (n,), (_threads(hidden),), (xw.arr, rw.arr, ww.arr, np.float32(eps), np.int32(hidden), np.int64(xs),
                                        np.int64(rs), np.int32(int(add))))


def rotary_and_cache(qkv, positions, cos, sin, num_heads: int, num_kv_heads: int, key_cache, value_cache,
                     slot_mapping, *, check: bool = False) -> None:
    import cupy as cp
    qw = wrap(qkv, "qkv", "bfloat16")
    cw, sw = wrap(cos, "cos", "bfloat16"), wrap(sin, "sin", "bfloat16")
    kw, vw = wrap(key_cache, "key_cache", "bfloat16"), wrap(value_cache, "value_cache", "bfloat16")
    pw, slw = wrap(positions, "positions"), wrap(slot_mapping, "slot_mapping")
    dtype = _same_dtype(qw, cw, sw, kw, vw)
    qs = _rows(qw, "qkv")
    n = qw.arr.shape[0]
    head_dim = kw.arr.shape[-1] if kw.arr.ndim == 4 else 0
    if kw.arr.ndim != 4 or kw.arr.shape != vw.arr.shape or kw.arr.shape[2] != num_kv_heads or head_dim % 2:
        raise ValueError(f"caches must both be [num_blocks, block_size, {num_kv_heads}, even head_dim], got "
                         f"{kw.arr.shape} and {vw.arr.shape}")
    if not (kw.arr.flags.c_contiguous and vw.arr.flags.c_contiguous):
        raise ValueError("caches must be C-contiguous")
    if qw.arr.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"qkv rows hold {qw.arr.shape[1]} elements, not ({num_heads} + 2 x {num_kv_heads}) x "
                         f"{head_dim}")
    if cw.arr.shape != sw.arr.shape or cw.arr.ndim != 2 or cw.arr.shape[1] != head_dim // 2 \
            or not (cw.arr.flags.c_contiguous and sw.arr.flags.c_contiguous):
        raise ValueError(f"cos and sin must be contiguous [max_position, {head_dim // 2}], got {cw.arr.shape}")
    if pw.dtype != "int64" or pw.arr.shape != (n,) or slw.arr.shape != (n,) or slw.dtype not in ("int32", "int64"):
        raise ValueError(f"positions must be int64 [{n}] and slot_mapping int32/int64 [{n}]")
    if n == 0:
        return
    if check:
        slots, pos = cp.asnumpy(slw.arr), cp.asnumpy(pw.arr)
        if slots.max() >= kw.arr.shape[0] * kw.arr.shape[1]:
            raise ValueError(f"slot_mapping: slot {int(slots.max())} is outside the caches")
        if pos.min() < 0 or pos.max() >= cw.arr.shape[0]:
            raise ValueError(f"positions: {int(pos.max())} is outside the rotary tables' {cw.arr.shape[0]} rows")
    index = "int" if slw.dtype == "int32" else "long long"
    with stream_ctx(qw):
        get_kernel(SRC, fused_kernel_name("rotary_cache", dtype, index))(
            (n,), (_threads((num_heads + num_kv_heads) * head_dim // 2),),
            (qw.arr, np.int64(qs), pw.arr, cw.arr, sw.arr, np.int32(num_heads), np.int32(num_kv_heads),
             np.int32(head_dim), kw.arr, vw.arr, slw.arr))


def silu_and_mul(x, out) -> None:
    xw, ow = wrap(x, "x", "bfloat16"), wrap(out, "out", "bfloat16")
    dtype = _same_dtype(xw, ow)
    xs, os_ = _rows(xw, "x"), _rows(ow, "out")
    n, two_d = xw.arr.shape
    if two_d % 2 or ow.arr.shape != (n, two_d // 2):
        raise ValueError(f"x [{n}, 2 d] and out [{n}, d] expected, got {xw.arr.shape} and {ow.arr.shape}")
    if n == 0:
        return
    with stream_ctx(xw):
        get_kernel(SRC, fused_kernel_name("silu_and_mul", dtype))(
            (n,), (_threads(two_d // 2),), (ow.arr, xw.arr, np.int32(two_d // 2), np.int64(xs), np.int64(os_)))
