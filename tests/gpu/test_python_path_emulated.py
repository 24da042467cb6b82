"""End-to-end CPU test of the Python launch path (``gpu.paged_attention``, ``gpu.cache_ops``,
``pagesim.gpu._loader``) with a fake CuPy whose kernels run the real sources through the emulation.

What a GPU run adds on top: NVRTC compiling the sources (nvcc does in test_kernel_sources),
real device memory, streams and timing.
"""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.gpu import reference as ref
from pagesim.gpu.testing import make_case


def dev(cp, case):
    return (cp.asarray(case.query), cp.asarray(case.key_cache), cp.asarray(case.value_cache),
            cp.asarray(case.block_tables), cp.asarray(case.context_lens))


@pytest.mark.parametrize("heads,dtype,block_size,num_partitions", [
    ((8, 1), "float16", 16, None), ((8, 2), "float16", 1, None), ((8, 2), "float16", 32, 5),
    ((4, 4), "bfloat16", 64, None), ((16, 2), "bfloat16", 16, 3), ((8, 1), "float16", 256, 1)])
@pytest.mark.parametrize("kernel", ["simple", "auto"])
def test_forward_end_to_end(cp, heads, dtype, block_size, num_partitions, kernel):
    """Both kernels; "auto" is the tensor-core one for every GQA case here (group >= 2, the fake
    device is an sm_90), the simple one for MHA."""
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(block_size)
    case = make_case(rng, num_seqs=4, num_heads=heads[0], num_kv_heads=heads[1], head_dim=64,
                     block_size=block_size, max_ctx=min(3 * block_size + 11, 400), dtype=dtype)
    plan = pa.prepare(*dev(cp, case), block_size, case.max_context_len, None, num_partitions, dtype=dtype,
                      kernel=kernel)
    tensor = kernel == "auto" and heads[0] > heads[1]
    assert plan.kernel_kind == ("tensor" if tensor else "simple")
    out = plan.run()
    assert isinstance(out, cp.ndarray) and out.dtype == case.query.dtype
    if num_partitions:
        assert plan.max_parts == num_partitions
    if plan.max_parts > 1:  # the reduce's weights plus the 2 floats ptxas's 12-byte remainder load reads past
        assert plan.reduce.calls[-1][2] == 4 * (plan.max_parts + 2)
    want = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, block_size, case.scale, dtype)
    ref.assert_attention_close(ref.as_f32(np.asarray(out), dtype), want, dtype)
    # the module compiled exactly the instantiation it launched, without local includes
    names = [n for n, _ in cp.compiled]
    prefix = "paged_attention_tc_kernel<" if tensor else "paged_attention_kernel<"
    assert any(n[0].startswith(prefix) for n in names)
    # NVRTC gets -lineinfo, so compute-sanitizer and ncu name the source line of a fault
    assert all("-lineinfo" in opts and "--std=c++14" in opts for _, opts in cp.compiled)


def test_forward_shared_memory_opt_in_and_split(cp):
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(3)
    case = make_case(rng, num_seqs=2, num_heads=8, num_kv_heads=1, head_dim=64, block_size=16, lens=[1500, 7])
    plan = pa.prepare(*dev(cp, case), 16, case.max_context_len, num_partitions=1, kernel="simple")
    assert plan.max_parts == 1 and plan._smem > 48 * 1024  # 8 heads x 1500 logits: needs the opt-in
    out = plan.run()
    assert plan.kernel.max_dynamic_shared_size_bytes == plan._smem
    want = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, 16, case.scale)
    ref.assert_attention_close(np.asarray(out).astype(np.float32), want, "float16")


def test_forward_contiguous_end_to_end(cp):
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(4)
    S, L, D = 3, 200, 64
    lens = np.array([200, 0, 33], np.int32)
    q = rng.standard_normal((S, 8, D)).astype(np.float16)
    k = rng.standard_normal((S, L, 2, D)).astype(np.float16)
    v = rng.standard_normal((S, L, 2, D)).astype(np.float16)
    out = pa.forward_contiguous(cp.asarray(q), cp.asarray(k), cp.asarray(v), lens)
    want = ref.contiguous_attention_ref(q, k, v, lens)
    ref.assert_attention_close(np.asarray(out).astype(np.float32), want, "float16")


def test_forward_validation(cp):
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(5)
    case = make_case(rng, num_seqs=3, num_heads=4, num_kv_heads=4, head_dim=64, block_size=16, max_ctx=60)
    q, kc, vc, bt, cl = dev(cp, case)
    with pytest.raises(ValueError, match="max_context_len"):
        pa.forward(q, kc, vc, bt, cl, 16, case.max_context_len - 1)
    with pytest.raises(TypeError, match="bfloat16"):
        pa.forward(q.view(np.uint16), kc.view(np.uint16), vc.view(np.uint16), bt, cl, 16, case.max_context_len)
    bad = bt.copy()
    bad[0, 0] = 10 ** 6
    with pytest.raises(ValueError, match="outside"):
        pa.forward(q, kc, vc, bad, cl, 16, case.max_context_len)
    out = pa.forward(q[:0], kc, vc, bt[:0], cl[:0], 16, 0)
    assert out.shape == (0, 4, 64)
    z = pa.forward(q, kc, vc, bt, np.zeros(3, np.int32), 16, 0)
    assert np.all(np.asarray(z) == 0)


