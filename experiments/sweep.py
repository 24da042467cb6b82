"""Sweeps: a declarative grid of runs, executed in parallel, each run cached on disk.

An experiment is a TOML config plus a small Python module (``experiments/figures/<fig>.py``)::

    [experiment]
    name = "fig13"

    [base]                 # settings every run shares (SimConfig fields and workload fields)
    model = "opt-13b"
    kv_gib = 12
    duration_s = 600

    [grid]                 # the cartesian product of these lists
    system = ["orca-max", "orca-pow2", "orca-oracle", "vllm"]

    [[cases]]              # optional: each case is crossed with the grid (zipped settings)
    workload = "sharegpt"
    rate = 2.0
    [[cases]]
    workload = "alpaca"
    rate = 30.0

    [quick]                # optional overrides for --quick (same layout: base keys, [quick.grid], [[quick.cases]])
    duration_s = 60

Keys are routed by name: :data:`WORKLOAD_KEYS` go to the workload (``traces.synth.make_workload``),
everything else must be a :class:`sim.config.SimConfig` field (``seed`` goes to both).

:func:`run_sweep` runs a list of :class:`RunSpec` locally (``ProcessPoolExecutor``) or on Ray.
Each finished run is stored under ``cache_dir/<sha256[:2]>/<sha256>/`` where the hash is over the
canonical JSON of the full spec, the contents of the files it names (a model's config.json, a
profile) and :data:`CODE_SALT` (the package version and a hash of the ``sim/`` and ``traces/``
sources, so editing the engine invalidates old results), so a killed sweep resumes where it
stopped. Entries are written atomically (a temporary folder renamed into place; concurrent sweeps
storing the same run both succeed) and checked against their manifest before they are trusted (a
damaged entry is recomputed). Results come back in spec order and, apart from ``wall_time_s``
(kept in the cache's ``meta.json``, not in the summary), are byte-identical whatever the worker
count.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import dataclasses
import errno
import hashlib
import itertools
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from pagesim.sim.errors import ConfigError
from pagesim.sim.outdir import naming, temporary_sibling

#: keys that describe the workload rather than the simulated system
WORKLOAD_KEYS = ("workload", "rate", "duration_s", "num_requests", "seed", "n", "beam_width", "unshare")
#: summary keys that vary from run to run of the same spec (moved to meta.json)
NONDETERMINISTIC_KEYS = ("wall_time_s",)
#: bump to invalidate every cache entry when the cache layout or the run semantics change
#: (2: entries carry a manifest of their files' sizes and hashes)
CACHE_FORMAT = 2
#: SimConfig settings that may name a file (a model's config.json, a measured profile): the
#: file's contents are part of a run's cache key
FILE_SETTINGS = ("model", "profile")
#: the file whose presence marks a complete cache entry, written last: each file's size and sha256
MANIFEST = "manifest.json"

RunFn = Callable[["RunSpec"], Any]


# --------------------------------------------------------------------------------------------
# specs and grids


@dataclass
class RunSpec:
    """One simulation: SimConfig settings (``system`` plus overrides) and the workload.

    ``unshare=True`` asks for the same requests with every parallel-sampling / beam sequence as its
    own independent request (the no-sharing baseline of Fig. 15); see :func:`unshare_trace`.
    """

    system: str = "vllm"
    sim: dict[str, Any] = field(default_factory=dict)
    workload: str = "sharegpt"
    rate: float = 1.0
    duration_s: float | None = None
    num_requests: int | None = None
    seed: int = 0
    n: int = 1
    beam_width: int = 1
    unshare: bool = False

    def canonical(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["sim"] = {k: d["sim"][k] for k in sorted(d["sim"])}
        d["rate"] = float(d["rate"])
        if d["duration_s"] is not None:
            d["duration_s"] = float(d["duration_s"])
        return d

    def key(self, salt: str | None = None, runner: str | None = None) -> str:
        """sha256 of the canonical JSON of this spec, the code salt, (if not default) the runner,
        and the contents of the files its settings name (:data:`FILE_SETTINGS`): editing a model's
        config.json or a profile makes a new key, as the same path would otherwise return the
        stale run."""
        payload = {"spec": self.canonical(), "salt": CODE_SALT() if salt is None else salt,
                   "format": CACHE_FORMAT}
        if runner:
            payload["runner"] = runner
        files = {k: file_digest(self.sim[k]) for k in FILE_SETTINGS
                 if isinstance(self.sim.get(k), str) and Path(self.sim[k]).is_file()}
        if files:
            payload["files"] = files
        return hashlib.sha256(canonical_json(payload).encode()).hexdigest()

    def sim_config(self):
        """The :class:`sim.config.SimConfig` (raises ConfigError on a bad setting)."""
        from pagesim.sim.config import SimConfig
        return SimConfig.for_system(self.system, seed=self.seed, **self.sim)

    def workload_kwargs(self) -> dict[str, Any]:
        return dict(rate=self.rate, duration_s=self.duration_s, num_requests=self.num_requests,
                    seed=self.seed, n=self.n, beam_width=self.beam_width)

    def params(self) -> dict[str, Any]:
        """A flat dict for result tables (system, workload fields, then sim overrides)."""
        d = {"system": self.system, "workload": self.workload, "rate": self.rate,
             "duration_s": self.duration_s, "num_requests": self.num_requests, "seed": self.seed,
             "n": self.n, "beam_width": self.beam_width, "unshare": self.unshare}
        d.update(self.sim)
        return d

    def label(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in sorted(self.sim.items()) if k not in _BASE_HIDE)
        w = f" n={self.n}" if self.n > 1 else ""
        w += f" beam={self.beam_width}" if self.beam_width > 1 else ""
        w += " unshared" if self.unshare else ""
        return f"{self.system} {self.workload}@{self.rate:g}{w}{extra}"


_BASE_HIDE = {"model", "gpu", "kv_gib", "max_seq_len", "max_len_policy"}


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no spaces, NaN kept as NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)


def _json_default(o: Any):
    try:
        import numpy as np
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.bool_):
            return bool(o)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON-serializable: {type(o).__name__}")


def file_digest(path: str | Path) -> str:
    """sha256 (first 16 hex digits) of a file's contents."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def _source_hash() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pkg in ("sim", "traces"):
        # and the calibrated cost model's constants (sim/data/calibration)
        for p in sorted([*(root / pkg).rglob("*.py"), *(root / pkg).rglob("*.toml")]):
            if "__pycache__" in p.parts or p.name.endswith("_cli.py") or p.name == "cli.py":
                continue
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def CODE_SALT() -> str:  # noqa: N802 (reads like the constant it stands for)
    """The code-version salt of cache keys: ``$PAGESIM_CACHE_SALT`` or version + source hash."""
    env = os.environ.get("PAGESIM_CACHE_SALT")
    if env:
        return env
    from pagesim.sim import __version__
    return f"{__version__}+{_source_hash()}"


