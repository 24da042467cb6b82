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
* Split-K: the context is cut in partitions of ``partition_size`` tokens (512, or the power of two
  that holds a shorter context, halved (not below 64) while the grid has fewer than
  ``FILL_BLOCKS_PER_SM`` blocks an SM; then the longest context cut in that many equal parts,
  which may be shorter than 64: 100 tokens in 50 + 50);
  one partition -> single kernel
  (v1), several -> per-partition (max, sum, partial out) + a reduce kernel (v2 / FlashDecoding).
  ``num_partitions`` forces ceil(max_context_len / num_partitions)-token partitions (a
  minimum: partitions are halved further if their logits would not fit in shared memory,
  e.g. num_partitions=1 on a very long context).

* Two kernels (``kernel=``): ``"simple"`` (``paged_attention.cu``: query heads on CUDA cores, up
  to 8 per block; the reference, and MHA's kernel) and ``"tensor"`` (``paged_attention_tc.cu``:
  the query heads of a KV head's group as the 16 rows of ``mma.m16n8k16`` tensor-core fragments,
  a cp.async K/V pipeline; needs compute capability 8.0). ``"auto"`` (default; see
  ``choose_kernel``) takes the tensor kernel for GQA/MQA (group >= 2) where it fits, the simple one
  otherwise. The environment variable ``PAGESIM_ATTENTION_KERNEL`` (auto / simple / tensor) sets
  the default, so a whole validation run can be forced to either kernel. The tensor kernel's
  split-K partitions are sized from its occupancy and the real context lengths
  (``tc_partition_size``).

``host_context_lens``: the lengths on the host where the caller has them and passes device ones
(``check=False``), so the tensor kernel's partitions follow the real lengths without a copy back.

``prepare(...)`` returns a :class:`PagedAttentionPlan` whose ``run()`` only launches (the
benchmark and the executor use it to keep Python overhead out of the timed region).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagesim.gpu._arrays import torch_stream, unwrap, wrap
from pagesim.gpu._loader import get_kernel
import os

from pagesim.gpu.kernels_src import (HEAD_DIMS, NUM_THREADS, TC_ROWS, TC_STAGES, TC_TILE, attention_kernel_name,
                                     heads_per_block, reduce_kernel_name, tc_kernel_name)

SRC = "paged_attention.cu"
TC_SRC = "paged_attention_tc.cu"
KERNELS = ("auto", "simple", "tensor")
KERNEL_ENV = "PAGESIM_ATTENTION_KERNEL"
#: the tensor kernel's smallest partition: a block's fixed work (16 query rows in, a 16-row partial
#: output of fp32 out: 16 * head_dim * 4 B) stays <= 1/16 of the K/V it reads (256 tokens * head_dim
#: * 2 * 2 B = 64 * head_dim B), and it is 4 pipelined tiles of 64 tokens
TC_MIN_PARTITION = 256
#: a tensor-kernel block's fixed cost in tokens of its walk, for the partition rule (tc_partition_size):
#: one 64-token tile, the order of its pipeline's fill (a memory latency before the first tile is
#: computed) and of its 16 query rows in and partial rows out. An estimate, not a measurement: the GPU
#: programme's sweep times the partitions it gives.
TC_BLOCK_OVERHEAD = TC_TILE
TC_MIN_CAPABILITY = 80  # mma.m16n8k16 with bf16, cp.async: sm_80 and newer
DEFAULT_PARTITION = 512
MIN_PARTITION = 64
#: the simple kernel's partitions are halved while the grid has fewer blocks than this per SM. A
#: block walks its partition's tokens one after another, and at decode sizes the kernel waits on
#: that walk, not on memory: on the H200 of 2026-11-27 the llama-2-7b runner's decode steps (CUDA
#: graphs, MHA) ran over the table model by 1.9-2.7 ms per thousand tokens of the longest block's
#: walk (min(partition, longest context)), a fit that left 0.10-0.14 ms of 0.75-0.99 ms of median
#: error (benchmarks/results/2026-11-27-h200/session2). 2 blocks an SM (the rule before) left
#: partitions of 512 tokens at 8 sequences; 8 cut them to 128 (a block's 5 to 8 resident neighbours
#: fill an SM's memory pipe in its place).
FILL_BLOCKS_PER_SM = 8
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
    # from the smallest power of two that holds the context in one partition (at most the default),
    # halved while the grid has under FILL_BLOCKS_PER_SM blocks an SM: a short context splits too.
    # Stopping at the first halving that did not add a partition left one sequence of 256 tokens in one
    # 512-token partition, 1.14 ms a step of 32 layers on the H100 of 2026-11-26, against 0.62 ms
    # for 300 tokens split in five (benchmarks/results/2026-11-26-h100-80gb-hbm3/session2)
    p = min(DEFAULT_PARTITION, 1 << max(0, (max_ctx - 1).bit_length()))
    target = FILL_BLOCKS_PER_SM * sm_count
    while p > MIN_PARTITION and num_seqs * blocks_per_seq * math.ceil(max_ctx / p) < target:
        p //= 2
    # then the same number of partitions made equal: the longest walk is the step's, and 600 tokens
    # in 512 + 88 took 112 us a layer at 32 sequences where 300 + 300 took 93 (the H200 of
    # 2026-11-27, benchmarks/results/2026-11-27-h200/session2/partition-rule)
    return math.ceil(max_ctx / math.ceil(max_ctx / p))


