"""Run the *real* CUDA kernel sources on the CPU (tests/gpu/emu/emu.h: one std::thread per CUDA
thread, block barriers for __syncthreads, warp barriers for shuffles) against the numpy
reference, with the launch configuration computed by ``gpu.paged_attention.launch_config``.

This checks the kernels' indexing, partitioning, softmax, GQA chunking, reduce and cache ops
without a GPU. It is a semantic check only (no timing, no memory model beyond barriers), and
runs every template instantiation the Python side can launch (``test_every_instantiation``).
Skipped when g++ (C++20) or the CUDA headers are missing.
"""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest

from pagesim.gpu import reference as ref
from pagesim.gpu.kernels_src import CTYPES, HEAD_DIMS, HEADS_PER_BLOCK, heads_per_block
from pagesim.gpu.paged_attention import launch_config
from pagesim.gpu.testing import make_case


def P(a):
    return ctypes.c_void_p(a.ctypes.data) if a is not None else ctypes.c_void_p(0)


def emu_attention(lib, case, *, contiguous=None, num_partitions=None, sm_count=132, smem_optin=227 * 1024,
                  kernel="simple", blocks_per_sm=2, stages=2):
    """``kernel``: "simple" (paged_attention.cu) or "tensor" (paged_attention_tc.cu with ``stages``
    pipeline stages, its partitions sized from ``blocks_per_sm`` and the case's real lengths, as the
    plan sizes them on a GPU)."""
    S, H, D = case.query.shape
    if contiguous is None:
        kc, vc = case.key_cache, case.value_cache
        KVH, bs = kc.shape[2], case.block_size
    else:
        kc, vc = contiguous
        KVH, bs = kc.shape[2], kc.shape[1]
    cfg = launch_config(S, H, KVH, D, case.max_context_len, sm_count, smem_optin, num_partitions, kernel=kernel,
                        blocks_per_sm=blocks_per_sm, context_lens=case.context_lens, stages=stages)
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
    launch = ((lib.emu_attention_main, dt, D, cfg.heads) if kernel == "simple"
              else (lib.emu_attention_tc, dt, D, cfg.stages))
    rc = launch[0](
        *launch[1:], cfg.grid_x, S, cfg.max_parts, 128, cfg.smem_bytes,
        P(out), P(es), P(ml), P(tmp), P(q), P(kc), P(vc), P(bt if paged else cl), P(cl), int(paged), H, KVH,
        bt.shape[1] if paged else 0, bs, shift if paged else -1, 0 if paged else kc.shape[1], cfg.partition_size,
        cfg.max_parts, ctypes.c_float(case.scale))
    assert rc != 3, "the launch's shared memory (tc_smem_bytes) is short of the kernel's (pa_tc_smem_bytes)"
    if rc:
        pytest.skip(f"instantiation {kernel} {case.dtype} D={D} heads={cfg.heads} stages={cfg.stages} "
                    "not in the emulation")
    if cfg.max_parts > 1:
        lib.emu_attention_reduce(dt, H, S, 128, 4 * cfg.max_parts, P(out), P(es), P(ml), P(tmp), P(cl), H, D,
                                 cfg.partition_size, cfg.max_parts)
    got = ref.as_f32(out.view(np.float16) if case.dtype == "float16" else out, case.dtype)
    return got, cfg


def check(lib, case, **kw):
    got, cfg = emu_attention(lib, case, **kw)
    want = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, case.block_size, case.scale, case.dtype)
    ref.assert_attention_close(got, want, case.dtype)
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
    ref.assert_attention_close(got, want, "float16")


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


# (num_heads, num_kv_heads) that select each HEADS template: group 1, group 2, group 3 (a chunk
# of 4 with one padded head), group 12 over 2 KV heads (HEADS 8: two chunks per KV head, the
# second half full, so the chunk -> KV head -> first head mapping is exercised)
HEADS_FOR = {1: (2, 2), 2: (4, 2), 4: (6, 2), 8: (24, 2)}


@pytest.mark.parametrize("dtype", list(CTYPES))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads", HEADS_PER_BLOCK)
def test_every_instantiation(emu, dtype, head_dim, heads):
    num_heads, num_kv_heads = HEADS_FOR[heads]
    assert heads_per_block(num_heads // num_kv_heads) == heads
    rng = np.random.default_rng(head_dim * 10 + heads)
    case = make_case(rng, num_seqs=3, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     block_size=16, max_ctx=45, dtype=dtype)
    cfg = check(emu, case)
    assert cfg.heads == heads


def test_split_k_20000_tokens_and_the_check_sees_1024_dropped(emu):
    rng = np.random.default_rng(11)
    case = make_case(rng, num_seqs=3, num_heads=2, num_kv_heads=2, head_dim=64, block_size=16,
                     lens=[20000, 777, 4097])
    cfg = check(emu, case)
    assert cfg.max_parts > 1
    # a kernel that stops 1,024 tokens short of the long row fails the same check
    lens = case.context_lens.copy()
    lens[0] -= 1024
    short = dataclasses.replace(case, context_lens=lens)  # the same data, the long row 1,024 tokens short
    got_short, _ = emu_attention(emu, short)
    want = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, case.block_size, case.scale, case.dtype)
    with pytest.raises(AssertionError):
        ref.assert_attention_close(got_short, want, case.dtype)
    assert ref.rel_norm_errors(got_short, want)[0] > 20 * ref.REL_NORM_TOL["float16"]


