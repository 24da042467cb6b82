"""A command imports only what it uses (issue 85): the help of ``simulate``, ``trace``,
``reproduce`` and ``report`` (and
shell completion's calls into them) loads neither pandas (a quarter of a second) nor numba nor
plotly; each checked in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from pagesim.sim.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print(sorted(m for m in ("pandas", "numba", "plotly") if m in sys.modules))
"""


@pytest.mark.parametrize("argv", [["simulate", "--help"], ["trace", "--help"], ["trace", "stats", "--help"],
                                  ["reproduce", "--help"], ["report", "--help"]])
def test_a_commands_help_loads_no_heavy_library(argv):
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-300:]


BLAS = """
import os
from pagesim.sim import cli
import numpy
print(os.environ["OPENBLAS_NUM_THREADS"])
"""


def printed_with(variable: str, given: str | None, script: str) -> str:
    """What ``script`` prints in a fresh process whose environment has ``variable`` set to
    ``given`` (None: unset)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != variable}
    if given is not None:
        env[variable] = given
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


@pytest.mark.parametrize("given, expected", [(None, "1"), ("3", "3")])
def test_the_command_runs_one_blas_thread_unless_the_user_chose(given, expected):
    """numpy's OpenBLAS threads spin after each BLAS call, a sixth of a whole run's CPU on 2 cores
    (benchmarks/whole_process_cpu.py): the command sets one thread before numpy loads, and keeps
    the user's own choice."""
    assert printed_with("OPENBLAS_NUM_THREADS", given, BLAS) == expected


HUGE_PAGES = """
from pagesim.sim import cli
import numpy
print(numpy._core.multiarray._get_madvise_hugepage())
"""


@pytest.mark.parametrize("given, expected", [(None, "False"), ("1", "True")])
def test_the_command_asks_no_huge_pages_unless_the_user_chose(given, expected):
    """numpy advises transparent huge pages for its large arrays, and the kernel's compaction to
    find them on fragmented memory cost ten million requests 7 s of system time (docs/performance.md):
    the command turns the advice off before numpy loads, and keeps the user's own choice."""
    assert printed_with("NUMPY_MADVISE_HUGEPAGE", given, HUGE_PAGES) == expected


ARROW_POOL = """
from pagesim.sim import cli
import pyarrow
print(pyarrow.default_memory_pool().backend_name)
"""


@pytest.mark.parametrize("given, expected", [(None, "system"), ("mimalloc", "mimalloc")])
def test_the_command_takes_arrows_memory_from_the_c_library_unless_the_user_chose(given, expected):
    """Arrow's mimalloc has the kernel zero a 2 MB huge page at each first touch, system time in
    `reproduce all`'s workers (docs/performance.md): the command picks Arrow's system pool before
    pyarrow loads, and keeps the user's own choice."""
    assert printed_with("ARROW_DEFAULT_MEMORY_POOL", given, ARROW_POOL) == expected
