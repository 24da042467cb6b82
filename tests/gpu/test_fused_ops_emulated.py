"""The fused element-wise kernels (gpu/kernels/fused_ops.cu) through their Python wrappers
(gpu/fused_ops.py) and the fake CuPy, whose kernels run the real sources in the CPU emulation,
against the numpy references of gpu/reference.py: odd sizes (hidden 100, 33; odd head counts;
head_dim 34), strided rows, padding slots, both dtypes and slot index types. An injected bug in each
kernel fails the same checks (test_injected_bug_is_caught)."""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.gpu import reference as ref
from pagesim.gpu.device import cuda_available


def rand(rng, shape, dtype, scale=1.0):
    return ref.round_to(scale * rng.standard_normal(shape), dtype)


def check_rms(cp, dtype, n, hidden, add, strided=False, seed=0):
    from pagesim.gpu.fused_ops import fused_add_rms_norm
    rng = np.random.default_rng(seed)
    wide = rand(rng, (n, hidden + 7 if strided else hidden), dtype)
    res = rand(rng, (n, hidden), dtype, 3.0)
    w = rand(rng, (hidden,), dtype)
    want_x, want_r = ref.fused_add_rms_norm_ref(wide[:, :hidden], res, w, 1e-6, dtype, add=add)
    dx, dr = cp.asarray(wide), cp.asarray(res)
    fused_add_rms_norm(dx[:, :hidden], dr, cp.asarray(w), 1e-6, add=add)
    ref.assert_fused_close(cp.asnumpy(dr), want_r, dtype)
    ref.assert_fused_close(cp.asnumpy(dx)[:, :hidden], want_x, dtype)
    if strided:  # the columns past the row were not touched
        np.testing.assert_array_equal(cp.asnumpy(dx)[:, hidden:], wide[:, hidden:])


def check_rotary(cp, dtype, heads, kv_heads, head_dim, index=np.int64, seed=0):
    from pagesim.gpu.fused_ops import rotary_and_cache
    rng = np.random.default_rng(seed)
    n, nb, bs, max_pos = 6, 5, 4, 50
    qkv = rand(rng, (n, (heads + 2 * kv_heads) * head_dim), dtype)
    ang = rng.uniform(0, 6.3, (max_pos, head_dim // 2))
    cos, sin = ref.round_to(np.cos(ang), dtype), ref.round_to(np.sin(ang), dtype)
    pos = rng.integers(0, max_pos, n).astype(np.int64)
    slots = rng.permutation(nb * bs)[:n].astype(index)
    slots[2] = -1  # a padding token: rotated, never written
    kc, vc = rand(rng, (nb, bs, kv_heads, head_dim), dtype), rand(rng, (nb, bs, kv_heads, head_dim), dtype)
    dqkv, dkc, dvc = cp.asarray(qkv), cp.asarray(kc), cp.asarray(vc)
    want = ref.rotary_cache_ref(qkv, pos, cos, sin, heads, kv_heads, kc, vc, slots, dtype)
    rotary_and_cache(dqkv, cp.asarray(pos), cp.asarray(cos), cp.asarray(sin), heads, kv_heads, dkc, dvc,
                     cp.asarray(slots), check=True)
    ref.assert_fused_close(cp.asnumpy(dqkv), want, dtype)
    ref.assert_fused_close(cp.asnumpy(dkc), kc, dtype)
    np.testing.assert_array_equal(cp.asnumpy(dvc), vc)  # v moves unchanged


def check_silu(cp, dtype, n, d, seed=0):
    from pagesim.gpu.fused_ops import silu_and_mul
    rng = np.random.default_rng(seed)
    x = rand(rng, (n, 2 * d), dtype, 3.0)
    out = cp.asarray(np.zeros((n, d), x.dtype))
    silu_and_mul(cp.asarray(x), out)
    ref.assert_fused_close(cp.asnumpy(out), ref.silu_and_mul_ref(x, dtype), dtype)


DTYPES = ["float16", "bfloat16"]


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_fused_kernels(dtype):
    """The same checks on a GPU, the kernels compiled by NVRTC (real CuPy)."""
    import cupy
    for n, hidden, add, strided in ((5, 100, True, True), (3, 33, False, False), (64, 4096, True, False)):
        check_rms(cupy, dtype, n, hidden, add, strided)
    for heads, kv_heads, head_dim, index in ((3, 1, 34, np.int32), (32, 8, 128, np.int64)):
        check_rotary(cupy, dtype, heads, kv_heads, head_dim, index)
    for n, d in ((7, 33), (64, 11008)):
        check_silu(cupy, dtype, n, d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,hidden,add,strided", [(1, 64, True, False), (5, 100, True, True), (3, 33, False, False),
                                                  (2, 1000, True, False)])
def test_fused_add_rms_norm(cp, dtype, n, hidden, add, strided):
    check_rms(cp, dtype, n, hidden, add, strided)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,index", [((4, 2, 64, np.int64)), (3, 1, 34, np.int32),
                                                           (5, 5, 128, np.int64)])