def test_tolerances_are_tied_to_the_observed_error(emu):
    """The bounds stay within 2.5x of what the emulation shows (a loose bound would hide bugs), for
    both kernels (the tensor one: fp16 2.15e-4, bf16 1.75e-3 at most, as the simple one)."""
    errs = {"float16": [], "bfloat16": []}
    for seed, (dtype, h, kv, d) in enumerate([("float16", 8, 2, 64), ("float16", 24, 2, 128),
                                             ("bfloat16", 8, 1, 64), ("bfloat16", 4, 4, 128)]):
        case = make_case(np.random.default_rng(seed), num_seqs=4, num_heads=h, num_kv_heads=kv, head_dim=d,
                         block_size=16, max_ctx=300, dtype=dtype)
        want = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                       case.context_lens, case.block_size, case.scale, dtype)
        live = case.context_lens > 0
        for kernel in ("simple", "tensor"):  # the tensor kernel's P in two 16-bit parts: the same error
            got, _ = emu_attention(emu, case, kernel=kernel)
            errs[dtype] += ref.rel_norm_errors(got, want)[live].tolist()
    for dtype, e in errs.items():
        assert max(e) <= ref.REL_NORM_TOL[dtype] <= 2.5 * max(e), (dtype, max(e))


MAPPING = "    const int kvh = blockIdx.x / chunks;\n"
FIRST_HEAD = "    const int head0 = kvh * group + chunk * HEADS;\n"


RUN_CASE = """
import sys
import numpy as np
from pathlib import Path
from pagesim.gpu.testing import make_case
from tests.gpu.emu.build import build
from tests.gpu.test_emulated_kernels import check
# the mutated sources built once (the first case), loaded by the second
lib, why = build(Path(sys.argv[1]), Path(sys.argv[1]) / "kernels", ("PAGESIM_EMU_FP16_64_ONLY",), reuse=True)
heads, kv_heads = int(sys.argv[2]), int(sys.argv[3])
case = make_case(np.random.default_rng(80), num_seqs=3, num_heads=heads, num_kv_heads=kv_heads, head_dim=64,
                 block_size=16, max_ctx=45)
try:
    check(lib, case)
except AssertionError:
    sys.exit(1)
"""


@pytest.mark.parametrize("bug,fix", [
    (MAPPING, MAPPING.replace("blockIdx.x / chunks", "blockIdx.x % num_kv_heads")),  # chunks interleaved
    (FIRST_HEAD, FIRST_HEAD.replace("kvh * group + chunk * HEADS", "blockIdx.x * HEADS")),  # chunks as if full
], ids=["kv-head-of-chunk", "first-head-of-chunk"])
def test_injected_chunk_mapping_bug_is_caught(emu, tmp_path, bug, fix):
    """A chunk -> KV head mapping bug (group > 8 over several KV heads) fails test_every_instantiation's
    HEADS=8 case (wrong rows, or a crash reading past the heads: run in a subprocess); the group-16
    single-KV-head case the tests had before does not see it."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from pagesim.gpu.kernels_src import KERNEL_DIR
    src = tmp_path / "kernels"
    shutil.copytree(KERNEL_DIR, src)
    text = (src / "paged_attention.cu").read_text()
    assert text.count(bug) == 1
    (src / "paged_attention.cu").write_text(text.replace(bug, fix))
    root = Path(__file__).resolve().parents[2]
    # the tree under test first, then whatever made `pagesim` importable here
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))

    def run(heads, kv_heads, timeout_s):
        """The case's exit code; a run past ``timeout_s`` (the bug reads past the heads: undefined
        behaviour, which can loop on garbage lengths instead of crashing) counts as caught."""
        try:
            return subprocess.run([sys.executable, "-c", RUN_CASE, str(tmp_path), str(heads), str(kv_heads)],
                                  cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return "timed out"

    # a sound run builds and runs in 3-4 s; the buggy one (loading that build) gets 8x that before it counts as caught
    assert run(16, 1, 120) == 0  # the bug passes the old case: one KV head, a group that is a multiple of 8
    assert run(*HEADS_FOR[8], 30) != 0  # and fails the new one