@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cache_ops_end_to_end(cp, slot_dtype, dtype):
    from pagesim.gpu.cache_ops import copy_blocks, reshape_and_cache, swap_blocks
    rng = np.random.default_rng(6)
    nb, bs, kvh, D, n = 6, 8, 2, 64, 20
    kc = ref.round_to(rng.standard_normal((nb, bs, kvh, D)), dtype)
    vc = ref.round_to(rng.standard_normal((nb, bs, kvh, D)), dtype)
    qkv = ref.round_to(rng.standard_normal((n, 6, D)), dtype)  # fused [q q k k v v]: strided K and V views
    slots = rng.permutation(nb * bs)[:n].astype(slot_dtype)
    slots[::4] = -1
    dkc, dvc, dqkv = cp.asarray(kc), cp.asarray(vc), cp.asarray(qkv)
    reshape_and_cache(dqkv[:, 2:4], dqkv[:, 4:6], dkc, dvc, slots)
    ref.reshape_and_cache_ref(qkv[:, 2:4], qkv[:, 4:6], kc, vc, slots)
    np.testing.assert_array_equal(np.asarray(dkc), kc)
    np.testing.assert_array_equal(np.asarray(dvc), vc)
    # odd row size -> 2-byte units
    k3 = ref.round_to(rng.standard_normal((nb, bs, 1, 8)), dtype)[:, :, :, :3].copy()
    dk3, dv3 = cp.asarray(k3), cp.asarray(k3.copy())
    rows = ref.round_to(rng.standard_normal((4, 1, 3)), dtype)
    reshape_and_cache(cp.asarray(rows), cp.asarray(rows), dk3, dv3, np.array([0, 9, -1, 47]))
    ref.reshape_and_cache_ref(rows, rows, k3, k3.copy(), np.array([0, 9, -1, 47]))
    np.testing.assert_array_equal(np.asarray(dk3), k3)
    copy_blocks(dkc, dvc, np.array([[0, 4], [1, 5]]))
    ref.copy_blocks_ref(kc, vc, [[0, 4], [1, 5]])
    np.testing.assert_array_equal(np.asarray(dkc), kc)
    np.testing.assert_array_equal(np.asarray(dvc), vc)
    host = np.zeros((3, bs, kvh, D), kc.dtype)
    swap_blocks(dkc, host, np.array([[2, 0], [3, 1], [5, 2]]))
    np.testing.assert_array_equal(host, kc[[2, 3, 5]])
    back = cp.zeros_like(dkc)
    swap_blocks(host, back, np.array([[0, 5], [2, 0]]))
    np.testing.assert_array_equal(np.asarray(back)[[5, 0]], kc[[2, 5]])


def test_reshape_and_cache_refuses_a_slot_past_the_caches(cp):
    from pagesim.gpu.cache_ops import reshape_and_cache
    nb, bs, kvh, D = 3, 4, 1, 8
    kc = cp.zeros((nb, bs, kvh, D), dtype=np.float16)
    vc = cp.zeros_like(kc)
    rows = cp.asarray(np.ones((2, kvh, D), np.float16))
    with pytest.raises(ValueError, match=r"slot_mapping: slot 12 is outside the caches' 12 slots"):
        reshape_and_cache(rows, rows, kc, vc, np.array([0, nb * bs]))
    assert np.all(np.asarray(kc) == 0)  # refused before the launch
    reshape_and_cache(rows, rows, kc, vc, np.array([-1, nb * bs - 1]))  # the last slot and a skip are fine
    assert np.asarray(kc)[-1, -1].sum() == D and np.asarray(kc).sum() == D


def test_one_plan_rebound_to_each_layer(cp):
    """A decode step plans once and rebinds the plan to the next layer's query and caches: the same
    result as a fresh plan for that layer, the same output buffer, shapes checked."""
    from pagesim.gpu import paged_attention as pa
    rng = np.random.default_rng(31)
    case = make_case(rng, num_seqs=4, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16, max_ctx=120)
    layer2 = [ref.round_to(rng.standard_normal(a.shape), "float16") for a in (case.query, case.key_cache,
                                                                           case.value_cache)]
    plan = pa.prepare(*dev(cp, case), 16, case.max_context_len, check=False)
    out1 = np.asarray(plan.run()).astype(np.float32).copy()
    buf = plan.out
    plan.rebind(*(cp.asarray(a) for a in layer2))
    out2 = np.asarray(plan.run()).astype(np.float32)
    assert plan.out is buf
    want2 = ref.paged_attention_ref(*layer2, case.block_tables, case.context_lens, 16, case.scale, "float16")
    ref.assert_attention_close(out2, want2, "float16")
    want1 = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                    case.context_lens, 16, case.scale, "float16")
    ref.assert_attention_close(out1, want1, "float16")
    assert np.abs(out2 - want1).max() > 0.1  # it really read the second layer
    with pytest.raises(ValueError, match=r"rebind: key_cache is float16 \(.*\), the plan has"):
        plan.rebind(cp.asarray(layer2[0]), cp.asarray(layer2[1][:-1]), cp.asarray(layer2[2]))
