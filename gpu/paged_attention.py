"""PagedAttention decode on the GPU: ``forward`` (paged KV) and ``forward_contiguous``.

API::

    out = gpu.paged_attention.forward(query, key_cache, value_cache, block_tables, context_lens,
                                      block_size, max_context_len, scale=None, num_partitions=None)

    query        [num_seqs, num_heads, head_dim]            fp16 / bf16
    key_cache    [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache  [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables [num_seqs, max_blocks_per_seq] int32       entries past ceil(ctx/block_size) never read
    context_lens [num_seqs] int32                           0 gives a zero output row
    out          [num_seqs, num_heads, head_dim]            same dtype and kind (CuPy / torch) as query

* Inputs: CuPy arrays or torch CUDA tensors (zero copy through DLPack; launched on torch's
  current stream). bf16: torch ``bfloat16`` tensors, or CuPy ``uint16`` arrays of raw bf16
  bits with ``dtype="bfloat16"`` (CuPy has no bfloat16 dtype). Accumulation is fp32.
* head_dim in {64, 80, 96, 128, 256}; any block size (powers of two use shifts);
  num_heads a multiple of num_kv_heads (MHA, GQA, MQA).
* ``max_context_len`` must be >= every context length (like vLLM); ``check=True`` (default)
  verifies that and the table entries on the host (one small device->host copy); pass
  ``check=False`` on hot paths.
* Split-K: the context is cut in partitions of ``partition_size`` tokens (default: 512, halved
  down to 64 while the grid would not fill the GPU twice); one partition -> single kernel
  (v1), several -> per-partition (max, sum, partial out) + a reduce kernel (v2 / FlashDecoding).
  ``num_partitions`` forces ceil(max_context_len / num_partitions)-token partitions (a
  minimum: partitions are halved further if their logits would not fit in shared memory,
  e.g. num_partitions=1 on a very long context).

``prepare(...)`` returns a :class:`PagedAttentionPlan` whose ``run()`` only launches (the
benchmark and the executor use it to keep Python overhead out of the timed region).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagesim.gpu._arrays import torch_stream, unwrap, wrap
from pagesim.gpu._loader import get_kernel
from pagesim.gpu.kernels_src import (HEAD_DIMS, NUM_THREADS, attention_kernel_name, heads_per_block,
                             reduce_kernel_name)

SRC = "paged_attention.cu"
DEFAULT_PARTITION = 512
MIN_PARTITION = 64
MAX_SEQS = 65535  # CUDA's limit on gridDim.y
_DEFAULT_SMEM = 48 * 1024


def pv_rows(head_dim: int) -> int:
    return NUM_THREADS // (head_dim // 8)


def smem_bytes(heads: int, head_dim: int, partition_size: int) -> int:
    """Dynamic shared memory of the attention kernel (see paged_attention.cu)."""
    return 4 * (heads * head_dim + max(heads * partition_size, pv_rows(head_dim) * heads * head_dim))


def reduce_smem_bytes(max_parts: int) -> int:
    """Dynamic shared memory of the reduce kernel: its ``max_parts`` weights plus 2 floats of slack.
    ptxas unrolls the weighted sum by 4 and reads a remainder of 1-3 weights as one 12-byte load,
    so it can read 2 floats past the last weight (compute-sanitizer memcheck on an H100,
    2026-11-23: "Invalid __shared__ read of size 12 bytes" with 5 partitions); the values read are
    never used, but the bytes must be the block's."""
    return 4 * (int(max_parts) + 2)


def choose_partition_size(num_seqs: int, blocks_per_seq: int, max_context_len: int, sm_count: int,
                          num_partitions: int | None = None) -> int:
    """Tokens per split-K partition (pure function; see module docstring)."""
    max_ctx = max(int(max_context_len), 1)
    if num_partitions is not None:
        if int(num_partitions) < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        return max(1, math.ceil(max_ctx / int(num_partitions)))
    p = DEFAULT_PARTITION
    while (p > MIN_PARTITION and p // 2 < max_ctx
           and num_seqs * blocks_per_seq * math.ceil(max_ctx / p) < 2 * sm_count):
        p //= 2
    return p


@dataclass(frozen=True)
class LaunchConfig:
    heads: int  # query heads per thread block (template HEADS)
    chunks: int  # thread blocks per KV head
    grid_x: int  # num_kv_heads * chunks
    partition_size: int
    max_parts: int  # grid z; 1 = single pass (v1), > 1 = split-K + reduce (v2)
    smem_bytes: int


