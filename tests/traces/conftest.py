"""Helpers for the trace tests: tiny files written into tmp_path, and the shared real traces."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


@pytest.fixture
def write(tmp_path):
    """write(name, text) -> Path of a file in tmp_path holding exactly ``text``."""
    def _write(name: str, text: str) -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p
    return _write


@pytest.fixture
def shared_trace():
    """shared_trace(name) -> Path in ../shared/traces (beside the repository), or skip when absent."""
    def _get(name: str) -> Path:
        p = SHARED / name
        if not p.exists():
            pytest.skip(f"{p} not present")
        return p
    return _get
