"""KV-cache companion operations on the GPU: reshape_and_cache, copy_blocks, swap_blocks.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]`` (any 2-byte dtype; the
kernels move bytes). Inputs are CuPy arrays or torch CUDA tensors (zero copy via DLPack);
index arrays may also be numpy/lists. All calls are asynchronous on the current stream
(torch's current stream for torch inputs) and modify the caches in place.

* ``reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)``: ``key``/``value``
  ``[num_tokens, num_kv_heads, head_dim]`` (rows may be strided, e.g. a slice of a fused QKV
  output, as long as each token's heads are contiguous); ``slot_mapping [num_tokens]``
  int32/int64, slot = block * block_size + offset; negative slots are skipped, a slot past the
  caches is refused (ValueError, checked on the host unless ``check=False``).
* ``copy_blocks(key_cache, value_cache, block_mapping)``: ``block_mapping [n, 2]`` (src, dst)
  pairs, copy-on-write. Destinations must be distinct and must not be sources of the same call
  (checked on the host; it would race otherwise). One layer per call (loop over layers).
* ``swap_blocks(src, dst, block_mapping)``: copy whole blocks between a device cache and a
  pinned host cache (either direction, or device to device) with one ``cudaMemcpyAsync`` per
  run of consecutive (src, dst) pairs. ``empty_pinned_cache(shape, dtype)`` allocates the host
  side (``cupyx.empty_pinned``: page-locked so the copies are truly asynchronous).
"""

from __future__ import annotations

import numpy as np

from pagesim.gpu._arrays import stream_ctx as _stream_ctx
from pagesim.gpu._arrays import torch_stream, wrap
from pagesim.gpu._loader import get_kernel
from pagesim.gpu.kernels_src import copy_blocks_name, reshape_and_cache_name

SRC = "cache_ops.cu"
THREADS = 128


def _kernel(name):
    return get_kernel(SRC, name)


def _unit(row_bytes: int, *ptrs: int) -> tuple[str, int]:
    if row_bytes % 16 == 0 and all(p % 16 == 0 for p in ptrs):
        return "uint4", 16
    return "unsigned short", 2


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, *, check: bool = True) -> None:
    """``check`` (default): every slot is < the caches' num_blocks x block_size (one small
    device->host copy; the kernel writes where it is told). Pass ``check=False`` on hot paths whose
    slots were checked on the host (the GPU executor checks its plan's slots)."""
    kc = wrap(key_cache, "key_cache", "bfloat16")
    with _stream_ctx(kc):  # torch caches: conversions and the launch on torch's current stream
        _reshape_and_cache(key, value, kc, value_cache, slot_mapping, check)