def tc_smem_bytes(head_dim: int, stages: int) -> int:
    """Dynamic shared memory of the tensor kernel with ``stages`` pipeline stages (pa_tc_smem_bytes in
    paged_attention_tc.cu; the emulation refuses a launch with less): the 16 query rows, then for each
    of the 4 warps ``stages`` tiles of 16 tokens' K and V rows, every row padded by 8 elements."""
    pitch = head_dim + 8
    return 2 * (TC_ROWS * pitch + 4 * stages * 2 * (TC_TILE // 4) * pitch)


def tc_choose_stages(blocks_per_sm: dict[int, int]) -> int:
    """The tensor kernel's pipeline stages, from ``{stages: resident blocks an SM}`` (the occupancy
    query of each instantiation that fits the device; pure): the most copies in flight an SM, blocks
    x (stages - 1) warp tiles a warp, the fewer stages (more warps to hide the arithmetic) on a tie.
    An H100 or H200 (228 KiB an SM) at head_dim 128: 2 stages 3 blocks (3 tiles a warp in flight),
    3 stages 2 blocks (4): 3; an A100 (164 KiB): 2 blocks or 1, 2 tiles either way: 2; an L40S or
    RTX 4090 (99 KiB a block): 2 stages alone fit."""
    if not blocks_per_sm:
        raise ValueError("tc_choose_stages: no instantiation fits the device")
    return max(sorted(blocks_per_sm), key=lambda s: (blocks_per_sm[s] * (s - 1), -s))


def choose_kernel(group: int, head_dim: int, smem_optin: int, capability: int, kernel: str = "auto") -> str:
    """"simple" or "tensor" for a group of ``group`` query heads per KV head.

    auto: the tensor kernel when group >= 2, the device has mma.m16n8k16 for fp16 and bf16
    (capability >= 8.0) and its shared memory fits. Why group >= 2: the simple kernel does one
    CUDA-core dot product per query head for each K/V element it reads, so its arithmetic grows with
    the group and it fell behind memory at groups 4-8 (H100, 2026-11-23: GQA 0.69 of copy bandwidth,
    MHA 0.98); one mma instruction covers up to 16 heads for the same bytes. For MHA (group 1) 15 of
    the 16 fragment rows would be padding and the simple kernel already streams at the copy's speed.
    A forced "tensor" that the device cannot run is an error, not a silent fallback."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    need = tc_smem_bytes(head_dim, min(TC_STAGES))
    fits = capability >= TC_MIN_CAPABILITY and need <= smem_optin
    if kernel == "tensor" and not fits:
        raise ValueError(f"kernel='tensor' needs compute capability >= 8.0 and {need} B of "
                         f"shared memory (device: {capability / 10:.1f}, {smem_optin} B)")
    if kernel == "auto":
        return "tensor" if group >= 2 and fits else "simple"
    return kernel


def default_kernel() -> str:
    """The kernel choice when a caller names none: ``PAGESIM_ATTENTION_KERNEL`` or "auto"."""
    k = os.environ.get(KERNEL_ENV, "auto") or "auto"
    if k not in KERNELS:
        raise ValueError(f"{KERNEL_ENV} must be one of {', '.join(KERNELS)}, got {k!r}")
    return k


def tc_partition_size(context_lens, grid_x: int, blocks_per_sm: int, sm_count: int) -> int:
    """Tokens per split-K partition of the tensor kernel (pure): the partition, in whole 64-token
    tiles, that gives the shortest estimated kernel time over the real context lengths.

    ``blocks_per_sm * sm_count`` blocks run at once (blocks_per_sm: the occupancy query on the
    compiled kernel), a wave; each row of ``len`` tokens takes ``ceil(len / p)`` blocks for each of
    the ``grid_x`` KV heads and chunks, a block walking its tokens plus ``TC_BLOCK_OVERHEAD``. The
    estimate is whole waves of the longest block's walk, as many as the work fills: 512 blocks of
    8,192 tokens on 396 slots take two walks where 1.29 are work (the last wave's idle slots cost
    as much as busy ones), so 1,536 blocks of 2,752 tokens (3.85 waves, 4 short walks) are quicker;
    on 264 slots the same 512 blocks are 1.94 waves of work and one partition a row is best. The
    candidates cut the longest row in 1, 2, 3, ... equal parts, each at least TC_MIN_PARTITION (a
    row no longer than that: one partition); on a tie the larger partition (fewer partial rows to
    reduce)."""
    lens = np.maximum(np.asarray([int(x) for x in context_lens], dtype=np.int64), 0)
    longest = int(lens.max()) if len(lens) else 0
    whole = -(-max(longest, 1) // TC_TILE) * TC_TILE  # the longest row in one partition
    if whole <= TC_MIN_PARTITION:
        return whole
    slots = max(1, int(blocks_per_sm)) * max(1, int(sm_count))
    cuts = np.arange(1, -(-longest // TC_MIN_PARTITION) + 1)
    p = np.unique(np.maximum(-(-(-(-longest // cuts)) // TC_TILE) * TC_TILE, TC_MIN_PARTITION))[::-1]
    blocks = -(-lens[None, :] // p[:, None])  # [candidate, row]
    work = max(1, int(grid_x)) * (lens.sum() + blocks.sum(axis=1) * TC_BLOCK_OVERHEAD)
    walk = np.minimum(p, longest) + TC_BLOCK_OVERHEAD
    estimate = np.ceil(work / (slots * walk)) * walk
    return int(p[int(np.argmin(estimate))])  # (the first minimum: the largest partition of a tie)


@dataclass(frozen=True)
class LaunchConfig:
    heads: int  # query heads per thread block (template HEADS; 16 for the tensor kernel)
    chunks: int  # thread blocks per KV head
    grid_x: int  # num_kv_heads * chunks
    partition_size: int
    max_parts: int  # grid z; 1 = single pass (v1), > 1 = split-K + reduce (v2)
    smem_bytes: int
    kernel: str = "simple"  # "simple" (paged_attention.cu) or "tensor" (paged_attention_tc.cu)
    stages: int = 0  # the tensor kernel's pipeline stages (0: the simple kernel)


def launch_config(num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int, max_context_len: int,
                  sm_count: int, smem_optin: int, num_partitions: int | None = None, *, kernel: str = "simple",
                  blocks_per_sm: int = 1, context_lens=None, stages: int = min(TC_STAGES)) -> LaunchConfig:
    """Grid and shared memory of the attention kernel (pure; the CPU emulation test uses it too).
    ``kernel``: "simple" or "tensor" (resolved: see choose_kernel). The tensor kernel's partitions
    come from ``tc_partition_size`` over ``context_lens`` (every sequence at ``max_context_len``
    when not given) and ``blocks_per_sm`` (its instantiation's with ``stages``: tc_choose_stages)."""
    if num_seqs > MAX_SEQS:  # grid y of both kernels is the sequence
        raise ValueError(f"num_seqs {num_seqs} exceeds {MAX_SEQS}, the grid's y limit; split the batch")
    group = num_heads // num_kv_heads
    if kernel == "tensor":
        chunks = -(-group // TC_ROWS)
        grid_x = num_kv_heads * chunks
        max_ctx = max(int(max_context_len), 1)
        if num_partitions is not None:
            p = choose_partition_size(num_seqs, grid_x, max_ctx, sm_count, num_partitions)
        else:
            lens = [max_ctx] * num_seqs if context_lens is None else context_lens
            p = tc_partition_size(lens, grid_x, blocks_per_sm, sm_count)
        if stages not in TC_STAGES:
            raise ValueError(f"the tensor kernel's stages must be one of {TC_STAGES}, got {stages}")
        smem = tc_smem_bytes(head_dim, stages)
        if smem > smem_optin:
            raise ValueError(f"the tensor kernel at head_dim {head_dim} with {stages} stages needs {smem} B of "
                             f"shared memory (> {smem_optin})")
        max_parts = max(1, math.ceil(max_ctx / p))
        if max_parts > 12288:
            raise ValueError(f"{max_parts} partitions exceed the limit of 12288; use fewer")
        return LaunchConfig(TC_ROWS, chunks, grid_x, p, max_parts, smem, "tensor", stages)
    if kernel != "simple":
        raise ValueError(f"launch_config: kernel must be 'simple' or 'tensor', got {kernel!r}")
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
_CAPABILITY: dict[int, int] = {}
_BLOCKS_PER_SM: dict[tuple[str, int], int] = {}


def _device_limits(cp) -> tuple[int, int]:
    dev = cp.cuda.Device().id
    if dev not in _SM_COUNT:
        props = cp.cuda.runtime.getDeviceProperties(dev)
        _SM_COUNT[dev] = int(props["multiProcessorCount"])
        _SMEM_OPTIN[dev] = int(props.get("sharedMemPerBlockOptin", _DEFAULT_SMEM))
        _CAPABILITY[dev] = 10 * int(props.get("major", 0)) + int(props.get("minor", 0))
    return _SM_COUNT[dev], _SMEM_OPTIN[dev]


def _capability(cp) -> int:
    _device_limits(cp)
    return _CAPABILITY[cp.cuda.Device().id]


def _blocks_per_sm(cp, name: str, kernel, smem: int) -> int:
    """Resident blocks per SM of the compiled kernel at ``smem`` dynamic bytes: the driver's
    occupancy query (it accounts for the kernel's registers and static shared memory)."""
    key = (name, smem)
    if key not in _BLOCKS_PER_SM:
        n = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, NUM_THREADS, smem)
        _BLOCKS_PER_SM[key] = max(1, int(n))
    return _BLOCKS_PER_SM[key]


class PagedAttentionPlan:
    """Validated launch of one decode-attention call; ``run()`` launches (reusable)."""

    def __init__(self, query, key_cache, value_cache, block_tables, context_lens, block_size: int,
                 max_context_len: int, scale: float | None = None, num_partitions: int | None = None, *,
                 dtype: str | None = None, check: bool = True, contiguous: bool = False, kernel: str | None = None,
                 host_context_lens=None, stages: int | None = None):
        import contextlib
        q = wrap(query, "query", dtype)
        self._dtype = dtype
        # torch inputs: every allocation, conversion and launch goes on torch's current stream
        self._stream = torch_stream(q)
        with self._stream if self._stream is not None else contextlib.nullcontext():
            self._setup(q, key_cache, value_cache, block_tables, context_lens, block_size, max_context_len, scale,
                        num_partitions, dtype, check, contiguous, kernel, host_context_lens, stages)

    def _setup(self, q, key_cache, value_cache, block_tables, context_lens, block_size, max_context_len, scale,
               num_partitions, dtype, check, contiguous, kernel, host_context_lens, forced_stages):
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
        # the real lengths on the host where they cost no device->host copy (or check makes one)
        # (``host_context_lens``: a caller's host copy of device lengths; else every row at max_context_len)
        on_host = isinstance(context_lens, (np.ndarray, list, tuple)) and not isinstance(context_lens, cp.ndarray)
        host_lens = np.asarray(context_lens) if on_host else None
        if host_context_lens is not None:
            host_lens = np.asarray(host_context_lens)
        if check:
            lens = host_lens = cp.asnumpy(cl_arr)
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
        which = choose_kernel(num_heads // num_kv_heads, head_dim, smem_optin, _capability(cp),
                              default_kernel() if kernel is None else kernel)
        blocks_per_sm, stages = 1, min(TC_STAGES)
        if forced_stages is not None and which != "tensor":
            raise ValueError(f"stages={forced_stages} is the tensor kernel's, not the {which} one's")
        if which == "tensor":  # each instantiation that fits, its occupancy; the stages by tc_choose_stages
            kernels, occupancy = {}, {}
            for s in TC_STAGES:
                need = tc_smem_bytes(head_dim, s)
                if need <= smem_optin:
                    name = tc_kernel_name(q.dtype, head_dim, s)
                    kernels[s] = get_kernel(TC_SRC, name)
                    _raise_smem_limit(kernels[s], need)
                    occupancy[s] = _blocks_per_sm(cp, name, kernels[s], need)
            stages = tc_choose_stages(occupancy)
            if forced_stages is not None:  # (the sweep times the other count beside the chosen one)
                if forced_stages not in occupancy:
                    raise ValueError(f"stages={forced_stages}: the tensor kernel's instantiations that fit this "
                                     f"device have {sorted(occupancy)}")
                stages = forced_stages
            self.kernel, blocks_per_sm = kernels[stages], occupancy[stages]
        cfg = launch_config(num_seqs, num_heads, num_kv_heads, head_dim, max_context_len, sm_count, smem_optin,
                            num_partitions, kernel=which, blocks_per_sm=blocks_per_sm, context_lens=host_lens,
                            stages=stages)
        heads, grid_x, p, max_parts, smem = (cfg.heads, cfg.grid_x, cfg.partition_size, cfg.max_parts,
                                             cfg.smem_bytes)
        if which == "simple":
            self.kernel = _kernel(attention_kernel_name(q.dtype, head_dim, heads))
            _raise_smem_limit(self.kernel, smem)
        self.kernel_kind, self.blocks_per_sm, self.stages = which, blocks_per_sm, cfg.stages
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


def _raise_smem_limit(kernel, smem: int) -> None:
    """The kernel object is shared by all plans: only ever raise its opt-in limit."""
    if smem > _DEFAULT_SMEM and smem > int(kernel.max_dynamic_shared_size_bytes or 0):
        kernel.max_dynamic_shared_size_bytes = smem


def prepare(query, key_cache, value_cache, block_tables, context_lens, block_size, max_context_len,
            scale=None, num_partitions=None, **kw) -> PagedAttentionPlan:
    return PagedAttentionPlan(query, key_cache, value_cache, block_tables, context_lens, block_size,
                              max_context_len, scale, num_partitions, **kw)


def forward(query, key_cache, value_cache, block_tables, context_lens, block_size, max_context_len,
            scale=None, num_partitions=None, *, dtype: str | None = None, check: bool = True,
            kernel: str | None = None):
    """Decode attention over a paged KV cache; see the module docstring."""
    return prepare(query, key_cache, value_cache, block_tables, context_lens, block_size, max_context_len,
                   scale, num_partitions, dtype=dtype, check=check, kernel=kernel).run()


def prepare_contiguous(query, key, value, context_lens, max_context_len=None, scale=None, num_partitions=None,
                       **kw) -> PagedAttentionPlan:
    """Plan for the contiguous variant: ``key``/``value`` are [num_seqs, max_ctx, num_kv_heads, head_dim]."""
    if max_context_len is None:
        max_context_len = int(key.shape[1])
    return PagedAttentionPlan(query, key, value, None, context_lens, int(key.shape[1]), max_context_len,
                              scale, num_partitions, contiguous=True, **kw)


def forward_contiguous(query, key, value, context_lens, max_context_len=None, scale=None, num_partitions=None,
                       *, dtype: str | None = None, check: bool = True, kernel: str | None = None):
    """The same kernel reading a contiguous KV layout (no block table): measures paged overhead."""
    return prepare_contiguous(query, key, value, context_lens, max_context_len, scale, num_partitions,
                              dtype=dtype, check=check, kernel=kernel).run()