def load_experiment(path_or_name: str | Path) -> dict[str, Any]:
    """Read an experiment TOML: a path, or a name in ``experiments/configs`` (``"fig13"``)."""
    import tomllib
    p = Path(path_or_name)
    if not p.suffix:
        p = Path(__file__).resolve().parent / "configs" / f"{path_or_name}.toml"
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: experiment config not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML ({e})") from None


def apply_overrides(config: dict[str, Any], *, quick: bool = False, scale: float = 1.0,
                    **base: Any) -> dict[str, Any]:
    """A copy of ``config`` with its ``[quick]`` table merged (when ``quick``), ``duration_s`` and
    ``num_requests`` multiplied by ``scale`` everywhere, and ``base`` keys set (``None`` ignored)."""
    import copy
    cfg = copy.deepcopy(config)
    cfg.setdefault("base", {})
    cfg.setdefault("grid", {})
    if quick and "quick" in cfg:
        q = cfg["quick"]
        for k, v in q.items():
            if k == "grid":
                cfg["grid"].update(v)
            elif k == "cases":
                cfg["cases"] = v
            else:
                cfg["base"][k] = v
    cfg.pop("quick", None)
    cfg["base"].update({k: v for k, v in base.items() if v is not None})
    if scale != 1.0:
        if scale <= 0:
            raise ConfigError(f"scale must be > 0, got {scale}")
        for table in [cfg["base"], *cfg.get("cases", [])]:
            for k in ("duration_s", "num_requests"):
                if table.get(k) is not None:
                    v = table[k] * scale
                    table[k] = max(1, round(v)) if k == "num_requests" else float(v)
    return cfg


