"""The serving cost model's band from the real runs of an answer's regime.

One band for every answer hides where the model extrapolates: its fitted constants come from
dense and MoE models on one GPU (``sim/data/serving/<gpu>.toml``), and a capacity answer on
another GPU, for a mixture of experts or at batches no fitted run reached carries more error,
most of it optimistic (docs/accuracy.md). ``sim/data/serving/regimes.toml``
(``benchmarks/serving_bands.py``) keeps each regime's runs and their signed errors (sim / real - 1
of the whole run's mean E2E, TTFT, TPOT):

- ``dense``, ``moe``: the fitting runs, each priced by constants fitted without its model;
- ``held_out_gpu``: runs on GPUs the constants were not fitted on, priced by the shipped ones.

An answer's regime picks its sets: ``moe`` for a mixture of experts, else ``dense``; and
``held_out_gpu`` beside it on a GPU that is neither the fitted one nor its chip's sibling. Its
band is the widest of its sets, statistic by statistic (the larger median and p90 of |error|,
the lower 10th and the higher 90th percentile of the signed error). What has no run behind it
says so in one line each: a batch limit above the fitted runs', an engine other than vLLM v1's.
An expert-parallel answer adds the runs that ran expert parallel, wherever they are (each run's
``expert_parallel`` flag), or says that none did.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from pagesim.sim.config import read_toml

#: the errors each regime keeps, per run: its mean E2E, TTFT and TPOT over the whole run
METRICS = ("e2e", "ttft", "tpot")
REGIMES_PATH = Path(__file__).resolve().parent.parent / "data" / "serving" / "regimes.toml"


@lru_cache(maxsize=None)
def load_regimes(path: Path = REGIMES_PATH) -> dict:
    """``path``'s tables: ``fitted`` (the fitted runs' largest ``max_num_seqs``, the scheduler that
    replays them and the engine they ran, in words) and ``regimes``
    (name -> ``method``, ``runs``, and one list of signed errors per metric); empty where the file
    is missing."""
    return read_toml(path, "serving regimes") if path.exists() else {}


def statistics(errors: dict) -> dict:
    """Median and p90 of |error| and the 10th and 90th percentiles of the signed error (``low``,
    ``high``: sim / real - 1; negative, the model too fast) of each metric in ``errors``; the
    E2E's unprefixed, the others' prefixed by their metric."""
    out = {}
    for metric in METRICS:
        e = np.asarray(errors[metric], dtype=np.float64)
        prefix = "" if metric == "e2e" else f"{metric}_"
        out.update({f"{prefix}median": float(np.median(np.abs(e))), f"{prefix}p90": float(np.percentile(np.abs(e), 90)),
                    f"{prefix}low": float(np.percentile(e, 10)), f"{prefix}high": float(np.percentile(e, 90))})
    return out


def regime_table(path: Path = REGIMES_PATH) -> dict[str, dict]:
    """Each regime of ``path`` by name: its runs, where and how measured, and :func:`statistics`."""
    return {name: {"runs": len(r["runs"]), "gpu": r["gpu"], "method": r["method"], **statistics(r)}
            for name, r in load_regimes(path).get("regimes", {}).items()}


def model_table(path: Path = REGIMES_PATH) -> list[dict]:
    """Every regime's runs grouped by GPU and model, in the file's order: per group its ``gpu``,
    ``model``, ``runs``, what its regime held out of the fit (``held_out``: ``model`` or ``GPU``),
    the median |error| of each metric and the signed E2E error's lowest and highest (``e2e_low``,
    ``e2e_high``). Empty where the file does not name its runs' GPUs and models."""
    groups: dict[tuple, dict] = {}
    for r in load_regimes(path).get("regimes", {}).values():
        if not {"models", "gpus", "held_out"} <= set(r):
            return []
        held_out = r["held_out"]
        for i, (gpu, model) in enumerate(zip(r["gpus"], r["models"])):
            group = groups.setdefault((gpu, model), {"gpu": gpu, "model": model, "held_out": held_out,
                                                     **{m: [] for m in METRICS}})
            for m in METRICS:
                group[m].append(r[m][i])
    rows = []
    for group in groups.values():
        e = {m: np.asarray(group[m], dtype=np.float64) for m in METRICS}
        rows.append({**{k: group[k] for k in ("gpu", "model", "held_out")}, "runs": len(e["e2e"]),
                     **{m: float(np.median(np.abs(e[m]))) for m in METRICS},
                     "e2e_low": float(e["e2e"].min()), "e2e_high": float(e["e2e"].max())})
    return rows


