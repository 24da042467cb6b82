"""The on-disk run cache: each finished run stored under ``cache_dir/<key[:2]>/<key>/``.

The key is :meth:`experiments.run_spec.RunSpec.key` (the spec, the files it names and the code
salt), so a killed sweep resumes where it stopped. Entries are written atomically (a temporary
folder renamed into place; concurrent sweeps storing the same run both succeed) and checked
against their manifest before they are trusted (a damaged entry is recomputed). ``wall_time_s``
is kept in an entry's ``meta.json``, not in its summary, so summaries are byte-identical whatever
ran them.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, TYPE_CHECKING

if TYPE_CHECKING:  # (pandas is imported where a frame is built)
    import pandas as pd

from pagesim.experiments.run_spec import RunFn, RunSpec, canonical_json, file_digest, simulate_spec
from pagesim.sim.outdir import naming, temporary_sibling

#: summary keys that vary from run to run of the same spec (moved to meta.json)
NONDETERMINISTIC_KEYS = ("wall_time_s",)
#: the file whose presence marks a complete cache entry, written last: each file's size and sha256
MANIFEST = "manifest.json"
#: meta.json's key naming the tables that had no rows, each with its columns and their dtypes in
#: order: no file is written for them (a file costs its write and the file system's bookkeeping,
#: and most of a sweep's runs record no steps), and a read gives back the same empty table
EMPTY_TABLES = "empty_tables"


@dataclass
class RunOutput:
    """What one run leaves: its summary (deterministic keys only), steps and requests tables."""

    summary: dict[str, Any]
    steps: "pd.DataFrame | None" = None
    requests: "pd.DataFrame | None" = None
    meta: dict[str, Any] = field(default_factory=dict)


def normalize_output(result: Any, tables: Iterable[str] = ("steps", "requests")) -> RunOutput:
    """Accept a SimResult-like object (``.summary/.steps/.requests``), a RunOutput, or a plain
    dict; of a SimResult only ``tables`` are read (its request table is built when read)."""
    if isinstance(result, RunOutput):
        out = result
    elif isinstance(result, dict):
        out = RunOutput(summary=dict(result))
    else:
        out = RunOutput(summary=dict(result.summary), **{t: getattr(result, t, None) for t in tables})
    summary = json.loads(canonical_json(out.summary))  # the same JSON round trip as the cache
    meta = dict(out.meta)
    for k in NONDETERMINISTIC_KEYS:
        if k in summary:
            meta[k] = summary.pop(k)
    return RunOutput(summary=summary, steps=out.steps, requests=out.requests, meta=meta)


def _has_arrow() -> bool:
    try:
        import pyarrow  # noqa: F401
        return True
    except ImportError:  # pragma: no cover
        return False


def default_cache_dir() -> Path:
    """``$PAGESIM_CACHE_DIR`` or ``~/.cache/pagesim/runs``."""
    env = os.environ.get("PAGESIM_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "pagesim" / "runs"


def cache_path(cache_dir: str | Path, key: str) -> Path:
    return Path(cache_dir) / key[:2] / key


def write_cache(cache_dir: str | Path, key: str, spec: RunSpec, out: RunOutput, *, replace: bool = False) -> Path:
    """Store one run, atomically and idempotently: its files are written into a temporary folder
    beside the entry, :data:`MANIFEST` last, and the folder is renamed into place. When another
    writer got there first with a complete entry, that entry stands (the same key is the same
    run) and this write succeeds; a damaged entry, or any entry when ``replace``, is moved aside
    and removed first. A write error names its file."""
    final = cache_path(cache_dir, key)
    tmp = temporary_sibling(final)
    meta = dict(out.meta)
    try:
        for name, df in (("steps", out.steps), ("requests", out.requests)):
            if df is None:
                continue
            if not len(df):  # (a run without step records: most of a sweep's) its columns alone, no file
                meta.setdefault(EMPTY_TABLES, {})[name] = [[str(c), str(t)] for c, t in df.dtypes.items()]
                continue
            if _has_arrow():
                with naming(tmp / f"{name}.feather"):
                    # Arrow's own file format (lz4-compressed): a figure's step tables are millions
                    # of rows, written and read back two to three times faster than parquet's
                    df.to_feather(tmp / f"{name}.feather")
            else:  # pragma: no cover
                with naming(tmp / f"{name}.csv.gz"):
                    df.to_csv(tmp / f"{name}.csv.gz", index=False)
        for name, obj in (("spec.json", spec.canonical()), ("meta.json", meta), ("summary.json", out.summary)):
            with naming(tmp / name):
                (tmp / name).write_text(canonical_json(obj) + "\n")
        manifest = {p.name: {"bytes": p.stat().st_size, "sha256": file_digest(p)} for p in sorted(tmp.iterdir())}
        with naming(tmp / MANIFEST):
            (tmp / MANIFEST).write_text(canonical_json({"files": manifest}) + "\n")
        _install(tmp, final, replace)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _install(tmp: Path, final: Path, replace: bool) -> None:
    """Rename the written folder ``tmp`` to ``final`` (see :func:`write_cache`)."""
    for _attempt in range(8):
        try:
            os.rename(tmp, final)
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if not replace and entry_is_complete(final):
            return
        aside = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:12]}"
        try:
            os.rename(final, aside)
        except FileNotFoundError:  # another writer moved it aside first
            pass
        shutil.rmtree(aside, ignore_errors=True)
        replace = False  # from now on an entry that appears is another writer's fresh one
    raise OSError(errno.EBUSY, "other writers keep replacing this cache entry", str(final))


def entry_is_complete(d: Path) -> bool:
    """Whether the cache entry ``d`` is whole and readable here: its :data:`MANIFEST` reads,
    every file it lists (the summary among them) has the size and sha256 it lists, and, where
    pyarrow is missing, no table is an Arrow file (a cache shared by two environments). A truncated or
    garbled table, a missing file or an emptied summary makes it incomplete: it is recomputed and
    rewritten in a form this environment reads."""
    try:
        files = json.loads((d / MANIFEST).read_text())["files"]
        if "summary.json" not in files or (not _has_arrow() and any(n.endswith(".feather") for n in files)):
            return False
        stats = tuple((name, *_identity((d / name).stat())) for name in [MANIFEST, *files])
        if _VERIFIED.get(d) == stats:  # checked by this process, and no file replaced since
            return True
        whole = all(st[0] == files[name]["bytes"] and file_digest(d / name) == files[name]["sha256"]
                    for name, *st in stats[1:])
        if whole:
            _VERIFIED[d] = stats
        return whole
    except (OSError, ValueError, KeyError, TypeError):
        return False


#: entries whose files this process has hashed, by the files' identities then: a figure reads its
#: runs' summaries, then their step tables, and each read checks the entry (hundreds of MB of
#: step tables hashed once, not twice)
_VERIFIED: dict[Path, tuple] = {}


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    """What changes when a file is rewritten or replaced: its size, mtime and inode."""
    return st.st_size, st.st_mtime_ns, st.st_ino


def entry_lacks(d: Path, tables: Iterable[str]) -> bool:
    """Whether the entry ``d`` exists without one of ``tables`` (``steps``, ``requests``)
    because the sweep that wrote it did not keep it (its ``meta.json``'s ``dropped_tables``:
    ``run_sweep``'s ``tables``); a table its run function never made is not lacking."""
    try:
        dropped = json.loads((d / "meta.json").read_text()).get("dropped_tables", [])
    except (OSError, ValueError, AttributeError):
        return False
    return any(t in dropped for t in tables)


def read_cached_summary(cache_dir: str | Path, key: str, tables: Iterable[str] = ()) -> dict[str, Any] | None:
    """The cached summary of ``key``, or None (a miss, also for an entry that is not complete:
    :func:`entry_is_complete`, or that lacks one of ``tables``: :func:`entry_lacks`)."""
    d = cache_path(cache_dir, key)
    if not entry_is_complete(d) or entry_lacks(d, tables):
        return None
    try:
        summary = json.loads((d / "summary.json").read_text())
    except (OSError, ValueError):  # replaced between the check and the read
        return None
    return summary if isinstance(summary, dict) else None


def load_cached(spec: RunSpec, cache_dir: str | Path | None = None, *, run_fn: RunFn | None = None,
                what: Iterable[str] = ("steps", "requests")) -> RunOutput | None:
    """A cached run (summary + the tables in ``what``), or None if it is not in the cache."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = spec.key(runner=runner_name(run_fn))
    summary = read_cached_summary(cache_dir, key)
    if summary is None:
        return None
    d = cache_path(cache_dir, key)
    out = RunOutput(summary=summary)
    try:
        out.meta = json.loads((d / "meta.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        pass
    import pandas as pd  # here: plan's and reproduce's parsers import this file

    empty = out.meta.get(EMPTY_TABLES, {}) if isinstance(out.meta, dict) else {}
    for name in what:
        if (d / f"{name}.feather").exists():
            setattr(out, name, pd.read_feather(d / f"{name}.feather"))
        elif (d / f"{name}.csv.gz").exists():
            setattr(out, name, pd.read_csv(d / f"{name}.csv.gz"))
        elif name in empty:
            setattr(out, name, pd.DataFrame({c: pd.Series(dtype=t) for c, t in empty[name]}))
    return out


@dataclass
class CommandTally:
    """A command's runs, by cache key: those it computed and those the cache answered instead
    (:func:`experiments.sweep.run_sweep` records both), by cache folder. ``recompute``
    (``--no-cache``): every run is computed once by the command, its later sweeps reusing what it
    computed, never an entry it found. Kept by the process that runs the command (``pid``), not
    by its pool's workers, which read back what it stored."""

    recompute: bool
    pid: int = field(default_factory=os.getpid)
    computed: set[str] = field(default_factory=set)
    answered: dict[Path, set[str]] = field(default_factory=dict)

    def line(self) -> str | None:
        """What the command says when the cache answered any of its runs (None when it did not)."""
        parts = []
        for folder, keys in self.answered.items():
            found = keys - self.computed
            if found:
                shown = f"~/{folder.relative_to(Path.home())}" if folder.is_relative_to(Path.home()) else str(folder)
                parts.append(f"{len(found)} of {len(found | self.computed)} runs came from the run cache {shown}")
        return "; ".join(parts) + ": --no-cache reruns them" if parts else None


_TALLY: list[CommandTally] = []


def command_tally() -> CommandTally | None:
    """The tally of the command this process runs (None for a library caller, or a pool worker)."""
    return _TALLY[0] if _TALLY and _TALLY[0].pid == os.getpid() else None


@contextmanager
def telling_cache_answers(recompute: bool):
    """Run a command that reads the run cache (``reproduce``, ``plan``): at its end, when the cache
    answered any of its runs (a cache shared by every checkout may hold runs another checkout or
    an earlier command made), one notice says how many, where, and that ``--no-cache``
    (``recompute``) reruns them."""
    _TALLY[:] = [CommandTally(recompute)]
    try:
        yield _TALLY[0]
        line = _TALLY[0].line()
        if line:
            logging.getLogger(__name__).info(line)
    finally:
        _TALLY.clear()


def runner_name(run_fn: RunFn | None) -> str | None:
    """The run function's part of a cache key: ``module:qualname``, or None for the default
    :func:`simulate_spec` (so its keys do not depend on where it lives). Moving a custom run
    function to another module changes its keys, i.e. its old cache entries are no longer found."""
    if run_fn is None or run_fn is simulate_spec:
        return None
    return f"{getattr(run_fn, '__module__', '?')}:{getattr(run_fn, '__qualname__', repr(run_fn))}"
