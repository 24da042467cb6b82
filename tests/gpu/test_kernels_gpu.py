"""GPU tests (marked ``gpu``): the CUDA kernels against the numpy references.

Skipped cleanly without CuPy or a CUDA device (``gpu.device.cuda_available()`` never raises).
Run on a GPU machine with::

    python -m pytest tests/gpu -m gpu -q

Every case uses shuffled (non-contiguous) block tables, shared prefix blocks, ragged lengths
(including 0 and 1) and out-of-range ids in the unused table entries, so a kernel that reads
past a sequence's last block faults (illegal address) instead of passing by luck.
"""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.gpu import reference as ref
from pagesim.gpu.device import cuda_available, torch_cuda_available
from pagesim.gpu.testing import make_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a CUDA device")]

BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
# (num_heads, num_kv_heads): MHA, GQA-4, GQA-8, MQA-8, group 5 (padded chunk), group 16 (two chunks), MQA-32
HEADS = [(4, 4), (8, 2), (32, 4), (8, 1), (10, 2), (16, 1), (32, 1)]
HEAD_IDS = ["mha", "gqa4", "gqa8", "mqa8", "g5", "g16", "mqa32"]
DTYPES = ("float16", "bfloat16")
# the default choice is the tensor-core kernel for GQA (group >= 2) and the simple one for MHA, so
# the block-size grid runs both; the head-dim and split-K grids force each kernel on every case
KERNELS = ("simple", "tensor")


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def upload(cp, case):
    return (cp.asarray(case.query), cp.asarray(case.key_cache), cp.asarray(case.value_cache),
            cp.asarray(case.block_tables), cp.asarray(case.context_lens))


def check_attention(cp, case, num_partitions=None, **kw):
    from pagesim.gpu import paged_attention as pa
    q, kc, vc, bt, cl = upload(cp, case)
    out = pa.forward(q, kc, vc, bt, cl, case.block_size, case.max_context_len, case.scale, num_partitions,
                     dtype=case.dtype, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    got = ref.as_f32(cp.asnumpy(out), case.dtype)
    want = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, case.block_size, case.scale, case.dtype)
    ref.assert_attention_close(got, want, case.dtype)
    assert np.all(got[case.context_lens == 0] == 0)
    return got


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_block_sizes_heads_dtypes(cp, block_size, heads, dtype):
    rng = np.random.default_rng(block_size * 100 + heads[0] + heads[1])
    case = make_case(rng, num_seqs=6, num_heads=heads[0], num_kv_heads=heads[1], head_dim=128,
                     block_size=block_size, max_ctx=min(4 * block_size + 37, 700), dtype=dtype)
    check_attention(cp, case)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (8, 1), (10, 2)], ids=["mha", "gqa4", "mqa8", "g5"])
@pytest.mark.parametrize("head_dim", (64, 80, 96, 128, 256))
@pytest.mark.parametrize("kernel", KERNELS)
def test_head_dims(cp, kernel, head_dim, heads, dtype):
    rng = np.random.default_rng(head_dim + heads[1])
    case = make_case(rng, num_seqs=5, num_heads=heads[0], num_kv_heads=heads[1], head_dim=head_dim,
                     block_size=16, max_ctx=300, dtype=dtype)
    check_attention(cp, case, kernel=kernel)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_partitions", [None, 2, 7, 64])