def widest(bands: list[dict]) -> dict:
    """Statistic by statistic, the widest of ``bands``: the larger median and p90, the lower
    ``low``, the higher ``high``."""
    out = dict(bands[0])
    for band in bands[1:]:
        for key, value in band.items():
            pick = min if key.endswith("low") else max
            out[key] = pick(out[key], value)
    return out


def expert_parallel_runs(regimes: dict) -> dict:
    """The runs of every regime that ran expert parallel (a regime's ``expert_parallel`` flags),
    as a regime of their own: ``runs``, ``gpus`` and one list of errors per metric."""
    out: dict = {"runs": [], "gpus": [], **{m: [] for m in METRICS}}
    for r in regimes.values():
        for i, flag in enumerate(r.get("expert_parallel", [])):
            if flag:
                out["runs"].append(r["runs"][i])
                out["gpus"].append(r["gpus"][i] if "gpus" in r else r["gpu"])
                for m in METRICS:
                    out[m].append(r[m][i])
    return out


def regime_band(gpu: str, fitted_on: str, same_chip: bool, moe: bool | None = None, scheduler: str | None = None,
                max_num_seqs: int | None = None, engine: str | None = None, path: Path = REGIMES_PATH,
                expert_parallel: bool = False) -> dict | None:
    """The band of an answer on ``gpu`` (priced by ``fitted_on``'s constants; ``same_chip``: its
    chip's sibling), for a mixture of experts (``moe``; None: either), run by ``scheduler``
    (``engine``: the engine it follows, in words) at batches up to ``max_num_seqs``, its experts
    split over the GPUs or not (``expert_parallel``): :func:`statistics` of its regime's sets (:func:`widest`),
    ``runs``, ``what`` and ``regime`` (one line per way the answer is in or beyond the runs).
    None where ``path`` holds no regimes."""
    data = load_regimes(path)
    regimes = data.get("regimes", {})
    if not regimes:
        return None
    kinds = ["dense", "moe"] if moe is None else ["moe" if moe else "dense"]
    sets = [(k, regimes[k]) for k in kinds if regimes.get(k, {}).get("runs")]
    lines = [f"{'mixture-of-experts' if k == 'moe' else 'dense'} models: {len(r['runs'])} runs on {r['gpu']}, "
             f"{r['method']}" for k, r in sets]
    if gpu != fitted_on and same_chip:
        lines.append(f"{gpu}: no run of its own; the band is {fitted_on}'s (the same chip)")
    elif gpu != fitted_on:
        held = regimes.get("held_out_gpu", {})
        if held.get("runs"):
            sets.append(("held_out_gpu", held))
            lines.append(f"{gpu}: no fitted run; the band takes {len(held['runs'])} runs on GPUs held out of the fit "
                         f"too ({held['gpu']}; {held['method']})")
        else:
            lines.append(f"{gpu}: no fitted run, and no run on a GPU held out of the fit: the band is {fitted_on}'s")
    if expert_parallel:
        split = expert_parallel_runs(regimes)
        if split["runs"]:
            sets.append(("expert_parallel", split))
            n, gpus = len(split["runs"]), ", ".join(sorted(set(split["gpus"])))
            many = n > 1
            lines.append(f"expert parallel: {n} real run{'s' if many else ''} ({gpus}); the band takes "
                         f"{'them' if many else 'it'}")
        else:
            lines.append("expert parallel: no real run; the band is the mixture of experts' without it")
    fitted = data.get("fitted", {})
    fitted_batch = int(fitted.get("max_num_seqs", 0))
    if max_num_seqs is not None and fitted_batch and max_num_seqs > fitted_batch:
        lines.append(f"batches up to {max_num_seqs} sequences: beyond the {fitted_batch} of every fitted run, "
                     "extrapolated (no real run)")
    if scheduler is not None and fitted.get("scheduler") and scheduler != fitted["scheduler"]:
        lines.append(f"no real run of {engine or scheduler} was measured: the band is {fitted['engine']}'s")
    if not sets:
        return None
    band = widest([statistics(r) for _, r in sets])
    runs = len({name for _, r in sets for name in r["runs"]})  # a run in two sets counts once
    band.update(runs=runs, regime=lines, regime_sets=[k for k, _ in sets],
                what=f"mean E2E vs {runs} real vLLM runs ({', '.join(k.replace('_', '-') for k, _ in sets)})")
    return band
