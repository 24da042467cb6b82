"""The GPU side imports, its tests collect and validate writes its report without the packages
the GPU machine's image lacks (simpy, plotly; tqdm for good measure), and the gpu extra pins no
CuPy wheel of its own. Each check runs in a subprocess where those imports fail."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path, blocked, *args, timeout=300):
    """``python args`` with ``import X`` raising ImportError for each X in ``blocked``."""
    site = tmp_path / "blocked"
    site.mkdir(exist_ok=True)
    for m in blocked:
        (site / f"{m}.py").write_text(f"raise ImportError('{m} is blocked by the test')\n")
    # the caller's PYTHONPATH after the root: a worktree's tests import its own pagesim
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_gpu_modules_import_and_gpu_tests_collect_without_simpy_plotly_tqdm(tmp_path):
    r = run(tmp_path, ("simpy", "plotly", "tqdm"), "-c",
            "import simpy\n")
    assert r.returncode == 1 and "blocked by the test" in r.stderr  # the blocker works
    r = run(tmp_path, ("simpy", "plotly", "tqdm"), "-c",
            "import pagesim.gpu.validate, pagesim.gpu.validate_cli, pagesim.gpu.validate_report, "
            "pagesim.gpu.executor, pagesim.gpu.model_runner, pagesim.gpu.calibrate, pagesim.gpu.bench, "
            "pagesim.sim.cli; print('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    r = run(tmp_path, ("simpy", "plotly", "tqdm"), "-m", "pytest", "tests/gpu", "-m", "gpu", "--collect-only",
            "-q", "-p", "no:cacheprovider")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "error" not in r.stdout.lower() and " collected" in r.stdout


ARGS = ["-m", "pagesim.sim.cli", "validate", "--workload", "sharegpt", "--rate", "4", "--num-requests", "6", "--model",
        "llama-2-7b", "--gpu", "h200", "--system", "vllm", "--kv-gib", "1", "--max-seq-len", "2048",
        "--backend", "fake"]


def test_validate_writes_its_report_without_plotly_and_tqdm(tmp_path):
    out = tmp_path / "v"
    r = run(tmp_path, ("plotly", "tqdm"), *ARGS, "--progress", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    html = (out / "report.html").read_text()
    assert "Figures left out: plotly is not installed" in html and "median_step_error" in html
    assert "<script" not in html
    assert json.loads((out / "validation.json").read_text())["num_requests"] == 6


def test_validate_runs_without_simpy(tmp_path):
    """validate runs on the core (the external-executor mode): SimPy's engine is not needed."""
    r = run(tmp_path, ("simpy",), *ARGS, "--no-progress", "--out", str(tmp_path / "v"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "v" / "validation.json").read_text())["num_requests"] == 6


def test_gpu_extra_pins_no_cupy_wheel():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = {k: v.split() for k, v in cfg["options.extras_require"].items()}
    assert not [p for p in extras["gpu"] if p.startswith("cupy")]  # the image's CuPy stays the only one
    assert extras["cuda12"][0].startswith("cupy-cuda12x") and extras["cuda13"][0].startswith("cupy-cuda13x")


@pytest.mark.parametrize("mod", ["plotly", "tqdm"])
def test_the_blocker_blocks(tmp_path, mod):
    r = run(tmp_path, (mod,), "-c", f"import {mod}")
    assert r.returncode == 1 and "blocked by the test" in r.stderr
