"""Output folders that are never seen half-written, and write errors that name their file.

A run's folder is judged complete by its ``summary.json``; written in place, a full disk could
leave a complete-looking folder with a truncated ``steps.csv``. :func:`staged_folder` has the
files written into a temporary folder beside the destination and moves them in only once every
one of them was written. :func:`naming` gives an ``OSError`` raised while writing (``No space left
on device`` comes without a file name) the name of the file being written, so ``pagesim`` can
say which one.
"""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: written last into an existing folder: its presence marks the folder complete
COMPLETE_MARKER = "summary.json"
#: the names the last staged write put in a folder, one a line: the next write into it removes
#: those it does not write again (a report.html of an earlier run with --report), never another file
WRITTEN_LIST = ".pagesim-written"


@contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Re-raise an ``OSError`` without a file name as one naming ``path``."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise


def temporary_sibling(final: Path) -> Path:
    """A fresh hidden folder in ``final``'s parent (the same file system, so a rename is atomic)."""
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:  # named by the folder asked for, not by the hidden one beside it
        raise OSError(e.errno, e.strerror, str(final)) from e
    return tmp


@contextmanager
def staged_folder(final: str | Path) -> Iterator[Path]:
    """Yield a temporary folder to write into; when the block ends without an error, its files
    become ``final``'s (a rename when ``final`` does not exist; else each file replaces its
    namesake, :data:`COMPLETE_MARKER` removed first and moved last, the files the last staged
    write left there that this one does not write removed (:data:`WRITTEN_LIST`), other files
    left alone).
    On an error the temporary folder is removed, ``final`` is left as it was, and an OSError
    about a file in the temporary folder names the file's place in ``final`` instead."""
    final = Path(final)
    if final.exists() and not final.is_dir():
        raise NotADirectoryError(20, "exists and is not a folder", str(final))
    tmp = temporary_sibling(final)
    try:
        try:
            yield tmp
        except OSError as e:
            if e.filename and Path(e.filename).parent == tmp:
                raise OSError(e.errno, e.strerror, str(final / Path(e.filename).name)) from e
            raise
        names = sorted(p.name for p in tmp.iterdir())
        (tmp / WRITTEN_LIST).write_text("".join(f"{name}\n" for name in names))
        _move_in(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_in(tmp: Path, final: Path) -> None:
    try:
        os.rename(tmp, final)
        return
    except OSError:
        if not final.is_dir():
            raise
    names = sorted(p.name for p in tmp.iterdir())
    stale = set(_written_before(final)) - set(names)
    # the marker moved in last and the list just before it: a write that fails midway leaves the
    # folder unmarked and its old list naming what the last complete write left
    last = [name for name in (WRITTEN_LIST, COMPLETE_MARKER) if name in names]
    if COMPLETE_MARKER in names:
        (final / COMPLETE_MARKER).unlink(missing_ok=True)
    for name in [name for name in names if name not in last]:
        with naming(final / name):
            os.replace(tmp / name, final / name)
    for name in sorted(stale):
        path = final / name
        if path.is_file() or path.is_symlink():  # (a folder of that name: not this list's to remove)
            with naming(path):
                path.unlink(missing_ok=True)
    for name in last:
        with naming(final / name):
            os.replace(tmp / name, final / name)


def _written_before(final: Path) -> list[str]:
    """The names :data:`WRITTEN_LIST` in ``final`` gives (none where it is missing or unreadable),
    each a plain name of that folder's own, never a path."""
    try:
        text = (final / WRITTEN_LIST).read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [name for name in text.splitlines()
            if name and name not in (".", "..") and "/" not in name and os.sep not in name and "\x00" not in name]
