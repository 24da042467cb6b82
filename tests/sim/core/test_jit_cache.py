"""numba's cache of the core is dropped when a source numba reads changes, not when the
Python-only glue does (sim/core/jit.py: _drop_stale_cache)."""

from __future__ import annotations

from pagesim.sim.core import jit


def cached_core(tmp_path):
    for name in ("loop.py", "state.py", "check.py", "replay.py"):
        (tmp_path / name).write_text(f"# {name}\n")
    jit._drop_stale_cache(tmp_path)  # the first stamp
    (tmp_path / "__pycache__" / "loop.run-1.nbi").write_text("compiled")
    return tmp_path / "__pycache__" / "loop.run-1.nbi"


def test_editing_a_compiled_source_or_its_constants_drops_the_cache(tmp_path):
    for name in ("loop.py", "state.py"):
        compiled = cached_core(tmp_path)
        jit._drop_stale_cache(tmp_path)
        assert compiled.exists()  # nothing changed
        (tmp_path / name).write_text("# edited\n")
        jit._drop_stale_cache(tmp_path)
        assert not compiled.exists(), name


def test_editing_the_python_only_glue_keeps_it(tmp_path):
    compiled = cached_core(tmp_path)
    for name in jit.NOT_COMPILED:
        (tmp_path / name).write_text("# edited\n")
    jit._drop_stale_cache(tmp_path)
    assert compiled.exists()