def expand_grid(config: dict[str, Any]) -> list[RunSpec]:
    """The runs of an experiment config: ``base`` x each of ``cases`` x the product of ``grid``.

    A list value inside a case is a grid dimension of that case only (e.g. per-workload rates).
    Precedence: base < case < grid. Order: cases outermost, then the case's list keys, then grid
    keys in the order written (last varies fastest).
    """
    from pagesim.sim.config import SimConfig
    sim_fields = {f.name for f in dataclasses.fields(SimConfig)}
    base = dict(config.get("base", {}))
    grid = config.get("grid", {})
    cases = config.get("cases") or [{}]
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"grid '{k}' must be a non-empty list, got {v!r}")
    keys = list(grid)
    specs: list[RunSpec] = []
    for case in cases:
        case_keys = [k for k, v in case.items() if isinstance(v, list)]
        fixed = {k: v for k, v in case.items() if k not in case_keys}
        for case_combo in itertools.product(*(case[k] for k in case_keys)):
            for combo in itertools.product(*(grid[k] for k in keys)):
                values = {**base, **fixed, **dict(zip(case_keys, case_combo)), **dict(zip(keys, combo))}
                specs.append(spec_from_settings(values, sim_fields))
    return specs


def spec_from_settings(values: dict[str, Any], sim_fields: set[str] | None = None) -> RunSpec:
    """Route a flat dict of settings to a :class:`RunSpec` (unknown keys raise ConfigError)."""
    if sim_fields is None:
        from pagesim.sim.config import SimConfig
        sim_fields = {f.name for f in dataclasses.fields(SimConfig)}
    values = {k.replace("-", "_"): v for k, v in values.items()}
    system = values.pop("system", "vllm")
    wl = {k: values.pop(k) for k in WORKLOAD_KEYS if k in values}
    bad = [k for k in values if k not in sim_fields]
    if bad:
        raise ConfigError(f"unknown setting(s) {', '.join(sorted(bad))} in experiment config; "
                          f"valid: {', '.join(sorted(set(sim_fields) | set(WORKLOAD_KEYS)))}")
    values.pop("seed", None)
    return RunSpec(system=system, sim=values, workload=wl.get("workload", "sharegpt"),
                   rate=float(wl.get("rate", 1.0)), duration_s=wl.get("duration_s"),
                   num_requests=wl.get("num_requests"), seed=int(wl.get("seed", 0)),
                   n=int(wl.get("n", 1)), beam_width=int(wl.get("beam_width", 1)),
                   unshare=bool(wl.get("unshare", False)))


# --------------------------------------------------------------------------------------------
# the default run function


def unshare_trace(trace: pd.DataFrame) -> pd.DataFrame:
    """Every request with ``n`` parallel samples or ``beam_width`` beams becomes that many
    independent single-sequence requests (same arrival, prompt and output lengths): the
    no-sharing baseline of Fig. 15 (each sequence holds its own copy of the prompt's KV)."""
    width = trace[["n", "beam_width"]].max(axis=1).astype(int)
    out = trace.loc[trace.index.repeat(width)].copy()
    copy_no = out.groupby(level=0).cumcount()
    out["request_id"] = out["request_id"].astype(str) + "#" + copy_no.astype(str)
    out["n"] = 1
    out["beam_width"] = 1
    return out.reset_index(drop=True)


def simulate_spec(spec: RunSpec):
    """The default run function: build the synthetic trace, run the engine, return its SimResult."""
    from pagesim.sim.run import run_simulation
    from pagesim.traces import shared_prefix
    from pagesim.traces.synth import make_workload
    if spec.workload == "chatbot":  # Fig. 17's conversations (traces/chatbot.py)
        from pagesim.traces.chatbot import chatbot_workload
        if spec.n > 1 or spec.beam_width > 1:
            raise ConfigError(f"workload 'chatbot' has one sequence per request; got n={spec.n}, "
                              f"beam_width={spec.beam_width}")
        trace = chatbot_workload(spec.rate, spec.duration_s, spec.num_requests, spec.seed)
    elif spec.workload in shared_prefix.WORKLOADS:  # Fig. 16's few-shot translation
        trace = shared_prefix.make_workload(spec.workload, **spec.workload_kwargs())
    else:
        trace = make_workload(spec.workload, **spec.workload_kwargs())
    if spec.unshare:
        trace = unshare_trace(trace)
    return run_simulation(spec.sim_config(), trace, progress=False)


# --------------------------------------------------------------------------------------------
# the cache


@dataclass
class RunOutput:
    """What one run leaves: its summary (deterministic keys only), steps and requests tables."""

    summary: dict[str, Any]
    steps: pd.DataFrame | None = None
    requests: pd.DataFrame | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def _normalize(result: Any) -> RunOutput:
    """Accept a SimResult-like object (``.summary/.steps/.requests``), a RunOutput, or a plain dict."""
    if isinstance(result, RunOutput):
        out = result
    elif isinstance(result, dict):
        out = RunOutput(summary=dict(result))
    else:
        out = RunOutput(summary=dict(result.summary), steps=getattr(result, "steps", None),
                        requests=getattr(result, "requests", None))
    summary = json.loads(canonical_json(out.summary))  # the same JSON round trip as the cache
    meta = dict(out.meta)
    for k in NONDETERMINISTIC_KEYS:
        if k in summary:
            meta[k] = summary.pop(k)
    return RunOutput(summary=summary, steps=out.steps, requests=out.requests, meta=meta)