@pytest.mark.parametrize("heads", [(8, 8), (32, 8), (8, 1)], ids=["mha", "gqa4", "mqa8"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_split_k_long_context(cp, kernel, heads, num_partitions, dtype):
    rng = np.random.default_rng(11)
    case = make_case(rng, num_seqs=3, num_heads=heads[0], num_kv_heads=heads[1], head_dim=128, block_size=16,
                     lens=[20000, 777, 4097], dtype=dtype)
    got = check_attention(cp, case, num_partitions, kernel=kernel)
    # the check would see a kernel that drops the last 1,024 tokens of the 20,000-token row
    short = case.context_lens.copy()
    short[0] -= 1024
    want_short = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables, short,
                                         case.block_size, case.scale, case.dtype)
    with pytest.raises(AssertionError):
        ref.assert_attention_close(want_short, ref.paged_attention_ref(
            case.query, case.key_cache, case.value_cache, case.block_tables, case.context_lens, case.block_size,
            case.scale, case.dtype), case.dtype)
    assert got.shape == want_short.shape


def test_v1_and_v2_agree(cp):
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(12)
    case = make_case(rng, num_seqs=4, num_heads=8, num_kv_heads=8, head_dim=128, block_size=16, max_ctx=2000)
    q, kc, vc, bt, cl = upload(cp, case)
    one = pa.prepare(q, kc, vc, bt, cl, 16, case.max_context_len, num_partitions=1)
    many = pa.prepare(q, kc, vc, bt, cl, 16, case.max_context_len, num_partitions=16)
    assert one.max_parts == 1 and one.reduce is None and many.max_parts == 16
    np.testing.assert_allclose(cp.asnumpy(one.run()).astype(np.float32),
                               cp.asnumpy(many.run()).astype(np.float32), atol=2e-3, rtol=2e-3)


def test_forced_single_partition_on_long_context_still_fits(cp):
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(25)
    case = make_case(rng, num_seqs=2, num_heads=8, num_kv_heads=1, head_dim=128, block_size=16, lens=[60000, 3])
    plan = pa.prepare(*upload(cp, case), 16, case.max_context_len, num_partitions=1, kernel="simple")
    assert plan.max_parts > 1  # split further: 8 heads x 60000 logits do not fit in shared memory
    check_attention(cp, case, num_partitions=1, kernel="simple")
    check_attention(cp, case, num_partitions=1, kernel="tensor")  # online softmax: one partition of 60000


def test_default_partitioning_small_batch_long_context(cp):
    rng = np.random.default_rng(13)
    case = make_case(rng, num_seqs=1, num_heads=32, num_kv_heads=8, head_dim=128, block_size=16, lens=[32768])
    check_attention(cp, case)


def test_unused_entries_minus_one_and_scale(cp):
    rng = np.random.default_rng(14)
    case = make_case(rng, num_seqs=5, num_heads=8, num_kv_heads=2, head_dim=64, block_size=32, max_ctx=200,
                     garbage=-1, scale=0.3)
    check_attention(cp, case)


def test_all_empty_and_no_sequences(cp):
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(15)
    case = make_case(rng, num_seqs=3, num_heads=4, num_kv_heads=4, head_dim=64, block_size=16, lens=[0, 0, 0])
    q, kc, vc, bt, cl = upload(cp, case)
    out = pa.forward(q, kc, vc, bt, cl, 16, 0)
    assert np.all(cp.asnumpy(out) == 0)
    out = pa.forward(q[:0], kc, vc, bt[:0], cl[:0], 16, 0)
    assert out.shape == (0, 4, 64)


def test_input_validation(cp):
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(16)
    case = make_case(rng, num_seqs=3, num_heads=4, num_kv_heads=4, head_dim=64, block_size=16, max_ctx=100)
    q, kc, vc, bt, cl = upload(cp, case)
    with pytest.raises(ValueError, match="max_context_len"):
        pa.forward(q, kc, vc, bt, cl, 16, case.max_context_len - 1)
    with pytest.raises(ValueError, match="block_size"):
        pa.forward(q, kc, vc, bt, cl, 8, case.max_context_len)
    with pytest.raises(ValueError, match="head_dim"):
        pa.forward(cp.ascontiguousarray(q[:, :, :48]), cp.ascontiguousarray(kc[..., :48]),
                   cp.ascontiguousarray(vc[..., :48]), bt, cl, 16, case.max_context_len)
    with pytest.raises(ValueError, match="C-contiguous"):
        pa.forward(q, kc[:, ::-1], vc, bt, cl, 16, case.max_context_len)
    with pytest.raises(TypeError, match="bfloat16"):
        pa.forward(q.view(cp.uint16), kc.view(cp.uint16), vc.view(cp.uint16), bt, cl, 16, case.max_context_len)
    bad = bt.copy()
    bad[0, 0] = 10 ** 6
    with pytest.raises(ValueError, match="outside"):
        pa.forward(q, kc, vc, bad, cl, 16, case.max_context_len)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(8, 8), (32, 8)], ids=["mha", "gqa4"])
def test_contiguous_variant(cp, heads, dtype):
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(17)
    S, L, D = 4, 1500, 128
    lens = np.array([1500, 1, 0, 999], np.int32)
    q = ref.round_to(rng.standard_normal((S, heads[0], D), dtype=np.float32), dtype)
    k = ref.round_to(rng.standard_normal((S, L, heads[1], D), dtype=np.float32), dtype)
    v = ref.round_to(rng.standard_normal((S, L, heads[1], D), dtype=np.float32), dtype)
    out = pa.forward_contiguous(cp.asarray(q), cp.asarray(k), cp.asarray(v), cp.asarray(lens), dtype=dtype)
    want = ref.contiguous_attention_ref(q, k, v, lens, dtype=dtype)
    ref.assert_attention_close(ref.as_f32(cp.asnumpy(out), dtype), want, dtype)


