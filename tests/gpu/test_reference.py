"""CPU tests of the numpy references, the split-K combine math and the case generator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pagesim.gpu import reference as ref
from pagesim.gpu.testing import make_case

BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
HEADS = [(4, 4), (8, 2), (8, 1)]  # MHA, GQA-4, MQA


def naive_attention(case) -> np.ndarray:
    """Independent implementation: flat slot addressing, a Python loop over tokens, online softmax."""
    q = ref.as_f32(case.query, case.dtype).astype(np.float64)
    kflat = ref.as_f32(case.key_cache, case.dtype).reshape(-1, *case.key_cache.shape[2:]).astype(np.float64)
    vflat = ref.as_f32(case.value_cache, case.dtype).reshape(-1, *case.value_cache.shape[2:]).astype(np.float64)
    S, H, D = q.shape
    g = H // kflat.shape[1]
    bs = case.block_size
    out = np.zeros((S, H, D))
    for s in range(S):
        for h in range(H):
            m, l_, acc = -math.inf, 0.0, np.zeros(D)
            for t in range(int(case.context_lens[s])):
                slot = int(case.block_tables[s, t // bs]) * bs + t % bs
                x = float(q[s, h] @ kflat[slot, h // g]) * case.scale
                m_new = max(m, x)
                c = math.exp(m - m_new) if m > -math.inf else 0.0
                p = math.exp(x - m_new)
                l_ = l_ * c + p
                acc = acc * c + p * vflat[slot, h // g]
                m = m_new
            if l_ > 0:
                out[s, h] = acc / l_
    return out.astype(np.float32)


def run_ref(case):
    return ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, case.block_size, case.scale, case.dtype)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("heads", HEADS, ids=["mha", "gqa4", "mqa"])
def test_reference_matches_naive(block_size, heads):
    rng = np.random.default_rng(block_size * 10 + heads[1])
    case = make_case(rng, num_seqs=5, num_heads=heads[0], num_kv_heads=heads[1], head_dim=16,
                     block_size=block_size, max_ctx=min(3 * block_size + 5, 300))
    np.testing.assert_allclose(run_ref(case), naive_attention(case), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reference_dtypes_and_zero_length(dtype):
    rng = np.random.default_rng(1)
    case = make_case(rng, num_seqs=4, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16, max_ctx=70,
                     dtype=dtype)
    assert case.context_lens[2] == 0
    out = run_ref(case)
    assert np.all(out[2] == 0)
    np.testing.assert_allclose(out, naive_attention(case), atol=1e-5, rtol=1e-5)


def test_unused_entries_never_read():
    rng = np.random.default_rng(2)
    a = make_case(rng, num_seqs=3, block_size=8, max_ctx=40, garbage=-1)
    b_tables = a.block_tables.copy()
    need = -(-a.context_lens.astype(int) // 8)
    for s, n in enumerate(need):
        b_tables[s, n:] = 10 ** 6
    o1 = run_ref(a)
    a.block_tables = b_tables
    np.testing.assert_array_equal(o1, run_ref(a))


def test_shared_blocks_are_shared():
    rng = np.random.default_rng(3)
    case = make_case(rng, num_seqs=4, block_size=4, max_ctx=30, lens=[30, 20, 12, 9])
    assert case.block_tables[1, 0] == case.block_tables[0, 0]
    assert case.block_tables[2, 1] == case.block_tables[0, 1]
    # shuffled: physical ids of sequence 0 are not simply 0, 1, 2, ...
    assert list(case.block_tables[0, :8]) != list(range(8))
    np.testing.assert_allclose(run_ref(case), naive_attention(case), atol=1e-5)


@pytest.mark.parametrize("heads", HEADS, ids=["mha", "gqa4", "mqa"])
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_reference_matches_torch_sdpa(heads, block_size):
    pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    case = make_case(rng, num_seqs=4, num_heads=heads[0], num_kv_heads=heads[1], head_dim=64,
                     block_size=block_size, max_ctx=300)
    got = ref.sdpa_ref(case.query, case.key_cache, case.value_cache, case.block_tables, case.context_lens,
                       case.block_size, case.scale, case.dtype)
    np.testing.assert_allclose(run_ref(case), got, atol=1e-5, rtol=1e-4)


def test_contiguous_reference_equals_paged():
    rng = np.random.default_rng(5)
    case = make_case(rng, num_seqs=3, num_heads=4, num_kv_heads=2, head_dim=32, block_size=8, max_ctx=50)
    S, L = 3, 56
    k = np.zeros((S, L, 2, 32), np.float16)
    v = np.zeros_like(k)
    for s in range(S):
        n = int(case.context_lens[s])
        k[s, :n] = ref.gather_kv(case.key_cache, case.block_tables[s], n, 8)
        v[s, :n] = ref.gather_kv(case.value_cache, case.block_tables[s], n, 8)
    np.testing.assert_allclose(ref.contiguous_attention_ref(case.query, k, v, case.context_lens, case.scale),
                               run_ref(case), atol=1e-6)


# ---- split-K combine (the reduce kernel's algorithm) ---------------------------------------
@pytest.mark.parametrize("partition_size", [1, 7, 16, 64, 512, 1000])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (8, 1)])
def test_partition_combine_equals_unpartitioned(partition_size, heads):
    rng = np.random.default_rng(partition_size)
    L, D = 777, 32
    q = rng.standard_normal((heads[0], D)).astype(np.float32) * 3  # peaky softmax
    k = rng.standard_normal((L, heads[1], D)).astype(np.float32)
    v = rng.standard_normal((L, heads[1], D)).astype(np.float32)
    m, l_, o = ref.partition_stats(q, k, v, 0.125, partition_size)
    assert len(m) == math.ceil(L / partition_size)
    np.testing.assert_allclose(ref.combine_partitions(m, l_, o), ref.attention_one(q, k, v, 0.125),
                               atol=1e-5, rtol=1e-5)
    # order-independent, and fp32 partition stats (what the kernel stores) stay within 1e-5
    perm = rng.permutation(len(m))
    m32, l32, o32 = m.astype(np.float32), l_.astype(np.float32), o.astype(np.float32)
    np.testing.assert_allclose(ref.combine_partitions(m32[perm], l32[perm], o32[perm]),
                               ref.attention_one(q, k, v, 0.125), atol=1e-5, rtol=1e-4)


def test_combine_empty_and_single():
    m, l_, o = ref.partition_stats(np.ones((2, 4), np.float32), np.zeros((0, 1, 4), np.float32),
                                   np.zeros((0, 1, 4), np.float32), 1.0, 16)
    assert np.all(ref.combine_partitions(m, l_, o) == 0)


def test_combine_extreme_logits_no_overflow():
    # logits around 1e4 would overflow exp() without the max subtraction
    m = np.array([[1e4], [1e4 - 50.0], [-1e4]])
    l_ = np.array([[2.0], [3.0], [1.0]])
    o = np.array([[[1.0]], [[5.0]], [[9.0]]])
    out = ref.combine_partitions(m, l_, o)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, [[1.0]], atol=1e-6)


# ---- bf16 helpers ---------------------------------------------------------------------------------
def test_bf16_round_trip_and_rne():
    x = np.array([1.0, -2.5, 3.140625, 1e-3, 65504.0, np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(ref.bf16_bits_to_f32(ref.f32_to_bf16_bits(x))[[0, 1, 2, 5, 6]], x[[0, 1, 2, 5, 6]])
    # ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1.0
    assert ref.bf16_bits_to_f32(ref.f32_to_bf16_bits(np.float32(1 + 2 ** -8)))[()] == 1.0
    assert ref.bf16_bits_to_f32(ref.f32_to_bf16_bits(np.float32(1 + 3 * 2 ** -8)))[()] == 1 + 2 ** -6
    assert np.isnan(ref.bf16_bits_to_f32(ref.f32_to_bf16_bits(np.float32(np.nan))))


def test_bf16_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 100
    t = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ref.f32_to_bf16_bits(x), t)


# ---- cache op references ------------------------------------------------------------------------
def test_reshape_and_cache_ref_and_copy_blocks_ref():
    rng = np.random.default_rng(6)
    kc = np.zeros((4, 8, 2, 16), np.float16)
    vc = np.zeros_like(kc)
    key = rng.standard_normal((5, 2, 16)).astype(np.float16)
    val = rng.standard_normal((5, 2, 16)).astype(np.float16)
    slots = np.array([0, 9, -1, 31, 17])
    ref.reshape_and_cache_ref(key, val, kc, vc, slots)
    np.testing.assert_array_equal(kc[0, 0], key[0])
    np.testing.assert_array_equal(kc[1, 1], key[1])
    np.testing.assert_array_equal(vc[3, 7], val[3])
    np.testing.assert_array_equal(kc[2, 1], key[4])
    assert np.count_nonzero(kc.reshape(32, -1).any(axis=1)) == 4  # the -1 slot wrote nothing
    ref.copy_blocks_ref(kc, vc, [[1, 0], [3, 2]])
    np.testing.assert_array_equal(kc[0], kc[1])
    np.testing.assert_array_equal(vc[2], vc[3])