def _has_parquet() -> bool:
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
    try:
        for name, df in (("steps", out.steps), ("requests", out.requests)):
            if df is None:
                continue
            if _has_parquet():
                with naming(tmp / f"{name}.parquet"):
                    # no dictionary pages: a quarter less CPU for step tables, whose columns
                    # have too many distinct values for dictionaries (the same frame reads back)
                    df.to_parquet(tmp / f"{name}.parquet", index=False, use_dictionary=False)
            else:  # pragma: no cover
                with naming(tmp / f"{name}.csv.gz"):
                    df.to_csv(tmp / f"{name}.csv.gz", index=False)
        for name, obj in (("spec.json", spec.canonical()), ("meta.json", out.meta), ("summary.json", out.summary)):
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
    pyarrow is missing, no table is parquet (a cache shared by two environments). A truncated or
    garbled table, a missing file or an emptied summary makes it incomplete: it is recomputed and
    rewritten in a form this environment reads."""
    try:
        files = json.loads((d / MANIFEST).read_text())["files"]
        if "summary.json" not in files or (not _has_parquet() and any(n.endswith(".parquet") for n in files)):
            return False
        return all((d / name).stat().st_size == f["bytes"] and file_digest(d / name) == f["sha256"]
                   for name, f in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def read_cached_summary(cache_dir: str | Path, key: str) -> dict[str, Any] | None:
    """The cached summary of ``key``, or None (a miss, also for an entry that is not complete:
    :func:`entry_is_complete`)."""
    d = cache_path(cache_dir, key)
    if not entry_is_complete(d):
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
    for name in what:
        if (d / f"{name}.parquet").exists():
            setattr(out, name, pd.read_parquet(d / f"{name}.parquet"))
        elif (d / f"{name}.csv.gz").exists():
            setattr(out, name, pd.read_csv(d / f"{name}.csv.gz"))
    return out


def runner_name(run_fn: RunFn | None) -> str | None:
    """The run function's part of a cache key: ``module:qualname``, or None for the default
    :func:`simulate_spec` (so its keys do not depend on where it lives). Moving a custom run
    function to another module changes its keys, i.e. its old cache entries are no longer found."""
    if run_fn is None or run_fn is simulate_spec:
        return None
    return f"{getattr(run_fn, '__module__', '?')}:{getattr(run_fn, '__qualname__', repr(run_fn))}"


_runner_name = runner_name  # the old private name


# --------------------------------------------------------------------------------------------
# running


def _execute(spec: RunSpec, run_fn: RunFn) -> RunOutput:
    t0 = time.perf_counter()
    out = _normalize(run_fn(spec))
    out.meta.setdefault("wall_time_s", time.perf_counter() - t0)
    out.meta["label"] = spec.label()
    return out


def _execute_and_store(spec: RunSpec, run_fn: RunFn, cache_dir: Path, key: str, replace: bool) -> RunOutput:
    """A pool worker's job: run ``spec`` and store its cache entry there, so that the workers
    write their entries side by side and the step tables (up to ~100 MB for a 1-hour run) never
    travel back through the pool's pipe; returns the summary and meta only."""
    out = _execute(spec, run_fn)
    write_cache(cache_dir, key, spec, out, replace=replace)
    return RunOutput(summary=out.summary, meta=out.meta)


