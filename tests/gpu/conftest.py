"""Fixtures for tests/gpu: the CPU emulation library of the kernels (built once per session)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def emu(tmp_path_factory):
    from tests.gpu.emu.build import build
    lib, why = build(tmp_path_factory.mktemp("emu"))
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
    return fake


@pytest.fixture
def cp(emu, monkeypatch):
    """The fake CuPy over the emulation (see install_fake_cupy), removed after the test."""
    import sys

    import pagesim.gpu._loader
    monkeypatch.setitem(sys.modules, "cupy", None)  # restored (or removed) after the test
    yield install_fake_cupy(emu, monkeypatch.setattr)
    pagesim.gpu._loader.get_kernel.cache_clear()
