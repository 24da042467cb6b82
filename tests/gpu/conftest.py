"""Fixtures for tests/gpu: the CPU emulation library of the kernels (built once per test run)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def emu(tmp_path_factory, request):
    """Under pytest-xdist the workers share one build (~20 s of CPU) in the run's temporary root:
    the first to take the lock builds it, the others load it."""
    import fcntl

    from tests.gpu.emu.build import build
    if not hasattr(request.config, "workerinput"):  # no workers: this process's own folder
        lib, why = build(tmp_path_factory.mktemp("emu"))
    else:
        shared = tmp_path_factory.getbasetemp().parent / "emu"  # the run's, every worker's
        shared.mkdir(exist_ok=True)
        with open(shared / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            lib, why = build(shared, reuse=True)
    if lib is None:
        pytest.skip(why)
    return lib


def install_fake_cupy(lib, patch):
    """``sys.modules['cupy']`` = a fake CuPy whose kernels run the real sources in the emulation
    ``lib``; ``patch(obj, name, value)`` sets attributes (pytest's monkeypatch.setattr, or setattr in a
    subprocess). Returns the fake module."""
    import sys

    import pagesim.gpu._loader
    import pagesim.gpu.device
    import pagesim.gpu.paged_attention as pa
    from tests.gpu import fake_cupy
    fake = fake_cupy.make(lib)
    sys.modules["cupy"] = fake
    patch(pagesim.gpu.device, "_probe", lambda: (True, ""))
    pagesim.gpu._loader.get_kernel.cache_clear()
    patch(pa, "_SM_COUNT", {})
    patch(pa, "_SMEM_OPTIN", {})
    patch(pa, "_CAPABILITY", {})
    patch(pa, "_BLOCKS_PER_SM", {})
    return fake


@pytest.fixture
def cp(emu, monkeypatch):
    """The fake CuPy over the emulation (see install_fake_cupy), removed after the test."""
    import sys

    import pagesim.gpu._loader
    monkeypatch.setitem(sys.modules, "cupy", None)  # restored (or removed) after the test
    yield install_fake_cupy(emu, monkeypatch.setattr)
    pagesim.gpu._loader.get_kernel.cache_clear()


@pytest.fixture
def cpu_kernels(cp, monkeypatch):
    """The GPU wrappers take torch CPU tensors: their memory viewed as fake-CuPy arrays (kind
    "torch-cpu"), results handed back as torch tensors over the same memory; the kernels run in the
    emulation. Lets TorchCupyBackend(device="cpu") run its kernel paths."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from pagesim.gpu import _arrays, cache_ops, fused_ops, paged_attention
    real_wrap, real_unwrap = _arrays.wrap, _arrays.unwrap

    def wrap(x, name, dtype=None, allow_host=False):
        if isinstance(x, torch.Tensor) and not x.is_cuda:
            bf16 = x.dtype == torch.bfloat16
            arr = (x.detach().view(torch.int16) if bf16 else x.detach()).numpy().view(cp.ndarray)
            return _arrays.Wrapped(arr, "torch-cpu", "bfloat16" if bf16 else str(arr.dtype))
        return real_wrap(x, name, dtype, allow_host)

    def unwrap(arr, like):
        if like.kind == "torch-cpu":
            t = torch.from_numpy(np.asarray(arr).view(np.ndarray))
            return t.view(torch.bfloat16) if like.dtype == "bfloat16" else t
        return real_unwrap(arr, like)

    for mod in (fused_ops, cache_ops, paged_attention):
        monkeypatch.setattr(mod, "wrap", wrap)
    monkeypatch.setattr(paged_attention, "unwrap", unwrap)
    return cp
