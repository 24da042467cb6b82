"""No machine's folders in the project: code finds shared data relative to the repository
(``../shared``) or by an environment variable, and provenance records relative paths. The
recorded results of benchmarks (``benchmarks/results``) say where they ran and are left out."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: this machine's absolute folders, spelt in two pieces so that this file does not match itself
PATTERN = "/" + "work/|/" + "root/"


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_tracked_file_names_a_machine_folder():
    out = subprocess.run(["git", "grep", "-nE", PATTERN, "--", ".", ":!benchmarks/results"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == "", out.stdout[:2000]
