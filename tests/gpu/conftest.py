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
