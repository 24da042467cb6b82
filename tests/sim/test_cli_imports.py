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
