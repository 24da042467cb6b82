"""What one run is and how an experiment's grid expands into runs.

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
:data:`CLUSTER_KEYS` (``replicas``, ``router``) make each run a cluster (``sim/cluster.py``),
:data:`DISAGG_KEYS` (``prefill_replicas``, ``decode_replicas``, ...) a disaggregated one
(``sim/disagg.py``), ``goodput`` (``{ttft = 250, tpot = 100}``, milliseconds, as ``simulate
--goodput``) adds ``request_goodput`` to the summary, and everything else must be a
:class:`sim.config.SimConfig` field (``seed`` goes to both).

A :class:`RunSpec` is one run; :meth:`RunSpec.key` names it in the run cache
(``experiments/run_cache.py``): a hash over the canonical JSON of the full spec, the contents of
the files it names (a model's config.json, a profile) and :func:`CODE_SALT` (the package version
and a hash of the ``sim/`` and ``traces/`` sources, so editing the engine invalidates old
results). :func:`simulate_spec` is the default run function, :func:`results_frame` the table of a
sweep's results.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from pagesim.experiments import engine_era
from pagesim.sim import __version__
from pagesim.sim.cluster import run_cluster
from pagesim.sim.config import SET_BY_THE_RUN, SimConfig
from pagesim.sim.errors import ConfigError
from pagesim.sim.metrics import SummaryOptions
from pagesim.sim.run import run_simulation
from pagesim.sim.specs import get_model
from pagesim.sim.specs.model import with_max_seq_len
from pagesim.traces import long_context, shared_prefix
from pagesim.traces.chatbot import VARIANTS as CHATBOT_VARIANTS, chatbot_workload
from pagesim.traces.synth import make_workload
from pagesim.traces.transform import apply_max_len_policy

#: keys that describe the workload rather than the simulated system
WORKLOAD_KEYS = ("workload", "rate", "duration_s", "num_requests", "seed", "n", "beam_width", "unshare")
#: keys that make a run a cluster (sim/cluster.py): replicas behind a router
CLUSTER_KEYS = ("replicas", "router")
#: keys that make a run disaggregated (sim/disagg.py): two pools of vllm-v1 replicas and a KV link
DISAGG_KEYS = ("prefill_replicas", "decode_replicas", "prefill_tp", "decode_tp", "kv_link",
               "first_token")
#: bump to invalidate every cache entry when the cache layout or the run semantics change
#: (2: entries carry a manifest of their files' sizes and hashes; 3: tables are Arrow files)
CACHE_FORMAT = 3
#: SimConfig settings that may name a file (a model's config.json, a measured profile): the
#: file's contents are part of a run's cache key
FILE_SETTINGS = ("model", "profile")

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
    # a cluster (sim/cluster.py): replicas of the system behind a router; left out of the key and
    # the params while 1 replica without a router (a single engine's runs keep their keys)
    replicas: int = 1
    router: str | None = None
    # a disaggregated run (:data:`DISAGG_KEYS`), and SLOs in ms (``simulate --goodput``); each
    # left out of the key and the params while empty
    disagg: dict[str, Any] = field(default_factory=dict)
    goodput: dict[str, float] = field(default_factory=dict)

    @property
    def disaggregated(self) -> bool:
        return bool(self.disagg)

    def canonical(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.replicas == 1 and self.router is None:
            del d["replicas"], d["router"]
        for name in ("disagg", "goodput"):
            if not d[name]:
                del d[name]
            else:
                d[name] = {k: d[name][k] for k in sorted(d[name])}
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
        return SimConfig.for_system(self.system, seed=self.seed, **self.sim)

    def workload_kwargs(self) -> dict[str, Any]:
        return dict(rate=self.rate, duration_s=self.duration_s, num_requests=self.num_requests,
                    seed=self.seed, n=self.n, beam_width=self.beam_width)

    def params(self) -> dict[str, Any]:
        """A flat dict for result tables (system, workload fields, then sim overrides)."""
        d = {"system": self.system, "workload": self.workload, "rate": self.rate,
             "duration_s": self.duration_s, "num_requests": self.num_requests, "seed": self.seed,
             "n": self.n, "beam_width": self.beam_width, "unshare": self.unshare}
        if self.replicas != 1 or self.router is not None:
            d.update(replicas=self.replicas, router=self.router)
        d.update(self.disagg)
        d.update({f"goodput_{m}_ms": v for m, v in self.goodput.items()})
        d.update(self.sim)
        return d

    def summary_options(self) -> SummaryOptions:
        """The summary's options: the ``goodput`` SLOs (ms here, seconds there)."""
        return SummaryOptions(goodput_slo_s=tuple((m, v / 1e3) for m, v in self.goodput.items()))

    def label(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in sorted(self.sim.items()) if k not in _BASE_HIDE)
        w = f" n={self.n}" if self.n > 1 else ""
        w += f" beam={self.beam_width}" if self.beam_width > 1 else ""
        w += " unshared" if self.unshare else ""
        pools = "".join(f" {k}={v}" for k, v in sorted(self.disagg.items()))
        return f"{self.system} {self.workload}@{self.rate:g}{w}{pools}{extra}"


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
    keys in the order written (last varies fastest). A value ``"default"`` leaves its setting
    at the run's default (:func:`spec_from_settings`).
    """
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
        sim_fields = {f.name for f in dataclasses.fields(SimConfig)}
    # "default" leaves a setting to the run's defaults: a grid can hold the system's own value beside
    # a number (max_num_seqs = ["default", 512])
    values = {k.replace("-", "_"): v for k, v in values.items() if v != "default"}
    values = engine_era.resolve(values)  # cost_scale = "engine-era": the 2023 engines' factor
    system = values.pop("system", "vllm")
    wl = {k: values.pop(k) for k in WORKLOAD_KEYS if k in values}
    cluster = {k: values.pop(k) for k in CLUSTER_KEYS if k in values}
    disagg = {k: values.pop(k) for k in DISAGG_KEYS if k in values}
    goodput = values.pop("goodput", {})
    for k in values:
        if k in SET_BY_THE_RUN:
            raise ConfigError(f"experiment config: {SET_BY_THE_RUN[k]}")
    bad = [k for k in values if k not in sim_fields]
    if bad:
        valid = {*sim_fields, *WORKLOAD_KEYS, *CLUSTER_KEYS, *DISAGG_KEYS, "goodput"}
        raise ConfigError(f"unknown setting(s) {', '.join(sorted(bad))} in experiment config; "
                          f"valid: {', '.join(sorted(valid))}")
    if disagg and not {"prefill_replicas", "decode_replicas"} <= set(disagg):
        raise ConfigError("experiment config: a disaggregated run needs both prefill_replicas and "
                          "decode_replicas")
    if not isinstance(goodput, dict):
        raise ConfigError(f"experiment config: goodput is a table of SLOs in ms "
                          f"({{ttft = 250, tpot = 100}}), got {goodput!r}")
    values.pop("seed", None)
    return RunSpec(system=system, sim=values, workload=wl.get("workload", "sharegpt"),
                   rate=float(wl.get("rate", 1.0)), duration_s=wl.get("duration_s"),
                   num_requests=wl.get("num_requests"), seed=int(wl.get("seed", 0)),
                   n=int(wl.get("n", 1)), beam_width=int(wl.get("beam_width", 1)),
                   unshare=bool(wl.get("unshare", False)), replicas=int(cluster.get("replicas", 1)),
                   router=cluster.get("router"), disagg=disagg,
                   goodput={m: float(v) for m, v in goodput.items()})


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


@lru_cache(maxsize=2)
def spec_workload(workload: str, rate: float, duration_s: float | None, num_requests: int | None, seed: int,
                  n: int, beam_width: int) -> pd.DataFrame:
    """The synthetic trace a run spec names. Kept for the next run (a worker's runs come
    sorted by size, so the systems of one grid point follow each other: one synthesis for
    all four); a run reads its trace and never writes it."""
    if workload in CHATBOT_VARIANTS:  # Fig. 17's conversations, DistServe's (traces/chatbot.py)
        if n > 1 or beam_width > 1:
            raise ConfigError(f"workload {workload!r} has one sequence per request; got n={n}, beam_width={beam_width}")
        return chatbot_workload(rate, duration_s, num_requests, seed, variant=workload)
    kwargs = dict(rate=rate, duration_s=duration_s, num_requests=num_requests, seed=seed, n=n, beam_width=beam_width)
    if workload in shared_prefix.WORKLOADS:  # Fig. 16's few-shot translation
        return shared_prefix.make_workload(workload, **kwargs)
    if workload in long_context.WORKLOADS:  # the hybrid figure's Mooncake-shaped lengths
        return long_context.make_workload(workload, **kwargs)
    return make_workload(workload, **kwargs)


def simulate_spec(spec: RunSpec):
    """The default run function: build the synthetic trace, run the engine, return its SimResult."""
    trace = spec_workload(spec.workload, spec.rate, spec.duration_s, spec.num_requests, spec.seed, spec.n,
                          spec.beam_width)
    if spec.unshare:
        trace = unshare_trace(trace)
    trace = within_context(trace, spec)
    options = spec.summary_options()
    if spec.disagg:
        return simulate_disaggregated(spec, trace, options)
    if spec.replicas != 1 or spec.router is not None:
        return run_cluster(spec.sim_config(), trace, spec.replicas, spec.router or "round-robin",
                           summary_options=options)
    return run_simulation(spec.sim_config(), trace, progress=False, summary_options=options)


def within_context(trace: pd.DataFrame, spec: RunSpec) -> pd.DataFrame:
    """The trace under the run's ``max_len_policy``, as ``simulate`` applies it: requests longer
    than the model's context (``max_seq_len``) refused (``error``), dropped, or cut
    (``traces.transform.apply_max_len_policy``)."""
    cfg = spec.sim_config()
    max_seq_len = with_max_seq_len(get_model(cfg.model), cfg.max_seq_len).max_seq_len
    return apply_max_len_policy(trace, max_seq_len, cfg.max_len_policy)[0]


def simulate_disaggregated(spec: RunSpec, trace: pd.DataFrame, options: SummaryOptions):
    """A disaggregated run (``sim/disagg.py``): the spec's settings on both pools, each pool's
    tensor parallelism its ``prefill_tp`` / ``decode_tp`` (default the spec's)."""
    from pagesim.sim.disagg import run_disaggregated

    d = spec.disagg
    if spec.replicas != 1:
        raise ConfigError("experiment config: replicas is not taken by a disaggregated run "
                          "(prefill_replicas, decode_replicas)")
    pools = []
    for side in ("prefill", "decode"):
        sim = dict(spec.sim)
        if d.get(f"{side}_tp") is not None:
            sim["tensor_parallel"] = d[f"{side}_tp"]
        pools.append(SimConfig.for_system(spec.system, seed=spec.seed, **sim))
    return run_disaggregated(pools[0], pools[1], trace, d["prefill_replicas"], d["decode_replicas"],
                             spec.router or "round-robin", d.get("kv_link", "ib-ndr"),
                             summary_options=options, first_token=d.get("first_token", "decode"))



def results_frame(specs: list[RunSpec], summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run: the spec's parameters then its summary (summary keys win on clashes
    except ``system``)."""
    rows = []
    for s, summ in zip(specs, summaries):
        row = s.params()
        row.update({k: v for k, v in (summ or {}).items() if k != "system"})
        rows.append(row)
    return pd.DataFrame(rows)
