"""The suite ends when a test hangs in code that holds the GIL (a compiled loop that never
returns: CI's suite once waited so to its 90-minute limit): setup.cfg has pytest print the
test's tracebacks and end its process past ``faulthandler_timeout``, and tests/conftest.py
ends the run at that first crash, naming the test, where xdist would give it to a new worker
again and again."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import time

import pytest

from tests.sim.helpers import TESTS_ROOT, subprocess_path

pytest.importorskip("xdist")

HANGS = """
import re


def test_first():
    pass


def test_hangs():
    re.match(r"(a+)+$", "a" * 60 + "b")  # backtracks for hours, holding the GIL


def test_after():
    pass
"""


def test_the_suites_limit_is_set():
    ini = configparser.ConfigParser()
    ini.read(TESTS_ROOT / "setup.cfg")
    assert float(ini["tool:pytest"]["faulthandler_timeout"]) > 0
    assert ini["tool:pytest"].getboolean("faulthandler_exit_on_timeout")


def test_a_test_holding_the_gil_ends_the_run_once_named(tmp_path):
    (tmp_path / "test_hangs.py").write_text(HANGS)
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_configure, pytest_xdist_make_scheduler\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nfaulthandler_timeout = 2\nfaulthandler_exit_on_timeout = true\n")
    env = {**os.environ, "PYTHONPATH": subprocess_path()}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "Timeout (0:00:02)!" in text and "in test_hangs" in text  # the hung test's traceback
    assert text.count("crashed while running 'test_hangs.py::test_hangs'") == 1, text[-3000:]
    assert time.monotonic() - t0 < 120