def launch_config(num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int, max_context_len: int,
                  sm_count: int, smem_optin: int, num_partitions: int | None = None) -> LaunchConfig:
    """Grid and shared memory of the attention kernel (pure; the CPU emulation test uses it too)."""
    if num_seqs > MAX_SEQS:  # grid y of both kernels is the sequence
        raise ValueError(f"num_seqs {num_seqs} exceeds {MAX_SEQS}, the grid's y limit; split the batch")
    group = num_heads // num_kv_heads
    heads = heads_per_block(group)
    chunks = -(-group // heads)
    grid_x = num_kv_heads * chunks
    p = choose_partition_size(num_seqs, grid_x, max_context_len, sm_count, num_partitions)
    while smem_bytes(heads, head_dim, p) > smem_optin and p > 1:
        p = -(-p // 2)  # a forced num_partitions is a minimum: split further to fit shared memory
    smem = smem_bytes(heads, head_dim, p)
    if smem > smem_optin:
        raise ValueError(f"head_dim {head_dim} x {heads} heads needs {smem} B of shared memory (> {smem_optin})")
    max_parts = max(1, math.ceil(max(int(max_context_len), 1) / p))
    if max_parts > 12288:  # grid z <= 65535, and the reduce kernel keeps max_parts floats in 48 KiB
        raise ValueError(f"{max_parts} partitions exceed the limit of 12288; use fewer")
    return LaunchConfig(heads, chunks, grid_x, p, max_parts, smem)


_SM_COUNT: dict[int, int] = {}
_SMEM_OPTIN: dict[int, int] = {}


def _device_limits(cp) -> tuple[int, int]:
    dev = cp.cuda.Device().id
    if dev not in _SM_COUNT:
        props = cp.cuda.runtime.getDeviceProperties(dev)
        _SM_COUNT[dev] = int(props["multiProcessorCount"])
        _SMEM_OPTIN[dev] = int(props.get("sharedMemPerBlockOptin", _DEFAULT_SMEM))
    return _SM_COUNT[dev], _SMEM_OPTIN[dev]


class PagedAttentionPlan:
    """Validated launch of one decode-attention call; ``run()`` launches (reusable)."""

    def __init__(self, query, key_cache, value_cache, block_tables, context_lens, block_size: int,
                 max_context_len: int, scale: float | None = None, num_partitions: int | None = None, *,
                 dtype: str | None = None, check: bool = True, contiguous: bool = False):
        import contextlib
        q = wrap(query, "query", dtype)
        self._dtype = dtype
        # torch inputs: every allocation, conversion and launch goes on torch's current stream
        self._stream = torch_stream(q)
        with self._stream if self._stream is not None else contextlib.nullcontext():
            self._setup(q, key_cache, value_cache, block_tables, context_lens, block_size, max_context_len, scale,
                        num_partitions, dtype, check, contiguous)

    def _setup(self, q, key_cache, value_cache, block_tables, context_lens, block_size, max_context_len, scale,
               num_partitions, dtype, check, contiguous):
        import cupy as cp
        k = wrap(key_cache, "key_cache", dtype)
        v = wrap(value_cache, "value_cache", dtype)
        cl = wrap(context_lens, "context_lens", allow_host=True)
        self._q = q
        if q.dtype not in ("float16", "bfloat16"):
            raise TypeError(f"query: dtype must be float16 or bfloat16, got {q.dtype}")
        for w, nm in ((k, "key_cache"), (v, "value_cache")):
            if w.dtype != q.dtype:
                raise TypeError(f"{nm}: dtype {w.dtype} differs from query's {q.dtype}")
            if w.arr.ndim != 4:
                raise ValueError(f"{nm}: expected 4 dims, got shape {w.arr.shape}")
            if not w.arr.flags.c_contiguous:
                raise ValueError(f"{nm}: must be C-contiguous")
            if w.arr.data.ptr % 16:
                raise ValueError(f"{nm}: data must be 16-byte aligned for vector loads")
        if k.arr.shape != v.arr.shape:
            raise ValueError(f"key_cache {k.arr.shape} and value_cache {v.arr.shape} differ")
        if q.arr.ndim != 3:
            raise ValueError(f"query: expected [num_seqs, num_heads, head_dim], got {q.arr.shape}")
        num_seqs, num_heads, head_dim = map(int, q.arr.shape)
        nb, bs, num_kv_heads, hd_k = map(int, k.arr.shape)
        if hd_k != head_dim:
            raise ValueError(f"head_dim: query has {head_dim}, caches have {hd_k}")
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim {head_dim} not compiled; supported: {HEAD_DIMS}")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        max_context_len = int(max_context_len)
        if contiguous:
            if nb != num_seqs:
                raise ValueError(f"contiguous caches: first dim {nb} != num_seqs {num_seqs}")
            kv_seq_stride, block_size = bs, bs
            bt_arr = None
        else:
            kv_seq_stride = 0
            if int(block_size) != bs:
                raise ValueError(f"block_size={block_size} but the caches' second dim is {bs}")
            bt_arr = wrap(block_tables, "block_tables", allow_host=True).arr
            if bt_arr.ndim != 2 or bt_arr.shape[0] != num_seqs:
                raise ValueError(f"block_tables: expected [{num_seqs}, max_blocks_per_seq], got {bt_arr.shape}")
            bt_arr = cp.ascontiguousarray(bt_arr, dtype=cp.int32)
        cl_arr = cl.arr
        if cl_arr.shape != (num_seqs,):
            raise ValueError(f"context_lens: expected shape ({num_seqs},), got {cl_arr.shape}")
        cl_arr = cp.ascontiguousarray(cl_arr, dtype=cp.int32)
        if check:
            lens = cp.asnumpy(cl_arr)
            if len(lens) and lens.min() < 0:
                raise ValueError("context_lens: negative length")
            if len(lens) and lens.max() > max_context_len:
                raise ValueError(f"context_lens: {int(lens.max())} > max_context_len={max_context_len}")
            if contiguous:
                if len(lens) and lens.max() > kv_seq_stride:
                    raise ValueError(f"context_lens: {int(lens.max())} > cache length {kv_seq_stride}")
            else:
                need = -(-lens // bs)
                if len(lens) and need.max() > bt_arr.shape[1]:
                    raise ValueError(f"block_tables: a sequence needs {int(need.max())} blocks, "
                                     f"table has {bt_arr.shape[1]} columns")
                tab = cp.asnumpy(bt_arr)
                used = np.arange(tab.shape[1])[None, :] < need[:, None]
                if used.any() and (tab[used].min() < 0 or tab[used].max() >= nb):
                    raise ValueError(f"block_tables: a used entry is outside [0, {nb})")

        self.scale = float(1.0 / math.sqrt(head_dim) if scale is None else scale)
        sm_count, smem_optin = _device_limits(cp)
        cfg = launch_config(num_seqs, num_heads, num_kv_heads, head_dim, max_context_len, sm_count, smem_optin,
                            num_partitions)
        heads, grid_x, p, max_parts, smem = (cfg.heads, cfg.grid_x, cfg.partition_size, cfg.max_parts,
                                             cfg.smem_bytes)

        self.kernel = _kernel(attention_kernel_name(q.dtype, head_dim, heads))
        # the kernel object is shared by all plans: only ever raise its opt-in limit
        if smem > _DEFAULT_SMEM and smem > int(self.kernel.max_dynamic_shared_size_bytes or 0):
            self.kernel.max_dynamic_shared_size_bytes = smem
        self.partition_size, self.max_parts, self.heads_per_block = p, max_parts, heads
        self.num_seqs, self.num_heads, self.head_dim = num_seqs, num_heads, head_dim
        self.out = cp.empty((num_seqs, num_heads, head_dim), dtype=q.arr.dtype)
        if max_parts > 1:
            self.exp_sums = cp.empty((num_seqs, num_heads, max_parts), dtype=cp.float32)
            self.max_logits = cp.empty_like(self.exp_sums)
            self.tmp_out = cp.empty((num_seqs, num_heads, max_parts, head_dim), dtype=cp.float32)
            self.reduce = _kernel(reduce_kernel_name(q.dtype))
        else:
            self.exp_sums = self.max_logits = self.tmp_out = cp.empty(1, dtype=cp.float32)
            self.reduce = None
        qa = cp.ascontiguousarray(q.arr)
        shift = int(bs).bit_length() - 1 if bs & (bs - 1) == 0 else -1
        i32 = np.int32
        self._grid = (grid_x, num_seqs, max_parts)
        self._smem = smem
        self._args = (self.out, self.exp_sums, self.max_logits, self.tmp_out, qa, k.arr, v.arr,
                      bt_arr if bt_arr is not None else cl_arr, cl_arr,
                      i32(0 if contiguous else 1), i32(num_heads), i32(num_kv_heads),
                      i32(0 if bt_arr is None else bt_arr.shape[1]), i32(bs), i32(shift if not contiguous else -1),
                      i32(kv_seq_stride), i32(p), i32(max_parts), np.float32(self.scale))
        self._reduce_args = (self.out, self.exp_sums, self.max_logits, self.tmp_out, cl_arr, i32(num_heads),
                             i32(head_dim), i32(p), i32(max_parts))
        self._keep = (q, k, v, cl, block_tables)  # keep inputs alive while the plan exists

    def rebind(self, query, key_cache, value_cache) -> "PagedAttentionPlan":
        """The same launch over other arrays of the planned shapes and dtype: the next layer's query
        and caches under the same block tables and lengths, so a decode step builds one plan, not
        one per layer. Nothing is validated beyond shapes, dtype, contiguity and alignment (no host
        copy); the output buffer is reused, so copy each result out before the next launch."""
        q = wrap(query, "query", self._dtype)
        k = wrap(key_cache, "key_cache", self._dtype)
        v = wrap(value_cache, "value_cache", self._dtype)
        for w, nm, shape in ((q, "query", self._args[4].shape), (k, "key_cache", self._args[5].shape),
                             (v, "value_cache", self._args[6].shape)):
            if w.dtype != self._q.dtype or tuple(w.arr.shape) != tuple(shape):
                raise ValueError(f"rebind: {nm} is {w.dtype} {tuple(w.arr.shape)}, the plan has "
                                 f"{self._q.dtype} {tuple(shape)}")
            if not w.arr.flags.c_contiguous or w.arr.data.ptr % 16:
                raise ValueError(f"rebind: {nm} must be C-contiguous and 16-byte aligned")
        args = list(self._args)
        args[4], args[5], args[6] = q.arr, k.arr, v.arr
        self._args = tuple(args)
        self._q = q
        self._keep = (q, k, v) + self._keep[3:]  # the new inputs stay alive, the tables and lengths too
        return self

    def launch(self) -> None:
        """Enqueue the kernel(s) on the current (or torch's) stream; no allocation, no sync."""
        if self.num_seqs == 0:
            return
        if self._stream is not None:
            with self._stream:
                self._launch()
        else:
            self._launch()

    def _launch(self) -> None:
        self.kernel(self._grid, (NUM_THREADS,), self._args, shared_mem=self._smem)
        if self.reduce is not None:
            self.reduce((self.num_heads, self.num_seqs), (NUM_THREADS,), self._reduce_args,
                        shared_mem=reduce_smem_bytes(self.max_parts))

    def run(self):
        """Launch and return the output (same kind as the query)."""
        self.launch()
        return unwrap(self.out, self._q)


def _kernel(name: str):
    return get_kernel(SRC, name)


def prepare(query, key_cache, value_cache, block_tables, context_lens, block_size, max_context_len,
            scale=None, num_partitions=None, **kw) -> PagedAttentionPlan:
    return PagedAttentionPlan(query, key_cache, value_cache, block_tables, context_lens, block_size,
                              max_context_len, scale, num_partitions, **kw)


def forward(query, key_cache, value_cache, block_tables, context_lens, block_size, max_context_len,
            scale=None, num_partitions=None, *, dtype: str | None = None, check: bool = True):
    """Decode attention over a paged KV cache; see the module docstring."""
    return prepare(query, key_cache, value_cache, block_tables, context_lens, block_size, max_context_len,
                   scale, num_partitions, dtype=dtype, check=check).run()


def prepare_contiguous(query, key, value, context_lens, max_context_len=None, scale=None, num_partitions=None,
                       **kw) -> PagedAttentionPlan:
    """Plan for the contiguous variant: ``key``/``value`` are [num_seqs, max_ctx, num_kv_heads, head_dim]."""
    if max_context_len is None:
        max_context_len = int(key.shape[1])
    return PagedAttentionPlan(query, key, value, None, context_lens, int(key.shape[1]), max_context_len,
                              scale, num_partitions, contiguous=True, **kw)


def forward_contiguous(query, key, value, context_lens, max_context_len=None, scale=None, num_partitions=None,
                       *, dtype: str | None = None, check: bool = True):
    """The same kernel reading a contiguous KV layout (no block table): measures paged overhead."""
    return prepare_contiguous(query, key, value, context_lens, max_context_len, scale, num_partitions,
                              dtype=dtype, check=check).run()
