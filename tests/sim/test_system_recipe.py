"""docs/design.md's "How to add a system", carried out in a copy of the checkout: a new system
(vLLM v1 without async scheduling) as one registry line runs as its scheduler and manager with
its presets (the same records as ``--system vllm-v1 --no-async-scheduling``), is listed by
``--help``, and leaves every family's compile key as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.sim.core.test_policy_recipe import KEYS

ROOT = Path(__file__).resolve().parents[2]


def test_a_new_system_is_one_registry_line(tmp_path):
    copy = tmp_path / "pagesim"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__", ".git", "site", "out", "*.egg-info",
                                                              ".pytest_cache", ".hypothesis", "results", "benchmarks",
                                                              "tests", "docs", "compiled"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PAGESIM_JIT="0")  # `import pagesim` is the copy

    def python(*argv: str) -> str:
        done = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    before = python("-c", KEYS)
    systems = (copy / "sim/systems.py").read_text()
    line = '    # SGLang: page_size 1 (server_args.py)'
    assert line in systems
    (copy / "sim/systems.py").write_text(systems.replace(line, (
        '    System("vllm-v1-sync", "paged", "vllm-v1", dict(block_size=16, prefix_caching=True, watermark=0.0,\n'
        '           async_scheduling=False), "paged, block 16, prefix caching on", "on demand, chunk by chunk"),\n')
        + line))

    def simulate(*flags: str) -> tuple[dict, str]:
        out = tmp_path / "out" / "-".join(flags)
        summary = python("-m", "pagesim.sim.cli", "simulate", "--workload", "sharegpt", "--rate", "40",
                         "--num-requests", "60", "--kv-gib", "2", "--no-progress", "--json", "--out", str(out),
                         *flags)
        return json.loads(summary.strip().splitlines()[-1]), (out / "requests.csv").read_text()

    new, new_requests = simulate("--system", "vllm-v1-sync")
    old, old_requests = simulate("--system", "vllm-v1", "--no-async-scheduling")
    assert new["completed"] == 60
    assert new_requests == old_requests  # its presets, run by vLLM v1's scheduler over paged memory
    asynchronous, asynchronous_requests = simulate("--system", "vllm-v1")
    assert asynchronous_requests != new_requests  # (the preset is not vLLM v1's default)
    assert "vllm-v1-sync" in python("-m", "pagesim.sim.cli", "simulate", "--help")
    assert python("-c", KEYS) == before