# ---- torch tensors through DLPack ---------------------------------------------------------------
@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_tensors_zero_copy(cp, dtype):
    import torch
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(18)
    case = make_case(rng, num_seqs=4, num_heads=32, num_kv_heads=8, head_dim=128, block_size=16, max_ctx=900,
                     dtype=dtype)
    tdt = torch.float16 if dtype == "float16" else torch.bfloat16

    def t(x):
        if dtype == "bfloat16" and x.dtype == np.uint16:
            return torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)
        return torch.from_numpy(x).cuda()

    q, kc, vc = t(case.query), t(case.key_cache), t(case.value_cache)
    bt, cl = t(case.block_tables), t(case.context_lens)
    out = pa.forward(q, kc, vc, bt, cl, 16, case.max_context_len)
    assert isinstance(out, torch.Tensor) and out.dtype == tdt and out.device == q.device
    want = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, 16, case.scale, dtype)
    ref.assert_attention_close(out.float().cpu().numpy(), want, dtype)
    # zero copy: the kernel read torch's memory (a change in torch is seen by the next call)
    kc.zero_()
    vc.zero_()
    out2 = pa.forward(q, kc, vc, bt, cl, 16, case.max_context_len)
    assert float(out2.abs().max()) == 0.0


@pytest.mark.skipif(not torch_cuda_available(), reason="needs torch with CUDA")
def test_matches_torch_sdpa_on_gpu(cp):
    import torch
    import torch.nn.functional as F
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(19)
    case = make_case(rng, num_seqs=3, num_heads=32, num_kv_heads=8, head_dim=128, block_size=16, lens=[3000, 64, 1])
    out = pa.forward(*upload(cp, case), 16, case.max_context_len)
    got = cp.asnumpy(out).astype(np.float32)
    for s, L in enumerate(case.context_lens):
        k = torch.from_numpy(ref.gather_kv(case.key_cache, case.block_tables[s], int(L), 16)).cuda().transpose(0, 1)
        v = torch.from_numpy(ref.gather_kv(case.value_cache, case.block_tables[s], int(L), 16)).cuda().transpose(0, 1)
        q = torch.from_numpy(case.query[s]).cuda()[None, :, None, :]
        o = F.scaled_dot_product_attention(q, k[None].repeat_interleave(4, 1), v[None].repeat_interleave(4, 1))
        np.testing.assert_allclose(got[s], o[0, :, 0].float().cpu().numpy(), atol=1e-2, rtol=1e-2)


# ---- cache ops --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_reshape_and_cache(cp, dtype, index_dtype, head_dim):
    from pagesim.gpu.cache_ops import reshape_and_cache
    rng = np.random.default_rng(20)
    nb, bs, kvh, n = 12, 16, 4, 40
    kc = ref.round_to(rng.standard_normal((nb, bs, kvh, head_dim), dtype=np.float32), dtype)
    vc = ref.round_to(rng.standard_normal((nb, bs, kvh, head_dim), dtype=np.float32), dtype)
    key = ref.round_to(rng.standard_normal((n, kvh, head_dim), dtype=np.float32), dtype)
    val = ref.round_to(rng.standard_normal((n, kvh, head_dim), dtype=np.float32), dtype)
    slots = rng.permutation(nb * bs)[:n].astype(index_dtype)
    slots[::7] = -1
    dkc, dvc = cp.asarray(kc), cp.asarray(vc)
    reshape_and_cache(cp.asarray(key), cp.asarray(val), dkc, dvc, cp.asarray(slots))
    ref.reshape_and_cache_ref(key, val, kc, vc, slots)
    np.testing.assert_array_equal(cp.asnumpy(dkc), kc)
    np.testing.assert_array_equal(cp.asnumpy(dvc), vc)


def test_reshape_and_cache_strided_rows(cp):
    """key/value as slices of a fused QKV output: token stride > row size."""
    from pagesim.gpu.cache_ops import reshape_and_cache
    rng = np.random.default_rng(21)
    nb, bs, kvh, D, n = 4, 8, 2, 64, 10
    qkv = rng.standard_normal((n, 8, D)).astype(np.float16)  # 4 q heads + 2 k + 2 v
    kc = np.zeros((nb, bs, kvh, D), np.float16)
    vc = np.zeros_like(kc)
    slots = np.arange(n, dtype=np.int64) * 3
    dqkv = cp.asarray(qkv)
    dkc, dvc = cp.asarray(kc), cp.asarray(vc)
    reshape_and_cache(dqkv[:, 4:6], dqkv[:, 6:8], dkc, dvc, slots)
    ref.reshape_and_cache_ref(qkv[:, 4:6], qkv[:, 6:8], kc, vc, slots)
    np.testing.assert_array_equal(cp.asnumpy(dkc), kc)
    np.testing.assert_array_equal(cp.asnumpy(dvc), vc)


