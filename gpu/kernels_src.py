"""Kernel sources and the exact template instantiations the Python side launches.

CPU-only (no CuPy import): used by :mod:`gpu._loader` (NVRTC through CuPy) and by the nvcc
compile-check test, so both compile the very same name expressions.

Local ``#include "x.cuh"`` lines are inlined textually (once each) so NVRTC needs no include
path for our headers; ``<cuda_fp16.h>`` / ``<cuda_bf16.h>`` are left for NVRTC/nvcc to find.
"""

from __future__ import annotations

import re
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"

#: storage dtypes the kernels take (2-byte) -> C++ type name used in the templates
CTYPES = {"float16": "fp16_t", "bfloat16": "bf16_t"}
#: head dims compiled (multiples of 8; 16-byte vectors)
HEAD_DIMS = (64, 80, 96, 128, 256)
#: query heads per thread block (a KV head's group is split in chunks of at most 8)
HEADS_PER_BLOCK = (1, 2, 4, 8)
NUM_THREADS = 128
#: the tensor-core GQA kernel (paged_attention_tc.cu): query heads per block (the mma's 16 rows),
#: tokens the block's 4 warps take at a time (16 each); its head dims are HEAD_DIMS (multiples of 16)
TC_ROWS = 16
TC_TILE = 64
#: its pipeline's stages, one instantiation each (chosen by each one's occupancy on the device:
#: gpu.paged_attention.tc_choose_stages)
TC_STAGES = (2, 3)

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


def load_source(name: str, _seen: set[str] | None = None) -> str:
    """Text of ``kernels/<name>`` with local includes inlined (each header once)."""
    seen = set() if _seen is None else _seen
    text = (KERNEL_DIR / name).read_text()

    def sub(m: re.Match) -> str:
        inc = m.group(1)
        if inc in seen:
            return f"// (already included: {inc})"
        seen.add(inc)
        return f"// ---- begin {inc}\n{load_source(inc, seen)}\n// ---- end {inc}"

    return _INCLUDE.sub(sub, text).replace("#pragma once", "")


def heads_per_block(group: int) -> int:
    """Query heads one thread block computes for a GQA group of ``group`` heads per KV head."""
    for h in HEADS_PER_BLOCK:
        if group <= h:
            return h
    return HEADS_PER_BLOCK[-1]


def attention_kernel_name(dtype: str, head_dim: int, heads: int) -> str:
    return f"paged_attention_kernel<{CTYPES[dtype]}, {int(head_dim)}, {int(heads)}>"


def tc_kernel_name(dtype: str, head_dim: int, stages: int) -> str:
    return f"paged_attention_tc_kernel<{CTYPES[dtype]}, {int(head_dim)}, {int(stages)}>"


def reduce_kernel_name(dtype: str) -> str:
    return f"paged_attention_reduce_kernel<{CTYPES[dtype]}>"


def reshape_and_cache_name(unit: str, index: str) -> str:
    """unit: 'uint4' or 'unsigned short'; index: 'int' or 'long long'."""
    return f"reshape_and_cache_kernel<{unit}, {index}>"


def copy_blocks_name(unit: str) -> str:
    return f"copy_blocks_kernel<{unit}>"


def fused_kernel_name(kernel: str, dtype: str, index: str | None = None) -> str:
    """kernel: 'fused_add_rms_norm', 'silu_and_mul', or 'rotary_cache' with its slot mapping's index
    type ('int' or 'long long')."""
    return f"{kernel}_kernel<{CTYPES[dtype]}{f', {index}' if index else ''}>"


UNITS = ("uint4", "unsigned short")
INDEX_TYPES = ("int", "long long")


def all_instantiations() -> dict[str, list[str]]:
    """Every name expression the loader may request, per source file."""
    attn = [attention_kernel_name(dt, d, h) for dt in CTYPES for d in HEAD_DIMS for h in HEADS_PER_BLOCK]
    attn += [reduce_kernel_name(dt) for dt in CTYPES]
    cache = [reshape_and_cache_name(u, i) for u in UNITS for i in INDEX_TYPES]
    cache += [copy_blocks_name(u) for u in UNITS]
    fused = [fused_kernel_name(k, dt) for dt in CTYPES for k in ("fused_add_rms_norm", "silu_and_mul")]
    fused += [fused_kernel_name("rotary_cache", dt, i) for dt in CTYPES for i in INDEX_TYPES]
    tc = [tc_kernel_name(dt, d, s) for dt in CTYPES for d in HEAD_DIMS for s in TC_STAGES]
    return {"paged_attention.cu": attn, "paged_attention_tc.cu": tc, "cache_ops.cu": cache, "fused_ops.cu": fused}


def instantiation_unit(source: str, names: list[str]) -> str:
    """A translation unit that includes ``source`` and forces each name to be instantiated
    (taking a kernel template's address instantiates it), for compile checks with nvcc."""
    lines = [f'#include "{source}"', "", "void* pagesim_force_instantiation[] = {"]
    lines += [f"    (void*)&{n}," for n in names]
    lines += ["};", ""]
    return "\n".join(lines)
