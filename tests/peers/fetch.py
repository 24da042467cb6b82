"""Fetch the peer engines: ``python -m tests.peers.fetch [--wheel PATH ...]``.

Downloads each vLLM release the peers drive (0.4.2: ``vllm_v0.py``; 0.33.0: ``vllm_v1.py``) with
pip (``--no-deps``: the peers import vLLM's scheduler alone, with stubs for the rest) into the
cache folder, ``~/.cache/pagesim-peers`` or ``$PAGESIM_PEERS``, and unpacks its Python sources
there (``vllm-<version>/vllm/...``). The compiled extensions (most of each wheel) are left out:
nothing a scheduler runs on CPU loads them. ``--wheel`` takes a wheel already on disk (offline).
A no-op for a release already unpacked.

nano-vllm (``nano_vllm.py``): its ``nanovllm/`` package at one commit (``NANO_VLLM_COMMIT``), from
GitHub's archive of that commit, or (offline) ``--nano-vllm DIR``, a checkout or ``git archive``
export of it, into ``nano-vllm-<short commit>/``. DistServe's simulator
(``benchmarks/distserve_peer.py``) the same way: its ``simdistserve/`` at ``DISTSERVE.commit``,
``--distserve DIR`` offline, into ``distserve-<short commit>/``.
SGLang 0.5.23 (``sglang_radix.py``: its radix cache) the same way: ``sglang-<version>/sglang/...``;
``--wheel`` takes its wheel too.

The wheels come first, and a wheel that cannot be downloaded raises; a GitHub archive that cannot
be (a machine that reaches only package registries) is said in one line, the others fetched, and
the exit status is 1 (``.ci/run`` then requires the wheels' engines alone). ``--registry-only``:
the wheels alone.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
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


def download(version: str, folder: Path, package: str = "vllm") -> Path:
    platform = (SGLANG_RELEASES if package == "sglang" else RELEASES)[version]
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--platform", platform, "--python-version", "3.11", f"{package}=={version}",
                    "-d", str(folder)], check=True)
    return next(folder.glob(f"{package}-{version}-*.whl"))


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


class GitHubPackage:
    """A peer's package at one pinned commit of its GitHub repository (nano-vllm's engine,
    DistServe's simulator): its ``package`` folder, copied from a checkout or export of that
    commit or downloaded from GitHub's archive of it, into ``<name>-<short commit>/``."""

    def __init__(self, name: str, repo: str, commit: str, package: str, marker: str):
        self.name, self.repo, self.commit, self.package = name, repo, commit, package
        self.marker = marker  # a file of the package's that a right checkout has (its path inside)

    def folder(self) -> Path:
        """Where ``import <package>`` finds the pinned commit's package."""
        return cache_folder() / f"{self.name}-{self.commit[:7]}"

    def fetch(self, checkout: Path | None, offline: bool) -> None:
        """Copied from ``checkout`` (a git checkout of the commit, or an export of it), else
        downloaded unless ``offline``."""
        target, short = self.folder(), self.commit[:7]
        if (target / ".unpacked").exists():  # written last, as for vLLM's releases
            print(f"{self.name} {short} already in {target}")
            return
        if checkout is not None:
            if not (checkout / self.package / self.marker).is_file():
                raise SystemExit(f"--{self.name} {checkout}: no {self.package}/{self.marker} there")
            if (checkout / ".git").exists():  # an export cannot say its commit; a checkout can
                head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                                      text=True, check=True).stdout.strip()
                if head != self.commit:
                    raise SystemExit(f"--{self.name} {checkout} is at {head}, not {self.commit}: git checkout it")
            shutil.copytree(checkout / self.package, target / self.package, dirs_exist_ok=True)
            source = str(checkout)
        elif offline:
            return  # offline, and no checkout given: only what was given
        else:
            source = f"https://codeload.github.com/{self.repo}/tar.gz/{self.commit}"
            with urllib.request.urlopen(source, timeout=120) as response:
                archive = tarfile.open(fileobj=io.BytesIO(response.read()))
            # its one top folder (<repo>-<commit>/) dropped: the package lands at target/<package>
            members = []
            for member in archive.getmembers():
                parts = Path(member.name).parts
                if len(parts) > 1 and parts[1] == self.package and (member.isfile() or member.isdir()):
                    member.name = str(Path(*parts[1:]))
                    members.append(member)
            archive.extractall(target, members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        (target / ".unpacked").write_text(f"{self.commit} {source}\n")
        print(f"{self.name} {short} in {target}")


# nano-vllm's commit the peer drives (nano_vllm.py cites its source lines at it)
NANO_VLLM = GitHubPackage("nano-vllm", "GeeeekExplorer/nano-vllm", "bb823b3e06983d71485a8e1f23715ebd87d98ef8",
                          "nanovllm", "engine/scheduler.py")
NANO_VLLM_COMMIT = NANO_VLLM.commit
# DistServe's simulator (simdistserve: its own vLLM and DistServe engines over profiled A100 step
# times), for benchmarks/distserve_peer.py; Apache-2.0, as the repository's LICENSE
DISTSERVE = GitHubPackage("distserve", "LLMServe/DistServe", "82831f1604cc6b10bebd360f6c437a07790dde9f",
                          "simdistserve", "benchmarks/simulate_dist.py")


def nano_vllm_folder() -> Path:
    """Where ``import nanovllm`` finds the pinned commit's package (nano_vllm.PEER)."""
    return NANO_VLLM.folder()


# -- SGLang: its radix cache (sglang_radix.py) ------------------------------------------------------
SGLANG_RELEASES = {"0.5.23": "manylinux_2_34_x86_64"}  # its only wheels are CPython 3.11 ones


def sglang_fetch(wheels: list, offline: bool) -> None:
    """Every SGLang release the peers drive, from the wheels given (``offline``: only those) or pip."""
    given = {}
    for wheel in wheels:
        found = re.match(r"sglang-([^-]+)-", wheel.name)
        if found and found.group(1) in SGLANG_RELEASES:
            given[found.group(1)] = wheel
    for version in SGLANG_RELEASES:
        if unpacked(version, "sglang"):
            print(f"SGLang {version} already in {source_folder(version, 'sglang')}")
            continue
        if offline and version not in given:
            continue
        wheel = (given.get(version) or next(cache_folder().glob(f"sglang-{version}-*.whl"), None)
                 or download(version, cache_folder(), "sglang"))
        unpack(version, wheel, "sglang")
        print(f"SGLang {version} unpacked in {source_folder(version, 'sglang')}")


def is_sglang(wheel: Path) -> bool:
    return wheel.name.startswith("sglang-")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, action="append", default=[],
                        help="a vLLM or SGLang wheel already downloaded (no network); once per release")
    parser.add_argument("--nano-vllm", type=Path, metavar="DIR",
                        help=f"a checkout or export of nano-vllm at {NANO_VLLM_COMMIT[:7]} (no network)")
    parser.add_argument("--distserve", type=Path, metavar="DIR",
                        help=f"a checkout or export of DistServe at {DISTSERVE.commit[:7]} (no network)")
    parser.add_argument("--registry-only", action="store_true",
                        help="only the engines pip downloads (vLLM's and SGLang's wheels), no GitHub archive")
    args = parser.parse_args(argv)
    offline = bool(args.wheel or args.nano_vllm or args.distserve)  # a source given: fetch only what was given
    # the wheels first (pip; its failure raises): a GitHub archive that cannot be downloaded
    # (a machine that reaches only package registries) then leaves them fetched
    given = {wheel_version(wheel): wheel for wheel in args.wheel if not is_sglang(wheel)}
    for version in RELEASES:
        if unpacked(version):
            print(f"vLLM {version} already in {source_folder(version)}")
            continue
        if offline and version not in given:
            continue  # offline: only the releases whose wheels were given
        wheel = (given.get(version) or next(cache_folder().glob(f"vllm-{version}-*.whl"), None)
                 or download(version, cache_folder()))
        unpack(version, wheel)
        print(f"vLLM {version} unpacked in {source_folder(version)}")
    sglang_fetch(args.wheel, offline)
    if args.registry_only:
        return 0
    unreached = 0
    for package, checkout in ((NANO_VLLM, args.nano_vllm), (DISTSERVE, args.distserve)):
        try:
            package.fetch(checkout, offline)
        except OSError as error:  # urllib's URLError among them: no route to GitHub
            unreached += 1
            print(f"fetch: {package.name} {package.commit[:7]} not downloaded: {getattr(error, 'reason', error)}\n"
                  f"fetch: --{package.name} DIR copies it from a checkout of that commit", file=sys.stderr)
    return 1 if unreached else 0


if __name__ == "__main__":
    raise SystemExit(main())
