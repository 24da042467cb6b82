"""Build the simulator's compiled core, every scheduler family's, into a folder:
``python -m pagesim.sim.precompile DIR``.

The package build runs it (``setup.py``, for a wheel or ``pip install .``) into the package's
``sim/core/compiled/``, so that an installed pagesim's first run loads machine code instead of
compiling it (a minute or two per family). Each family is compiled by a small run of a system of
its own, with numba's cache in a temporary folder, and the extension module that run writes
(``sim/core/aot.py``) is copied into ``DIR``. Where this cannot be done (numba, setuptools or a
C compiler missing), it says why in one line and exits 1: the package is built without the
modules, and its runs compile, or run in CPython, as they would have.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path


def families() -> dict[int, str]:
    """A system of each scheduler family (the registry's first), by the core's kind."""
    from pagesim.sim import systems

    first: dict[int, str] = {}
    for system in systems.SYSTEMS.values():
        first.setdefault(systems.SCHEDULERS[system.scheduler].core_kind, system.name)
    return first


def build(into: Path) -> list[Path]:
    """Compile each family's loop and write its extension module into ``into``; returns them."""
    import pandas as pd

    from pagesim.sim.config import SimConfig
    from pagesim.sim.core import aot, jit, loop
    from pagesim.sim.run import run_simulation

    if not jit.COMPILED:
        raise RuntimeError("numba is not installed (or PAGESIM_JIT=0)")
    into.mkdir(parents=True, exist_ok=True)
    # a few requests that preempt nothing: the machine code is the same for every run of a family
    trace = pd.DataFrame({"request_id": [f"r{i}" for i in range(8)], "arrival_s": [0.1 * i for i in range(8)],
                          "prompt_tokens": [64 + 16 * i for i in range(8)], "output_tokens": [8 + i for i in range(8)]})
    for kind, system in families().items():
        t0 = time.perf_counter()
        run_simulation(SimConfig.for_system(system), trace)
        built = sorted(aot.cache_dir().glob(f"pagesim_core_{loop.FAMILIES[kind]}_*{aot.module_path('').name}"))
        if not built:
            failed = sorted(aot.cache_dir().glob("*.failed"))
            raise RuntimeError(failed[-1].read_text().strip() if failed else f"no module was written for {system}")
        shutil.copy2(built[-1], into / built[-1].name)
        print(f"pagesim: compiled the core for {system}'s family in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return sorted(into.glob("pagesim_core_*"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pagesim.sim.precompile DIR", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as cache:
        os.environ["NUMBA_CACHE_DIR"] = cache  # read by numba at its import, and by aot.cache_dir
        os.environ.pop("PAGESIM_JIT", None)
        try:
            build(Path(argv[0]))
        except Exception as e:  # noqa: BLE001 - any failure: the package is built without the modules
            print(f"pagesim: the compiled core was not built ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                  "runs will compile it on first use", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