def run_sweep(specs: list[RunSpec], executor: str = "local", workers: int | None = None,
              cache_dir: str | Path | None = None, progress: bool = True, address: str | None = None,
              *, run_fn: RunFn | None = None, use_cache: bool = True) -> list[dict[str, Any]]:
    """Run ``specs`` and return their summaries in spec order.

    executor: ``"local"`` (a ``ProcessPoolExecutor``; ``workers=1`` runs in this process) or
        ``"ray"`` (joins ``address`` when given, else starts or reuses a local Ray).
    workers: parallel runs (default ``min(os.cpu_count(), runs to do)``).
    cache_dir: where finished runs are stored (default :func:`default_cache_dir`); runs found there
        are not rerun. ``use_cache=False`` reruns everything and overwrites the entries.
    run_fn: ``spec -> SimResult-like | RunOutput | summary dict`` (default :func:`simulate_spec`);
        it must be picklable (a module-level function) unless ``workers=1``.
    """
    if executor not in ("local", "ray"):
        raise ConfigError(f"unknown executor '{executor}'; valid: local, ray")
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    run_fn = run_fn or simulate_spec
    runner = runner_name(run_fn)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    keys = [s.key(runner=runner) for s in specs]
    results: list[dict[str, Any] | None] = [None] * len(specs)
    todo: dict[str, list[int]] = {}  # key -> indices (identical specs run once)
    for i, k in enumerate(keys):
        cached = read_cached_summary(cache_dir, k) if use_cache else None
        if cached is not None:
            results[i] = cached
        else:
            todo.setdefault(k, []).append(i)

    bar = _progress_bar(len(specs), len(specs) - sum(len(v) for v in todo.values()), progress)

    def finish(key: str, out: RunOutput, stored: bool = False) -> None:
        if not stored:
            write_cache(cache_dir, key, specs[todo[key][0]], out, replace=not use_cache)
        for i in todo[key]:
            results[i] = out.summary
        bar.update(len(todo[key]))
        bar.set_postfix_str(out.meta.get("label", ""), refresh=False)

    try:
        if todo:
            n = workers or min(os.cpu_count() or 1, len(todo))
            if executor == "ray":
                _run_ray(todo, specs, run_fn, n, address, finish)
            elif n == 1 or len(todo) == 1:
                for key, idx in todo.items():
                    finish(key, _execute(specs[idx[0]], run_fn))
            else:
                _run_pool(todo, specs, run_fn, n, finish, cache_dir, replace=not use_cache)
    finally:
        bar.close()
    return results  # type: ignore[return-value]


def _progress_bar(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, disable=not enabled, unit="run", desc="sweep",
                dynamic_ncols=True, leave=True)


_POOL: list = []  # (workers, ProcessPoolExecutor): one pool serves every sweep of a process


def _shared_pool(n: int) -> cf.ProcessPoolExecutor:
    """A pool of ``n`` worker processes, kept for the next sweep: ``reproduce all`` runs five
    figures' sweeps, and each new pool's workers would import pagesim and load the compiled
    core again (about a second each)."""
    if _POOL and _POOL[0][0] == n:
        return _POOL[0][1]
    _drop_pool(wait=True)
    if n > 1:
        warm_up_core()  # compiled once here, loaded from numba's cache by every worker
    pool = cf.ProcessPoolExecutor(max_workers=n)
    _POOL.append((n, pool))
    return pool


def _drop_pool(wait: bool) -> None:
    while _POOL:
        _POOL.pop()[1].shutdown(wait=wait, cancel_futures=not wait)


atexit.register(_drop_pool, True)


def warm_up_core() -> float:
    """Compile the simulation core in this process when numba's cache lacks it (once per
    install, tens of seconds), before workers start, which then load it rather than each
    compiling it; says how long it took when that is worth a line. Returns the seconds."""
    from pagesim.sim.config import SimConfig
    from pagesim.sim.run import run_simulation
    from pagesim.traces.synth import make_workload

    t0 = time.perf_counter()
    run_simulation(SimConfig(), make_workload("sharegpt", rate=2, num_requests=4, seed=0))
    seconds = time.perf_counter() - t0
    if seconds > 5:
        print(f"compiled the simulation core in {seconds:.0f} s (numba, once per install; later runs load it)",
              file=sys.stderr)
    return seconds


def _run_pool(todo, specs, run_fn, n, finish, cache_dir, replace) -> None:
    pool = _shared_pool(n)
    try:
        futures = {pool.submit(_execute_and_store, specs[idx[0]], run_fn, cache_dir, key, replace): key
                   for key, idx in todo.items()}
        for fut in cf.as_completed(futures):
            finish(futures[fut], fut.result(), stored=True)
    except BaseException:
        # Ctrl-C or a failed run: drop queued runs now (finished ones are already cached)
        _drop_pool(wait=False)
        raise


def _run_ray(todo, specs, run_fn, n, address, finish) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("executor 'ray' needs Ray: pip install 'pagesim[dist]' (or ray>=2.9), "
                          "or use --executor local") from None
    if not ray.is_initialized():
        if address:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        else:
            ray.init(num_cpus=n, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(_execute)
    pending = {remote.remote(specs[idx[0]], run_fn): key for key, idx in todo.items()}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            finish(pending.pop(ref), ray.get(ref))


def results_frame(specs: list[RunSpec], summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run: the spec's parameters then its summary (summary keys win on clashes
    except ``system``)."""
    rows = []
    for s, summ in zip(specs, summaries):
        row = s.params()
        row.update({k: v for k, v in (summ or {}).items() if k != "system"})
        rows.append(row)
    return pd.DataFrame(rows)
