"""tests/conftest.py's rules for the whole suite.

The suite ends when a test hangs in code that holds the GIL (a compiled loop that never
returns: CI's suite once waited so to its 90-minute limit): setup.cfg has pytest print the
test's tracebacks and end its process past ``faulthandler_timeout``, and tests/conftest.py
ends the run at that first crash, naming the test, where xdist would give it to a new worker
again and again. And the processes the tests start inherit the user's ``PAGESIM_JIT``, not
the "0" tests/peers/__init__.py sets as the peers are collected."""

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
    env = {**os.environ, "PYTHONPATH": subprocess_path(), "COLUMNS": "300"}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "Timeout (0:00:02)!" in text and "in test_hangs" in text  # the hung test's traceback
    # one worker went down, naming the test, and none replaced it (the message itself shows twice
    # where the terminal is wide enough for the summary line to hold it whole, as on CI)
    assert text.count("node down") == 1 and "replacing crashed worker" not in text, text[-3000:]
    assert "crashed while running 'test_hangs.py::test_hangs'" in text
    assert time.monotonic() - t0 < 120


SETS_JIT = """
import os

os.environ.setdefault("PAGESIM_JIT", "0")  # as tests/peers/__init__.py does


def test_nothing():
    pass
"""

READS_JIT = """
import subprocess
import sys


def test_a_child_inherits_the_users_setting():
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('PAGESIM_JIT'))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"
"""


def test_the_peers_setting_is_not_inherited(tmp_path):
    (tmp_path / "test_a_peer.py").write_text(SETS_JIT)
    (tmp_path / "test_b_runs_a_child.py").write_text(READS_JIT)
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_collection_finish\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "PAGESIM_JIT"} | {"PYTHONPATH": subprocess_path()}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]


@pytest.mark.parametrize("users, suites", [(None, "numba"), ("1", "1")])
def test_the_whole_suite_writes_no_extension_module_unless_the_user_said(users, suites, monkeypatch):
    """Where the user set no PAGESIM_JIT, the whole suite runs numba's dispatcher with no
    extension module written (``PAGESIM_JIT=numba``), its warm-up included; a user's setting
    stands. pytest_collection_finish keeps the suite's setting."""
    from pagesim.sim.core.compile import jit
    from tests import conftest

    if not jit.COMPILED:
        pytest.skip("the core runs in CPython here (PAGESIM_JIT=0): no warm-up")
    seen = []
    monkeypatch.setattr(conftest.subprocess, "run", lambda cmd, **kw: seen.append((cmd[-1], os.environ.get(
        "PAGESIM_JIT"))))
    monkeypatch.setattr(conftest, "USERS_JIT", users)
    monkeypatch.delenv("PAGESIM_JIT", raising=False)
    if users is not None:
        monkeypatch.setenv("PAGESIM_JIT", users)
    config = type("Config", (), {"args_source": pytest.Config.ArgsSource.TESTPATHS})()
    conftest.pytest_sessionstart(type("Session", (), {"config": config})())
    assert seen == [("--warm", suites)]
    monkeypatch.setenv("PAGESIM_JIT", "0")  # as tests/peers/__init__.py sets it while collecting
    conftest.pytest_collection_finish(None)
    assert os.environ["PAGESIM_JIT"] == suites
