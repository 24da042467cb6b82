"""The calibrated roofline's constants: one TOML file per GPU in ``sim/data/calibration/``.

Each file (written by ``pagesim cost fit``, never by hand) holds three tables:

* ``[constants]``: the fields of :class:`Calibration` (seconds; efficiencies as fractions of
  the GPU preset's datasheet peaks in ``sim/specs.py``), read by ``sim/cost/calibrated.py``;
* ``[provenance]``: the measured source (folder, upstream commit and license, each file's
  sha256), the models fitted on, where the attention constants come from, pagesim's commit,
  the command that wrote the file and the date;
* ``[error]``: the cost models' measured error on this GPU (``sim/cost/error.py``): the
  calibrated model leave-one-model-out, the roofline on every measured model, overall, per
  phase and per model. :func:`error_band` hands it to ``simulate``, ``plan`` and ``reproduce``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from pagesim.sim.config import read_toml
from pagesim.sim.errors import ConfigError
from pagesim.sim.terminal import fill

#: elementwise kernel kinds, in the order of the per-kind constants
ELEMENTWISE = ("norm", "rope", "act", "add")
DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "calibration"  # sim/data/calibration/


@dataclass(frozen=True)
class Calibration:
    """Fitted constants of one GPU (seconds, fractions of the datasheet peaks), their provenance
    and the measured error of the model they make (formulas: ``sim/cost/calibrated.py``)."""

    gpu: str
    gemm_fixed_s: float
    gemm_compute_eff: float
    gemm_memory_eff: float
    gemm_overlap: float
    gemm_tile_tokens: int
    elementwise_fixed_s: tuple[float, ...]
    elementwise_memory_eff: tuple[float, ...]
    decode_fixed_s: float
    decode_per_seq_s: float
    decode_bw_coef: float
    decode_bw_exponent: float
    prefill_fixed_s: float
    prefill_compute_eff: float
    prefill_causal_fraction: float
    allreduce_tp: tuple[int, ...] = ()
    allreduce_latency_s: tuple[float, ...] = ()
    allreduce_bytes_per_s: tuple[float, ...] = ()
    # vLLM's CPU time per iteration, fixed_s + per_seq_s x sequences per TP degree, fitted on
    # Vidur's measurements (sim/cost/cpu_overheads.py); empty where the GPU has none
    cpu_tp: tuple[int, ...] = ()
    cpu_fixed_s: tuple[float, ...] = ()
    cpu_per_seq_s: tuple[float, ...] = ()
    # each measured GEMM shape's measured / formula ratio over a grid of token counts (cuBLAS's
    # kernel choice per shape, which the formula does not follow), how many of the nearest
    # measured shapes price a GEMM and how near they must be (sim.cost.calibrated.nearest_ratios;
    # inf: any); empty: the formula alone
    gemm_neighbours: int = 0
    gemm_radius: float = 0.0
    gemm_shape_k: tuple[float, ...] = ()
    gemm_shape_n: tuple[float, ...] = ()
    gemm_grid_tokens: tuple[float, ...] = ()
    gemm_ratio: tuple[float, ...] = ()  # by shape, then token count
    # the measured collective table (running median, sim.cost.measured.read_allreduce) per TP
    # degree, sorted by degree then size: sizes inside it are priced from it, larger ones from its
    # last size at the line's bandwidth
    allreduce_table_tp: tuple[int, ...] = ()
    allreduce_table_bytes: tuple[float, ...] = ()
    allreduce_table_s: tuple[float, ...] = ()
    provenance: dict = field(default_factory=dict, compare=False)
    error: dict = field(default_factory=dict, compare=False)

    def to_toml(self) -> str:
        d = asdict(self)
        head = [f"# Calibrated roofline constants for {self.gpu} (read by sim/cost/calibrated.py).",
                "# Written by `pagesim cost fit`; rerun the command in [provenance] instead of editing.",
                "# Seconds; efficiencies are fractions of the GPU preset's datasheet peaks (sim/specs.py).",
                "# elementwise_* lists follow the kinds " + ", ".join(ELEMENTWISE) + "."]
        consts = {k: v for k, v in d.items() if k not in ("provenance", "error") and (v or k not in OPTIONAL)}
        return "\n".join(head) + "\n\n" + _toml({"constants": consts, "provenance": d["provenance"],
                                                  "error": d["error"]})

    @classmethod
    def from_toml(cls, path: str | Path) -> "Calibration":
        path = Path(path)
        data = read_toml(path, "calibration file")
        consts = dict(data.get("constants", {}))
        names = [f.name for f in cls.__dataclass_fields__.values() if f.name not in ("provenance", "error")]
        missing = [n for n in names if n not in consts and n not in OPTIONAL]
        if missing:
            raise ConfigError(f"{path}: [constants] has no '{missing[0]}'")
        unknown = [k for k in consts if k not in names]
        if unknown:
            raise ConfigError(f"{path}: [constants] has an unknown key '{unknown[0]}'")
        for k in [n for n in names if n in consts]:
            v = consts[k]
            kind = cls.__dataclass_fields__[k].type  # a string: the module defers its annotations
            if k != "gpu" and isinstance(v, list) != kind.startswith("tuple"):
                raise ConfigError(f"{path}: [constants] field '{k}' must be "
                                  f"{'a list of numbers' if kind.startswith('tuple') else 'one number'}, got {v!r}")
            vals = v if isinstance(v, list) else [v]
            if "int" in kind and not all(isinstance(x, int) for x in vals):
                raise ConfigError(f"{path}: [constants] field '{k}' must hold whole numbers, got {v!r}")
            if k != "gpu" and not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                      and (math.isfinite(x) or k == "gemm_radius" and x == math.inf)
                                      and (x > 0 or k == "gemm_overlap" and x >= 0) for x in vals):
                raise ConfigError(f"{path}: [constants] field '{k}' must hold finite numbers > 0, got {v!r}")
            if isinstance(v, list):
                consts[k] = tuple(v)
        for k in ("elementwise_fixed_s", "elementwise_memory_eff"):
            if len(consts[k]) != len(ELEMENTWISE):
                raise ConfigError(f"{path}: [constants] field '{k}' needs {len(ELEMENTWISE)} values "
                                  f"({', '.join(ELEMENTWISE)})")
        if len({len(consts[k]) for k in ("allreduce_tp", "allreduce_latency_s", "allreduce_bytes_per_s")}) != 1:
            raise ConfigError(f"{path}: [constants] allreduce_tp, allreduce_latency_s, allreduce_bytes_per_s "
                              "must have the same length")
        for group in SAME_LENGTH:
            if len({len(consts.get(k, ())) for k in group}) != 1:
                raise ConfigError(f"{path}: [constants] {', '.join(group)} must have the same length")
        shapes, grid = len(consts.get("gemm_shape_k", ())), consts.get("gemm_grid_tokens", ())
        if len(consts.get("gemm_ratio", ())) != shapes * len(grid):
            raise ConfigError(f"{path}: [constants] gemm_ratio needs a value per shape and token count "
                              f"({shapes} x {len(grid)})")
        neighbours = consts.get("gemm_neighbours", 0)
        if not (1 <= neighbours <= shapes if shapes else neighbours == 0):
            raise ConfigError(f"{path}: [constants] gemm_neighbours must be between 1 and the {shapes} shapes")
        if bool(shapes) != bool(consts.get("gemm_radius", 0)):
            raise ConfigError(f"{path}: [constants] gemm_radius goes with the GEMM shapes, both or neither")
        if any(b <= a for a, b in zip(grid, grid[1:])):
            raise ConfigError(f"{path}: [constants] gemm_grid_tokens must be increasing")
        table = list(zip(consts.get("allreduce_table_tp", ()), consts.get("allreduce_table_bytes", ())))
        if any(b <= a for a, b in zip(table, table[1:])):
            raise ConfigError(f"{path}: [constants] the all-reduce table must be sorted by allreduce_table_tp, "
                              "then by increasing allreduce_table_bytes")
        return cls(**consts, provenance=data.get("provenance", {}), error=data.get("error", {}))

    def gemm_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The measured GEMM shapes (K, N by rows), the grid's token counts and the shape x grid ratios."""
        shapes = np.column_stack([self.gemm_shape_k, self.gemm_shape_n]).astype(float).reshape(-1, 2)
        grid = np.asarray(self.gemm_grid_tokens, float)
        return shapes, grid, np.asarray(self.gemm_ratio, float).reshape(len(shapes), len(grid))

    def allreduce_table(self, tp: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The measured collective table at ``tp``: sizes (bytes) and seconds; empty where none."""
        rows = [(b, t) for d, b, t in zip(self.allreduce_table_tp, self.allreduce_table_bytes, self.allreduce_table_s)
                if d == tp]
        return tuple(b for b, _ in rows), tuple(t for _, t in rows)

    def cpu_overhead(self, tp: int) -> tuple[float, float, int] | None:
        """The measured CPU time per iteration at ``tp`` as ``(fixed_s, per_seq_s, measured_tp)``:
        the fit of that degree, else of the nearest measured one (the lower on a tie: the Ray
        round trip that dominates past TP 1 grows little with the degree); None where nothing
        was measured."""
        if not self.cpu_tp:
            return None
        i = min(range(len(self.cpu_tp)), key=lambda k: (abs(math.log2(self.cpu_tp[k] / tp)), self.cpu_tp[k]))
        return self.cpu_fixed_s[i], self.cpu_per_seq_s[i], self.cpu_tp[i]


#: [constants] keys a calibration file may leave out, in groups of one length each: a GPU without
#: measured CPU overheads, without GEMM corrections (the shapes; the ratios are checked against
#: them and the grid), without a collective table
SAME_LENGTH = (("cpu_tp", "cpu_fixed_s", "cpu_per_seq_s"), ("gemm_shape_k", "gemm_shape_n"),
               ("allreduce_table_tp", "allreduce_table_bytes", "allreduce_table_s"))
OPTIONAL = tuple(k for group in SAME_LENGTH for k in group) + ("gemm_neighbours", "gemm_radius", "gemm_grid_tokens",
                                                              "gemm_ratio")


def _toml(d: dict, prefix: str = "") -> str:
    """``d`` as TOML: scalars and lists first, then each sub-table under its dotted header."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, np.integer)):
            return str(int(v))
        if isinstance(v, (float, np.floating)):
            v = float(v)
            return "nan" if math.isnan(v) else ("inf" if v == math.inf else repr(v))
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(str(v))
    def assignment(k, v):  # a long list wraps, a few numbers to a line (TOML's multi-line array)
        if not isinstance(v, (list, tuple)) or len(v) <= 8:
            return f"{k} = {value(v)}"
        items = [value(x) + "," for x in v]
        rows, row = [], ""
        for item in items:
            if row and len(row) + len(item) + 1 > 96:
                rows.append(row)
                row = ""
            row = f"{row} {item}" if row else item
        return f"{k} = [\n" + "".join(f"    {r}\n" for r in rows + [row]) + "]"
    lines = [assignment(k, v) for k, v in d.items() if not isinstance(v, dict)]
    out = ("[" + prefix + "]\n" if prefix else "") + "".join(line + "\n" for line in lines)
    for k, v in d.items():
        if isinstance(v, dict):
            out += "\n" + _toml(v, f"{prefix}.{k}" if prefix else k)
    return out


def calibration_path(gpu: str) -> Path:
    return DATA_DIR / f"{gpu}.toml"


def calibrated_gpus() -> list[str]:
    return sorted(p.stem for p in DATA_DIR.glob("*.toml"))


#: GPUs with no measurements of their own that share a measured GPU's chip, SM count and clocks
#: and differ from it only in memory: size, and bandwidth (1,555 against 2,039 GB/s; 4.8 against
#: 3.35 TB/s), a preset peak that the fitted efficiencies are fractions of. They are priced with
#: that GPU's constants, and their error band says it was measured on the other GPU.
SAME_CHIP = {"a100-40gb": "a100-80gb", "h200-141gb": "h100-80gb"}


def calibration_gpu(gpu: str) -> str | None:
    """The GPU whose fitted constants price ``gpu``: its own, else its :data:`SAME_CHIP`
    sibling's; None where neither was measured."""
    for name in (gpu, SAME_CHIP.get(gpu)):
        if name and calibration_path(name).exists():
            return name
    return None


@lru_cache(maxsize=None)
def load_calibration(gpu: str) -> Calibration:
    """The constants that price GPU preset ``gpu`` (:func:`calibration_gpu`; ConfigError naming
    the calibrated GPUs where there are none)."""
    source = calibration_gpu(gpu)
    if source is None:
        raise ConfigError(f"no calibration for GPU '{gpu}' (calibrated: {', '.join(calibrated_gpus()) or 'none'}); "
                          "use --cost-model roofline, or fit one: pagesim cost fit --measured DIR --gpu GPU --out FILE")
    return Calibration.from_toml(calibration_path(source))


@lru_cache(maxsize=None)
def measured_error(source: str) -> dict:
    """The ``[error]`` table of calibration file ``source`` (a calibrated GPU's name): each cost
    model's measured error, which every run's summary reports. :meth:`Calibration.to_toml` writes
    it last, so it is parsed alone: a run priced by another model never reads the constants
    before it. A file where another table follows it or a part of it stands before it, or whose
    tail does not parse, is read whole (:meth:`Calibration.from_toml`, which names what is
    wrong)."""
    import re
    import tomllib

    path = calibration_path(source)
    text = path.read_bytes().decode("utf-8", errors="replace")
    start = text.find("\n[error]\n")
    tail = text[start:] if start >= 0 else ""
    # the table whole in the tail: no other table after it, no part of it (a sub-table, a key) before
    if tail and not re.search(r"^\[(?!error[.\]])", tail, re.M) and not re.search(r"^\s*\[?\s*error\b",
                                                                                     text[:start], re.M):
        try:
            return tomllib.loads(tail).get("error", {})
        except tomllib.TOMLDecodeError:
            pass
    return Calibration.from_toml(path).error


def error_band(cost_model: str, gpu: str, profile: str | None = None, *, moe: bool | None = None,
               scheduler: str | None = None, max_num_seqs: int | None = None, engine: str | None = None,
               expert_parallel: bool = False) -> dict:
    """Which cost model ran and its measured error on ``gpu``, as ``summary.json`` and ``plan``
    report it: ``{"cost_model": ..., "cost_error": {"median", "p90", "max", "cells", "method",
    "source", "measured_on"}}``, or ``"cost_error": "uncalibrated: ..."`` where neither ``gpu``
    nor its :data:`SAME_CHIP` sibling has measurements. ``measured_on`` names the sibling when
    ``gpu`` borrows its constants: the band was measured there, not on ``gpu``. The serving
    model's band is its regime's (``sim.cost.regime``: ``moe``, ``scheduler`` and the ``engine``
    it follows, ``max_num_seqs``, ``expert_parallel``; :func:`run_error_band` passes a run's)."""
    if profile:
        return {"cost_model": "table", "cost_error": f"not scored: a measured profile ({profile})"}
    if cost_model == "serving":
        from pagesim.sim.cost.serving import FITTED_ON, serving_band  # its own file, its own runs

        band = serving_band(gpu, moe, scheduler, max_num_seqs, same_chip=SAME_CHIP.get(gpu) == FITTED_ON,
                            engine=engine, expert_parallel=expert_parallel)
        if isinstance(band, dict):  # borrowed from the same chip, or from another GPU altogether
            band["same_chip"] = SAME_CHIP.get(gpu) == band["measured_on"]
        return {"cost_model": cost_model, "cost_error": band}
    source = calibration_gpu(gpu)
    if source is None:
        return {"cost_model": cost_model, "cost_error": f"uncalibrated: no measured timings for {gpu}"}
    path = calibration_path(source)
    err = measured_error(source).get(cost_model, {})
    band = dict(err.get("all", {}))
    if not band:
        return {"cost_model": cost_model, "cost_error": f"uncalibrated: {path.name} has no [error.{cost_model}]"}
    band["method"] = err.get("method", "")
    band["source"] = f"sim/data/calibration/{path.name}"
    band["measured_on"] = source
    return {"cost_model": cost_model, "cost_error": band}


def run_error_band(cfg, gpu: str | None = None) -> dict:
    """:func:`error_band` of a run of ``cfg`` (a SimConfig) on ``gpu`` (default its own, by its
    preset's name): its model's kind, its engine and its batch limit say the serving model's
    regime. A band of GPU timings (the roofline's, the calibrated model's) says in a line that no
    real serving run of the engine measured it end to end (``regime``)."""
    from pagesim.sim.specs import get_gpu, get_model

    gpu = gpu or get_gpu(cfg.gpu).name
    band = error_band(cfg.cost_model, gpu, cfg.profile, moe=get_model(cfg.model).moe is not None,
                      scheduler=cfg.scheduler, max_num_seqs=cfg.max_num_seqs, engine=cfg.capabilities.follows,
                      expert_parallel=cfg.expert_group > 1)  # experts split over GPUs (TP 1 alone: none)
    err = band["cost_error"]
    if isinstance(err, dict) and "regime" not in err:
        err["regime"] = [f"no real serving run of {cfg.capabilities.follows} measured it end to end"]
    return band


def gpu_time_scales(err) -> list[float] | None:
    """The GPU time scales ``[slow, fast]`` that bracket an answer with the measured error ``err``
    (an :func:`error_band`'s ``cost_error``; None without one): with the serving model's signed
    spread, real = sim / (1 + e) at its 10th and 90th percentiles (``low``, ``high``), each side
    kept at or beyond the answer itself (a model too fast everywhere brackets it from x 1 up);
    with a p90 of |error| alone, x (1 + p90) and x (1 - p90)."""
    if not isinstance(err, dict):
        return None
    if "low" in err:
        return [1 / (1 + min(err["low"], 0.0)), 1 / (1 + max(err["high"], 0.0))]
    return [1 + err["p90"], 1 - err["p90"]] if 0 < err["p90"] < 1 else None


def band_line(band: dict, gpu: str) -> str:
    """``cost model: <describe_band>`` wrapped to 100 columns, as the commands print it."""
    return fill(f"cost model: {describe_band(band, gpu)}")


def describe_band(band: dict, gpu: str) -> str:
    """One line for a printed summary: ``calibrated (a100-80gb: median 2.3 %, p90 7.8 % ...)``;
    a borrowed band names the GPU it was measured on."""
    err = band["cost_error"]
    if isinstance(err, str):
        return f"{band['cost_model']} ({err})"
    measured_on = err.get("measured_on", gpu)
    if measured_on == gpu:
        borrowed = ""
    elif err.get("same_chip", True):
        borrowed = f"; {gpu} itself unmeasured: the same chip as {measured_on}"
    else:
        borrowed = f"; {gpu} itself unmeasured"
    what = err.get("what", f"GPU time per iteration vs measured on {measured_on}")
    stats = f"median {100 * err['median']:.1f} %, p90 {100 * err['p90']:.1f} %"
    if "low" in err:  # the serving model's: its signed spread, and its regime in place of the method
        stats += (f", sim / real - 1 from {100 * err['low']:+.1f} to {100 * err['high']:+.1f} % (10th-90th "
                  "percentile)")
        return f"{band['cost_model']} ({what}: {stats}; " + "; ".join(err["regime"]) + ")"
    regime = "".join(f"; {line}" for line in err.get("regime", ()))
    return f"{band['cost_model']} ({what}: {stats}, {err['method']}{borrowed}{regime})"
