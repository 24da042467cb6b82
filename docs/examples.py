"""Every shell example in README and the documentation site, found and run.

``python3 docs/examples.py`` runs each shell block of every page as a user would paste it: one
``bash -e`` script per block, in page order, in a scratch folder that has the real traces at
``../shared`` (as a checkout beside ``shared/`` has), so a block that writes a file a later
line reads works as written, and in a terminal of 100 columns (``COLUMNS=100``): a block
fails if it exits non-zero or prints a line wider than that (data for programs, a ``--json``
line, is exempt). It prints one line per block (ok,
failed, or skipped with the reason: a block needing a CUDA GPU where there is none, one cloning
from the network) and exits 1 if any failed. It takes minutes (every example at its full size), so CI runs the quick
check instead: ``tests/test_docs.py`` parses every ``pagesim`` command shown with the real
parser. Run this one when the examples or the options change, and before a release.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
SHELL = ("bash", "sh", "console")  # every block names its language (tests/test_docs.py)
ENVIRONMENT_PREFIX = re.compile(r"[A-Z_][A-Z0-9_]*=\S*")


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{line}"


def code_blocks(path: Path) -> list[tuple[int, str, list[str]]]:
    """(first line number, language, lines) of every fenced block in a Markdown file."""
    blocks, current = [], None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence and current is None:
            current = (number + 1, fence.group(2), [])
        elif fence:
            blocks.append(current)
            current = None
        elif current is not None:
            current[2].append(line.strip())
    if current is not None:
        raise ValueError(f"{where(path, current[0] - 1)}: a code block is never closed")
    return blocks


def shell_blocks(path: Path) -> list[tuple[int, list[str]]]:
    """(first line, lines) of the blocks a user would paste into a shell."""
    return [(first, lines) for first, language, lines in code_blocks(path) if language in SHELL]


def commands(path: Path) -> list[tuple[str, list[str]]]:
    """('file:line', argv) of every ``pagesim`` command in the file's shell blocks, continuation
    lines joined, comments and leading ``VAR=value`` settings dropped."""
    found = []
    for first, lines in shell_blocks(path):
        joined, start = "", first
        for offset, line in enumerate(lines):
            if not joined:
                start = first + offset
            joined += line[:-1] + " " if line.endswith("\\") else line
            if line.endswith("\\"):
                continue
            command, joined = joined, ""
            if not re.match(r"([A-Z_][A-Z0-9_]*=\S*\s+)*pagesim\s", command):
                continue  # another program, or a here-document's body
            words = shlex.split(command, comments=True)
            while words and ENVIRONMENT_PREFIX.fullmatch(words[0]):
                words = words[1:]
            found.append((where(path, start), words[1:]))
    return found


def is_json(line: str) -> bool:
    """A line of data for programs (``--json``), which the width rule leaves as it is."""
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def skip_reason(lines: list[str], has_gpu: bool) -> str | None:
    """Why a block is not run here: it says so on its first line (``# needs: ...``, for a file
    only the user has), it clones or installs, or it needs a GPU this machine lacks."""
    text = "\n".join(lines)
    if lines[0].startswith("# needs:"):
        return lines[0].removeprefix("# needs:").strip()
    if "git clone" in text:
        return "clones from the network"
    if "pip install" in text:
        return "installs: README's two commands are run from a clean clone"
    if not has_gpu and re.search(r"pagesim (gpu|validate) (?!--against)(?!.*--backend fake)", text):
        return "needs a CUDA GPU"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run only the pages whose path contains this")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per block")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--width", type=int, default=100, help="the terminal's columns: no line wider")
    args = parser.parse_args(argv)
    has_gpu = shutil.which("nvidia-smi") is not None
    scratch = Path(tempfile.mkdtemp(prefix="pagesim-examples-"))
    work = scratch / "work"
    work.mkdir()
    if (ROOT.parent / "shared").is_dir():
        (scratch / "shared").symlink_to(ROOT.parent / "shared", target_is_directory=True)
    failed = 0
    for page in pages():
        if args.only not in str(page.relative_to(ROOT)):
            continue
        for first, lines in shell_blocks(page):
            reason = skip_reason(lines, has_gpu)
            if reason:
                print(f"skipped  {where(page, first)}  ({reason})", flush=True)
                continue
            start = time.perf_counter()
            try:
                p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", "\n".join(lines)], cwd=work,
                                   capture_output=True, text=True, timeout=args.timeout,
                                   env={**os.environ, "COLUMNS": str(args.width)})
                ok, detail = p.returncode == 0, (p.stderr.strip().splitlines() or [""])[-1]
                wide = [line for line in (p.stdout + p.stderr).splitlines()
                        if len(line) > args.width and not is_json(line)]
                if ok and wide:
                    ok, detail = False, f"{len(wide)} lines wider than {args.width}: {max(wide, key=len)[:80]}..."
            except subprocess.TimeoutExpired:
                ok, detail = False, f"still running after {args.timeout:.0f} s"
            failed += not ok
            print(f"{'ok' if ok else 'FAILED':8} {where(page, first)}  {time.perf_counter() - start:.1f} s"
                  + ("" if ok else f"  {detail}"), flush=True)
    if args.keep:
        print(f"scratch folder: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
