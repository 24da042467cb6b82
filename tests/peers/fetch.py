"""Fetch the peer engines: ``python -m tests.peers.fetch [--wheel PATH ...]``.

Downloads each vLLM release the peers drive (0.4.2: ``vllm_v0.py``; 0.33.0: ``vllm_v1.py``) with
pip (``--no-deps``: the peers import vLLM's scheduler alone, with stubs for the rest) into the
cache folder, ``~/.cache/pagesim-peers`` or ``$PAGESIM_PEERS``, and unpacks its Python sources
there (``vllm-<version>/vllm/...``). The compiled extensions (most of each wheel) are left out:
nothing a scheduler runs on CPU loads them. ``--wheel`` takes a wheel already on disk (offline).
A no-op for a release already unpacked.

SGLang 0.5.23 (``sglang_radix.py``: its radix cache) the same way: ``sglang-<version>/sglang/...``;
``--wheel`` takes its wheel too.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

# release -> one platform's wheel, whatever this machine's: the Python sources are the same in
# every one (0.4.2's source archive cannot be downloaded without building it: its build needs CUDA)
RELEASES = {"0.4.2": "manylinux1_x86_64", "0.33.0": "manylinux_2_28_x86_64"}


def cache_folder() -> Path:
    return Path(os.environ.get("PAGESIM_PEERS") or Path.home() / ".cache" / "pagesim-peers")


def source_folder(version: str, package: str = "vllm") -> Path:
    """Where ``import vllm`` (or ``package``) finds release ``version``'s unpacked package (importing.Peer)."""
    return cache_folder() / f"{package}-{version}"


def unpacked(version: str, package: str = "vllm") -> bool:
    # written last: a half-unpacked folder (an interrupted run) is not taken for a finished one
    return (source_folder(version, package) / ".unpacked").exists()


def download(version: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--platform", RELEASES[version], "--python-version", "3.11", f"vllm=={version}",
                    "-d", str(folder)], check=True)
    return next(folder.glob(f"vllm-{version}-*.whl"))


def unpack(version: str, wheel: Path, package: str = "vllm") -> None:
    target = source_folder(version, package)
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".py") or ".dist-info/" in n]
        archive.extractall(target, names)
    (target / ".unpacked").write_text(f"{wheel.name}\n")


def wheel_version(wheel: Path) -> str:
    found = re.match(r"vllm-([^-]+)-", wheel.name)
    if not found or found.group(1) not in RELEASES:
        raise SystemExit(f"--wheel {wheel}: not a wheel of a vLLM release the peers drive ({', '.join(RELEASES)})")
    return found.group(1)


# -- SGLang: its radix cache (sglang_radix.py) ------------------------------------------------------
SGLANG_RELEASES = {"0.5.23": "manylinux_2_34_x86_64"}  # its only wheels are CPython 3.11 ones


def sglang_download(version: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--platform", SGLANG_RELEASES[version], "--python-version", "3.11", f"sglang=={version}",
                    "-d", str(folder)], check=True)
    return next(folder.glob(f"sglang-{version}-*.whl"))


def sglang_fetch(wheels: list) -> None:
    """Every SGLang release the peers drive, from the wheels given (offline: only those) or pip."""
    given = {}
    for wheel in wheels:
        found = re.match(r"sglang-([^-]+)-", wheel.name)
        if found and found.group(1) in SGLANG_RELEASES:
            given[found.group(1)] = wheel
    for version in SGLANG_RELEASES:
        if unpacked(version, "sglang"):
            print(f"SGLang {version} already in {source_folder(version, 'sglang')}")
            continue
        if wheels and version not in given:
            continue
        wheel = (given.get(version) or next(cache_folder().glob(f"sglang-{version}-*.whl"), None)
                 or sglang_download(version, cache_folder()))
        unpack(version, wheel, "sglang")
        print(f"SGLang {version} unpacked in {source_folder(version, 'sglang')}")


def is_sglang(wheel: Path) -> bool:
    return wheel.name.startswith("sglang-")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, action="append", default=[],
                        help="a vLLM (or SGLang) wheel already downloaded (no network); may be given once per release")
    args = parser.parse_args(argv)
    given = {wheel_version(wheel): wheel for wheel in args.wheel if not is_sglang(wheel)}
    for version in RELEASES:
        if unpacked(version):
            print(f"vLLM {version} already in {source_folder(version)}")
            continue
        if args.wheel and version not in given:
            continue  # offline: only the releases whose wheels were given
        wheel = (given.get(version) or next(cache_folder().glob(f"vllm-{version}-*.whl"), None)
                 or download(version, cache_folder()))
        unpack(version, wheel)
        print(f"vLLM {version} unpacked in {source_folder(version)}")
    sglang_fetch(args.wheel)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