def _reshape_and_cache(key, value, kc, value_cache, slot_mapping, check=True) -> None:
    import cupy as cp
    vc = wrap(value_cache, "value_cache", "bfloat16")
    k = wrap(key, "key", "bfloat16")
    v = wrap(value, "value", "bfloat16")
    sm = wrap(slot_mapping, "slot_mapping", allow_host=True)
    if kc.arr.ndim != 4 or kc.arr.shape != vc.arr.shape:
        raise ValueError(f"caches must both be [num_blocks, block_size, num_kv_heads, head_dim], got "
                         f"{kc.arr.shape} and {vc.arr.shape}")
    if not (kc.arr.flags.c_contiguous and vc.arr.flags.c_contiguous):
        raise ValueError("caches must be C-contiguous")
    _, _, nkvh, hd = kc.arr.shape
    item = kc.arr.itemsize
    if item != 2 or k.arr.itemsize != 2 or v.arr.itemsize != 2:
        raise TypeError("reshape_and_cache moves 2-byte elements (float16 / bfloat16)")
    if k.dtype != kc.dtype or v.dtype != kc.dtype:
        raise TypeError(f"key/value dtype ({k.dtype}, {v.dtype}) differ from the caches' {kc.dtype}")
    n = int(k.arr.shape[0]) if k.arr.ndim else 0
    for w, nm in ((k, "key"), (v, "value")):
        if w.arr.shape != (n, nkvh, hd):
            raise ValueError(f"{nm}: expected [{n}, {nkvh}, {hd}], got {w.arr.shape}")
    if sm.arr.shape != (n,):
        raise ValueError(f"slot_mapping: expected shape ({n},), got {sm.arr.shape}")
    if n == 0:
        return
    if sm.dtype not in ("int32", "int64"):
        sm.arr = sm.arr.astype(cp.int64)
    sm_arr = cp.ascontiguousarray(sm.arr)
    num_slots = int(kc.arr.shape[0]) * int(kc.arr.shape[1])
    if check:
        top = int(cp.asnumpy(sm_arr).max())
        if top >= num_slots:
            raise ValueError(f"slot_mapping: slot {top} is outside the caches' {num_slots} slots "
                             f"(num_blocks x block_size)")
    index = "int" if sm_arr.dtype == cp.int32 else "long long"

    def rows(a):
        # each token's [num_kv_heads, head_dim] must be contiguous; tokens may be strided
        if a.strides[2] != item or a.strides[1] != hd * item:
            a = cp.ascontiguousarray(a)
        return a, a.strides[0]

    ka, ks = rows(k.arr)
    va, vs = rows(v.arr)
    row_bytes = nkvh * hd * item
    unit, ub = _unit(row_bytes, ka.data.ptr, va.data.ptr, kc.arr.data.ptr, vc.arr.data.ptr, ks, vs)
    kern = _kernel(reshape_and_cache_name(unit, index))
    kern((n,), (THREADS,), (ka, va, kc.arr, vc.arr, sm_arr, np.int64(row_bytes // ub), np.int64(ks // ub),
                            np.int64(vs // ub)))


def _mapping(block_mapping) -> np.ndarray:
    m = np.asarray(block_mapping.get() if hasattr(block_mapping, "get") else
                   (block_mapping.cpu().numpy() if hasattr(block_mapping, "cpu") else block_mapping),
                   dtype=np.int64)
    if m.size == 0:
        return m.reshape(0, 2)
    if m.ndim != 2 or m.shape[1] != 2:
        raise ValueError(f"block_mapping: expected [n, 2] (src, dst) pairs, got shape {m.shape}")
    return m


def copy_blocks(key_cache, value_cache, block_mapping) -> None:
    import cupy as cp
    kc = wrap(key_cache, "key_cache", "bfloat16")
    vc = wrap(value_cache, "value_cache", "bfloat16")
    if kc.arr.shape != vc.arr.shape or kc.arr.ndim != 4:
        raise ValueError("caches must both be [num_blocks, block_size, num_kv_heads, head_dim]")
    if not (kc.arr.flags.c_contiguous and vc.arr.flags.c_contiguous):
        raise ValueError("caches must be C-contiguous")
    m = _mapping(block_mapping)
    if len(m) == 0:
        return
    nb = kc.arr.shape[0]
    if m.min() < 0 or m.max() >= nb:
        raise ValueError(f"block_mapping: block ids must be in [0, {nb})")
    dst = m[:, 1]
    if len(np.unique(dst)) != len(dst) or np.isin(dst, m[:, 0]).any():
        raise ValueError("block_mapping: destinations must be distinct and not sources of the same call")
    block_bytes = kc.arr.nbytes // nb
    unit, ub = _unit(block_bytes, kc.arr.data.ptr, vc.arr.data.ptr)
    kern = _kernel(copy_blocks_name(unit))
    with _stream_ctx(kc):
        md = cp.asarray(m)
        kern((len(m),), (THREADS,), (kc.arr, vc.arr, md, np.int64(block_bytes // ub)))


def empty_pinned_cache(shape, dtype=np.float16) -> np.ndarray:
    """A page-locked host array (``cupyx.empty_pinned``) to swap blocks into."""
    import cupyx
    return cupyx.empty_pinned(tuple(shape), dtype=dtype)


def coalesce_runs(mapping: np.ndarray) -> list[tuple[int, int, int]]:
    """(src, dst, count) runs of consecutive pairs, sorted by src (pure; tested on CPU)."""
    m = np.asarray(mapping, dtype=np.int64).reshape(-1, 2)
    if len(m) == 0:
        return []
    m = m[np.argsort(m[:, 0], kind="stable")]
    runs = []
    s0, d0, c = int(m[0, 0]), int(m[0, 1]), 1
    for s, d in m[1:]:
        if s == s0 + c and d == d0 + c:
            c += 1
        else:
            runs.append((s0, d0, c))
            s0, d0, c = int(s), int(d), 1
    runs.append((s0, d0, c))
    return runs


def swap_blocks(src, dst, block_mapping) -> None:
    """Copy blocks ``src[s] -> dst[d]`` for each (s, d); src/dst: device arrays/tensors or pinned
    numpy arrays (``empty_pinned_cache``) of the same block shape. Asynchronous: synchronize the
    stream before reading a host destination."""
    import cupy as cp

    def ptr_and_shape(x, nm):
        if isinstance(x, np.ndarray):
            if not x.flags.c_contiguous:
                raise ValueError(f"{nm}: host array must be C-contiguous")
            return x.ctypes.data, x.shape, x.nbytes, None
        w = wrap(x, nm, "bfloat16")
        if not w.arr.flags.c_contiguous:
            raise ValueError(f"{nm}: must be C-contiguous")
        return w.arr.data.ptr, w.arr.shape, w.arr.nbytes, w

    sp, sshape, sbytes, sw = ptr_and_shape(src, "src")
    dp, dshape, dbytes, dw = ptr_and_shape(dst, "dst")
    if tuple(sshape[1:]) != tuple(dshape[1:]) or sbytes // max(sshape[0], 1) != dbytes // max(dshape[0], 1):
        raise ValueError(f"src {tuple(sshape)} and dst {tuple(dshape)} blocks differ")
    m = _mapping(block_mapping)
    if len(m) == 0:
        return
    if m[:, 0].min() < 0 or m[:, 0].max() >= sshape[0] or m[:, 1].min() < 0 or m[:, 1].max() >= dshape[0]:
        raise ValueError("block_mapping: block id out of range")
    block_bytes = sbytes // sshape[0]
    w = sw or dw
    stream = torch_stream(w) if w is not None else None
    stream = stream or cp.cuda.get_current_stream()
    kind = cp.cuda.runtime.memcpyDefault  # unified addressing: direction from the pointers
    for s, d, c in coalesce_runs(m):
        cp.cuda.runtime.memcpyAsync(dp + d * block_bytes, sp + s * block_bytes, c * block_bytes, kind,
                                    stream.ptr)