def test_rotary_and_cache(cp, dtype, heads, kv_heads, head_dim, index):
    check_rotary(cp, dtype, heads, kv_heads, head_dim, index)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", [(1, 64), (7, 33), (3, 1100)])
def test_silu_and_mul(cp, dtype, n, d):
    check_silu(cp, dtype, n, d)


def test_the_wrappers_refuse_bad_shapes(cp):
    from pagesim.gpu.fused_ops import fused_add_rms_norm, rotary_and_cache, silu_and_mul
    x = cp.asarray(np.zeros((2, 8), np.float16))
    with pytest.raises(ValueError, match="do not match"):
        fused_add_rms_norm(x, cp.asarray(np.zeros((2, 9), np.float16)), cp.asarray(np.ones(8, np.float16)))
    with pytest.raises(TypeError, match="one 2-byte dtype"):
        silu_and_mul(x, cp.asarray(np.zeros((2, 4), np.float32)))
    caches = cp.asarray(np.zeros((2, 4, 1, 8), np.float16))
    table = cp.asarray(np.zeros((3, 4), np.float16))
    with pytest.raises(ValueError, match=r"positions: 5 is outside the rotary tables' 3 rows"):
        rotary_and_cache(cp.asarray(np.zeros((2, 24), np.float16)), cp.asarray(np.array([0, 5])), table, table, 1, 1,
                         caches, caches.copy(), cp.asarray(np.array([0, 1])), check=True)


RUN_CHECK = """
import sys
from pathlib import Path
from tests.gpu.conftest import install_fake_cupy
from tests.gpu.emu.build import build
from tests.gpu import test_fused_ops_emulated as t
lib, why = build(Path(sys.argv[1]), Path(sys.argv[1]) / "kernels", ("PAGESIM_EMU_FP16_64_ONLY",))
cp = install_fake_cupy(lib, setattr)
try:
    getattr(t, sys.argv[2])(cp, *eval(sys.argv[3]))
except AssertionError:
    sys.exit(3)  # the check failed (any other failure exits 1)
"""


@pytest.mark.parametrize("bug,fix,check,args", [
    # the mean over the block's threads instead of the row: right only when the row fills the block
    ("/ (float)hidden", "/ (float)blockDim.x", "check_rms", ("float16", 5, 100, True)),
    ("x * cs - y * sn", "x * cs + y * sn", "check_rotary", ("float16", 4, 2, 64)),  # the rotation's sign
    ("head >= num_heads && slot", "head > num_heads && slot", "check_rotary", ("float16", 4, 2, 64)),  # 1st k head
    ("expf(-g)", "expf(g)", "check_silu", ("bfloat16", 7, 33)),
], ids=["rms-mean-over-threads", "rotary-sign", "rotary-first-key-head-not-cached", "silu-sign"])
def test_injected_bug_is_caught(emu, tmp_path, bug, fix, check, args):
    """Each bug, written into a copy of fused_ops.cu, fails the check that passes on the real source
    (the tests above): run in a subprocess, the mutated emulation being a second library with the
    same symbols, whose exit code 3 says the check itself failed."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from pagesim.gpu.kernels_src import KERNEL_DIR
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))

    shutil.copytree(KERNEL_DIR, tmp_path / "kernels")
    src = tmp_path / "kernels" / "fused_ops.cu"
    text = src.read_text()
    assert text.count(bug) == 1
    src.write_text(text.replace(bug, fix))
    r = subprocess.run([sys.executable, "-c", RUN_CHECK, str(tmp_path), check, repr(args)], cwd=root, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr[-2000:]
