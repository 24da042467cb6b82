"""Run the *real* CUDA kernel sources on the CPU (tests/gpu/emu/emu.h: one std::thread per CUDA
thread, block barriers for __syncthreads, warp barriers for shuffles) against the numpy
reference, with the launch configuration computed by ``gpu.paged_attention.launch_config``.

This checks the kernels' indexing, partitioning, softmax, GQA chunking, reduce and cache ops
without a GPU. It is a semantic check only (no timing, no memory model beyond barriers), and
covers a subset of the template instantiations (listed in emu_kernels.cpp). Skipped when g++
(C++20) or the CUDA headers are missing.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from gpu import reference as ref
from gpu.paged_attention import launch_config
from gpu.testing import make_case


def P(a):
    return ctypes.c_void_p(a.ctypes.data) if a is not None else ctypes.c_void_p(0)


def emu_attention(lib, case, *, contiguous=None, num_partitions=None, sm_count=132, smem_optin=227 * 1024):
    S, H, D = case.query.shape
    if contiguous is None:
        kc, vc = case.key_cache, case.value_cache
        KVH, bs = kc.shape[2], case.block_size
    else:
        kc, vc = contiguous
        KVH, bs = kc.shape[2], kc.shape[1]
    cfg = launch_config(S, H, KVH, D, case.max_context_len, sm_count, smem_optin, num_partitions)
    out = np.full(case.query.shape, 0x7E00 if case.dtype == "float16" else 0x7FC0, dtype=np.uint16)  # NaN
    es = np.full((S, H, cfg.max_parts), np.nan, np.float32)
    ml, tmp = es.copy(), np.full((S, H, cfg.max_parts, D), np.nan, np.float32)
    bt = np.ascontiguousarray(case.block_tables, dtype=np.int32)
    cl = np.ascontiguousarray(case.context_lens, dtype=np.int32)
    shift = bs.bit_length() - 1 if bs & (bs - 1) == 0 else -1
    q = np.ascontiguousarray(case.query)
    kc, vc = np.ascontiguousarray(kc), np.ascontiguousarray(vc)
    paged = contiguous is None
    dt = 0 if case.dtype == "float16" else 1
    rc = lib.emu_attention_main(
        dt, D, cfg.heads, cfg.grid_x, S, cfg.max_parts, 128, cfg.smem_bytes,
        P(out), P(es), P(ml), P(tmp), P(q), P(kc), P(vc), P(bt if paged else cl), P(cl), int(paged), H, KVH,
        bt.shape[1] if paged else 0, bs, shift if paged else -1, 0 if paged else kc.shape[1], cfg.partition_size,
        cfg.max_parts, ctypes.c_float(case.scale))
    if rc:
        pytest.skip(f"instantiation {case.dtype} D={D} heads={cfg.heads} not in the emulation")
    if cfg.max_parts > 1:
        lib.emu_attention_reduce(dt, H, S, 128, 4 * cfg.max_parts, P(out), P(es), P(ml), P(tmp), P(cl), H, D,
                                 cfg.partition_size, cfg.max_parts)
    got = ref.as_f32(out.view(np.float16) if case.dtype == "float16" else out, case.dtype)
    return got, cfg


def check(lib, case, **kw):
    got, cfg = emu_attention(lib, case, **kw)
    want = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, case.block_size, case.scale, case.dtype)
    np.testing.assert_allclose(got, want, **ref.TOLERANCES[case.dtype])
    return cfg


@pytest.mark.parametrize("block_size", [1, 8, 16, 32, 64, 128, 256])
def test_emulated_block_sizes_gqa(emu, block_size):
    rng = np.random.default_rng(block_size)
    case = make_case(rng, num_seqs=4, num_heads=8, num_kv_heads=1, head_dim=64, block_size=block_size,
                     max_ctx=min(2 * block_size + 21, 300))
    check(emu, case)


@pytest.mark.parametrize("heads,head_dim,dtype", [
    ((4, 4), 64, "float16"), ((4, 2), 64, "float16"), ((8, 2), 64, "float16"), ((10, 2), 64, "float16"),
    ((16, 1), 64, "float16"), ((4, 2), 80, "float16"), ((8, 2), 96, "float16"), ((2, 2), 256, "float16"),
    ((16, 2), 128, "float16"), ((8, 1), 64, "bfloat16"), ((3, 3), 64, "bfloat16"), ((8, 2), 128, "bfloat16")],
    ids=lambda x: str(x))
def test_emulated_heads_dims_dtypes(emu, heads, head_dim, dtype):
    rng = np.random.default_rng(head_dim + heads[0])
    case = make_case(rng, num_seqs=4, num_heads=heads[0], num_kv_heads=heads[1], head_dim=head_dim,
                     block_size=16, max_ctx=150, dtype=dtype)
    check(emu, case)


@pytest.mark.parametrize("num_partitions,sm_count,parts", [(None, 132, 18), (None, 1, 3), (1, 132, 1),
                                                            (3, 132, 3), (40, 132, 40)])
def test_emulated_split_k(emu, num_partitions, sm_count, parts):
    rng = np.random.default_rng(7)
    case = make_case(rng, num_seqs=3, num_heads=2, num_kv_heads=2, head_dim=64, block_size=16,
                     lens=[1100, 0, 130])
    cfg = check(emu, case, num_partitions=num_partitions, sm_count=sm_count)
    assert cfg.max_parts == parts


def test_emulated_forced_split_when_shared_memory_is_short(emu):
    rng = np.random.default_rng(8)
    case = make_case(rng, num_seqs=2, num_heads=8, num_kv_heads=1, head_dim=64, block_size=16, lens=[1300, 5])
    cfg = check(emu, case, num_partitions=1, smem_optin=40 * 1024)
    assert cfg.max_parts > 1


def test_emulated_contiguous_variant(emu):
    rng = np.random.default_rng(9)
    case = make_case(rng, num_seqs=3, num_heads=8, num_kv_heads=1, head_dim=64, block_size=16, lens=[140, 1, 77])
    L = 150
    k = np.zeros((3, L, 1, 64), np.float16)
    v = np.zeros_like(k)
    for s in range(3):
        n = int(case.context_lens[s])
        k[s, :n] = ref.gather_kv(case.key_cache, case.block_tables[s], n, 16)
        v[s, :n] = ref.gather_kv(case.value_cache, case.block_tables[s], n, 16)
    got, _ = emu_attention(emu, case, contiguous=(k, v))
    want = ref.contiguous_attention_ref(case.query, k, v, case.context_lens, case.scale)
    np.testing.assert_allclose(got, want, **ref.TOLERANCES["float16"])


def test_emulated_reshape_and_cache_and_copy_blocks(emu):
    rng = np.random.default_rng(10)
    nb, bs, kvh, D, n = 6, 8, 2, 64, 20
    kc = rng.standard_normal((nb, bs, kvh, D)).astype(np.float16)
    vc = rng.standard_normal((nb, bs, kvh, D)).astype(np.float16)
    key = rng.standard_normal((n, kvh, D)).astype(np.float16)
    val = rng.standard_normal((n, kvh, D)).astype(np.float16)
    slots = rng.permutation(nb * bs)[:n].astype(np.int64)
    slots[::5] = -1
    ekc, evc = kc.copy(), vc.copy()
    row_units = kvh * D * 2 // 16
    ru = ctypes.c_longlong(row_units)
    emu.emu_reshape_and_cache(1, 1, n, 128, P(key), P(val), P(ekc), P(evc), P(slots), ru, ru, ru)
    ref.reshape_and_cache_ref(key, val, kc, vc, slots)
    np.testing.assert_array_equal(ekc, kc)
    np.testing.assert_array_equal(evc, vc)
    mapping = np.array([[0, 3], [2, 4], [2, 5]], np.int64)
    emu.emu_copy_blocks(0, len(mapping), 128, P(ekc), P(evc), P(mapping), ctypes.c_longlong(bs * kvh * D))
    ref.copy_blocks_ref(kc, vc, mapping)
    np.testing.assert_array_equal(ekc, kc)
    np.testing.assert_array_equal(evc, vc)