def test_copy_blocks(cp):
    from pagesim.gpu.cache_ops import copy_blocks
    rng = np.random.default_rng(22)
    kc = rng.standard_normal((10, 16, 2, 128)).astype(np.float16)
    vc = rng.standard_normal((10, 16, 2, 128)).astype(np.float16)
    mapping = np.array([[0, 5], [0, 6], [3, 9], [2, 1]])
    dkc, dvc = cp.asarray(kc), cp.asarray(vc)
    copy_blocks(dkc, dvc, mapping)
    ref.copy_blocks_ref(kc, vc, mapping)
    np.testing.assert_array_equal(cp.asnumpy(dkc), kc)
    np.testing.assert_array_equal(cp.asnumpy(dvc), vc)
    with pytest.raises(ValueError, match="destinations"):
        copy_blocks(dkc, dvc, [[0, 5], [5, 6]])
    with pytest.raises(ValueError, match="destinations"):
        copy_blocks(dkc, dvc, [[0, 5], [1, 5]])


def test_swap_round_trip(cp):
    from pagesim.gpu.cache_ops import empty_pinned_cache, swap_blocks
    rng = np.random.default_rng(23)
    dev = cp.asarray(rng.standard_normal((16, 16, 4, 128)).astype(np.float16))
    host = empty_pinned_cache((8, 16, 4, 128), np.float16)
    out_map = np.array([[3, 0], [4, 1], [5, 2], [11, 7], [0, 3]])  # includes a run of 3
    swap_blocks(dev, host, out_map)
    cp.cuda.get_current_stream().synchronize()
    d = cp.asnumpy(dev)
    for s, t in out_map:
        np.testing.assert_array_equal(host[t], d[s])
    back = cp.zeros_like(dev)
    in_map = np.array([[0, 9], [1, 10], [2, 11], [7, 1], [3, 15]])
    swap_blocks(host, back, in_map)
    cp.cuda.get_current_stream().synchronize()
    b = cp.asnumpy(back)
    for s, t in in_map:
        np.testing.assert_array_equal(b[t], host[s])
    np.testing.assert_array_equal(b[9:12], d[3:6])
    assert np.all(b[[0, 2, 8]] == 0)


def test_bench_and_calibrate_quick_smoke(cp, tmp_path, monkeypatch):
    """The CLI paths run end to end on a tiny grid (full runs: pagesim gpu bench / calibrate)."""
    from pagesim.gpu import bench
    p = bench.Point(2, 256, 16, 8, 2, 128, "float16")
    timer = bench.Timer(cp, 1 << 20)
    row = bench.run_point(cp, p, timer, bench.copy_gbps(cp, timer, 1 << 26), 3, "test")
    assert row["time_us"] > 0 and row["contiguous_time_us"] > 0 and 0 < row["frac_of_copy"]
    # GQA (8/2): the tensor-core kernel measured, the simple one beside it
    assert row["kernel"] == "tensor" and row["stages"] in (2, 3)
    assert row["simple_time_us"] > 0 and row["simple_partitions"] >= 1
    if torch_cuda_available():
        from pagesim.gpu.calibrate import run
        from pagesim.sim.cost.profile_format import read_profile
        import pagesim.gpu.calibrate as cal
        for k, v in dict(batch=(1, 4), context=(128,), tokens=(1, 16), prefill=(64,)).items():
            monkeypatch.setitem(cal.QUICK, k, v)
        out = run("llama-2-7b", tmp_path / "p.csv", quick=True, reps=2, log=lambda *a: None)
        df = read_profile(out)
        assert set(df["component"]) == {"linear", "attn_decode", "attn_prefill", "overhead"}


def test_tensor_kernel_occupancy_and_split_k_sizing(cp):
    """The tensor plan asks the driver how many of its blocks an SM holds (registers and shared
    memory of the compiled kernel) and sizes its partitions with tc_partition_size from that."""
    from pagesim.gpu import paged_attention as pa
    case = make_case(np.random.default_rng(26), num_seqs=4, num_heads=32, num_kv_heads=8, head_dim=128,
                     block_size=16, lens=[8000, 100, 100, 100])
    plan = pa.prepare(*upload(cp, case), 16, case.max_context_len, kernel="tensor")
    sm_count = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"]
    assert 1 <= plan.blocks_per_sm <= 16
    assert plan.partition_size == pa.tc_partition_size(case.context_lens, 8, plan.blocks_per_sm, sm_count)
    check_attention(cp, case, kernel="tensor")
