"""Fetch vLLM 0.33.0 for the peer tests: ``python -m tests.peers.fetch [--wheel PATH]``.

Downloads the wheel with pip (``--no-deps``: the peers import vLLM's scheduler alone, with stubs
for the rest, vllm_v1.py) into the cache folder, ``~/.cache/pagesim-peers`` or ``$PAGESIM_PEERS``,
and unpacks its Python sources there (``vllm-0.33.0/vllm/...``). The compiled extensions (~780 MB
of the wheel's 840) are left out: nothing the scheduler runs on CPU loads them. ``--wheel`` takes
a wheel already on disk (offline). A no-op once unpacked.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile
from pathlib import Path

VERSION = "0.33.0"
# one platform's wheel, whatever this machine's: the Python sources are the same in every one
PLATFORM = "manylinux_2_28_x86_64"


def cache_folder() -> Path:
    return Path(os.environ.get("PAGESIM_PEERS") or Path.home() / ".cache" / "pagesim-peers")


def source_folder() -> Path:
    """Where ``import vllm`` finds the unpacked package (vllm_v1.py puts it on sys.path)."""
    return cache_folder() / f"vllm-{VERSION}"


def unpacked() -> bool:
    # written last: a half-unpacked folder (an interrupted run) is not taken for a finished one
    return (source_folder() / ".unpacked").exists()


def download(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--platform", PLATFORM, "--python-version", "3.11", f"vllm=={VERSION}", "-d", str(folder)],
                   check=True)
    return next(folder.glob(f"vllm-{VERSION}-*.whl"))


def unpack(wheel: Path) -> None:
    target = source_folder()
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".py") or ".dist-info/" in n]
        archive.extractall(target, names)
    (target / ".unpacked").write_text(f"{wheel.name}\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help="a vllm-0.33.0 wheel already downloaded (no network)")
    args = parser.parse_args(argv)
    if unpacked():
        print(f"vLLM {VERSION} already in {source_folder()}")
        return 0
    wheel = args.wheel or next(cache_folder().glob(f"vllm-{VERSION}-*.whl"), None) or download(cache_folder())
    unpack(wheel)
    print(f"vLLM {VERSION} unpacked in {source_folder()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
