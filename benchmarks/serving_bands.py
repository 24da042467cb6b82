"""The serving cost model's error by regime, written to ``sim/data/serving/regimes.toml``.

Every band that ``simulate``, ``plan``, ``validate`` and ``reproduce`` print with the serving
cost model comes from the real runs of the answer's regime (``sim/cost/regime.py`` reads this
file):

- ``dense`` and ``moe``: each fitting run's error with its own model held out of the fit
  (leave-one-model-out), as ``benchmarks/fit_serving_time.py`` wrote them into the fitted GPU's
  constants file, split by whether the run's model is a mixture of experts (the model preset's
  own fields, through the run's replay configuration);
- ``held_out_gpu``: runs on GPUs the constants were not fitted on (leave-one-GPU-out: the fit saw
  the fitted GPU's runs alone), replayed here with the shipped constants: LLMServingSim's vLLM
  0.19.0 runs (casys-kaist/LLMServingSim at 5daddb21, MIT, ``bench/examples/<GPU>/<run>/vllm/``),
  from their fact and per-request tables (``experiments/data/llmservingsim_runs.csv``, written by
  ``benchmarks/real_run_facts.py``; ``--held-out`` another table or run folders). A run the replay
  refuses is named and left out.

Each regime keeps its runs' names and signed errors (sim / real - 1 of the whole run's mean E2E,
TTFT and TPOT); the medians and quantiles are computed where they are read. The fitted runs'
largest ``max_num_seqs`` is kept too: a configuration that may batch more is extrapolated.

    python benchmarks/serving_bands.py
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
from pathlib import Path

from _import_path import ROOT, import_path

import_path()

from pagesim.experiments.real_validate import parallel_layout, replay_config, validate_run  # noqa: E402
from pagesim.sim.config import read_toml  # noqa: E402
from pagesim.sim.cost.regime import METRICS, REGIMES_PATH  # noqa: E402
from pagesim.sim.cost.serving import FITTED_ON, serving_path  # noqa: E402
from pagesim.sim.errors import PagesimError  # noqa: E402
from pagesim.sim.specs import get_model  # noqa: E402
from pagesim.sim.systems import SCHEDULERS  # noqa: E402
from pagesim.traces.real_runs import read_real_runs  # noqa: E402

DEFAULT_FACTS = ROOT / "experiments" / "data" / "real_runs_h100.csv"
HELD_OUT = ROOT / "experiments" / "data" / "llmservingsim_runs.csv"


def is_moe(run, gpu: str) -> bool:
    return get_model(replay_config(run, gpu).model).moe is not None


def fitted_regimes(facts: Path, gpu: str) -> tuple[dict, int, set]:
    """The dense and MoE runs' held-out errors from ``gpu``'s constants file, the fitted runs'
    largest ``max_num_seqs`` and the schedulers that replay them."""
    err = read_toml(serving_path(gpu), "serving constants").get("error", {})
    regimes = {"dense": {}, "moe": {}}
    largest, schedulers = 0, set()
    for run in read_real_runs(facts):
        if run.info.get("gpu", gpu) != gpu:
            continue
        largest = max(largest, int(run.engine.get("max_num_seqs", 0)))
        cfg = replay_config(run, gpu)
        schedulers.add(cfg.scheduler)
        errors = [err.get(f"{run.name}.{m}_mean") for m in METRICS]
        if any(e is None for e in errors):
            raise SystemExit(f"{serving_path(gpu)} has no held-out error of {run.name}: refit first")
        regimes["moe" if is_moe(run, gpu) else "dense"][run.name] = (errors, gpu, get_model(cfg.model).name,
                                                                    cfg.expert_parallel)
    return regimes, largest, schedulers


def held_out_gpu_runs(paths: list[Path]) -> tuple[dict, list[str]]:
    """Each run of ``paths`` (fact tables, run folders) replayed with the shipped constants:
    run -> (errors, GPU, model, expert parallel), and the GPUs they ran on."""
    out, gpus = {}, set()
    for path in paths:
        for run in read_real_runs(path):
            try:
                cfg = replay_config(run, None, {"cost_model": "serving"})
                overall = validate_run(run, cfg).errors()
            except PagesimError as e:
                print(f"  {run.name}: left out ({e})")
                continue
            overall = overall[overall["scope"] == "overall"].set_index("metric")["error"]
            errors = [float(overall[f"{m}_mean"]) for m in METRICS]
            out[f"{run.name} ({cfg.gpu}, {parallel_layout(run, cfg)})"] = (errors, cfg.gpu, get_model(cfg.model).name,
                                                                           cfg.expert_parallel)
            gpus.add(cfg.gpu)
    return out, sorted(gpus)


def toml_table(name: str, runs: dict, **fields) -> list[str]:
    """One regime: its fields, then per run (run -> (errors, GPU, model, expert parallel)) its name,
    GPU, model, whether it ran expert parallel, and errors, a list each."""
    lines = ["", f"[regimes.{name}]"] + [f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"'
                                         for k, v in fields.items()]
    for key, column in (("runs", list(runs)), ("gpus", [v[1] for v in runs.values()]),
                        ("models", [v[2] for v in runs.values()])):
        lines.append(f"{key} = [" + ", ".join(f'"{x}"' for x in column) + "]")
    lines.append("expert_parallel = [" + ", ".join("true" if v[3] else "false" for v in runs.values()) + "]")
    for i, m in enumerate(METRICS):
        lines.append(f"{m} = [" + ", ".join(f"{v[0][i]:.6g}" for v in runs.values()) + "]")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--facts", default=str(DEFAULT_FACTS), help="the fitting runs' fact table")
    p.add_argument("--held-out", type=Path, nargs="+", default=[HELD_OUT],
                   help="the runs on GPUs held out of the fit: fact tables or run folders")
    p.add_argument("--out", type=Path, default=REGIMES_PATH)
    args = p.parse_args(argv)
    regimes, largest, schedulers = fitted_regimes(Path(args.facts), FITTED_ON)
    [scheduler] = schedulers  # one engine's runs
    held, gpus = held_out_gpu_runs(args.held_out)
    sources = sorted({str(run.info.get("source", path)) for path in args.held_out for run in read_real_runs(path)})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    lines = ["# The serving cost model's error by regime (sim/cost/regime.py reads it): written by",
             "# python benchmarks/serving_bands.py", "",
             "[provenance]", f'fitted_on = "{FITTED_ON}"', f'constants = "{serving_path(FITTED_ON).name}"',
             f'facts = "{Path(args.facts).name}"', f'held_out_source = "{"; ".join(sources)}"',
             f'pagesim_commit = "{commit}"', f'date = "{datetime.date.today()}"', "",
             "[fitted]", f"max_num_seqs = {largest}", f'scheduler = "{scheduler}"',
             f'engine = "{SCHEDULERS[scheduler].follows}"']
    lines += toml_table("dense", regimes["dense"], method="leave-one-model-out", held_out="model", gpu=FITTED_ON)
    lines += toml_table("moe", regimes["moe"], method="leave-one-model-out", held_out="model", gpu=FITTED_ON)
    if held:
        lines += toml_table("held_out_gpu", held, method=f"leave-one-GPU-out: fitted on {FITTED_ON} alone",
                            held_out="GPU", gpu=", ".join(gpus))
    args.out.write_text("\n".join(lines) + "\n")
    for name, runs in (*regimes.items(), ("held_out_gpu", held)):
        print(f"{name}: {len(runs)} runs")
        for run, (e, *_) in runs.items():
            print(f"  {run:<62} " + "  ".join(f"{m} {100 * v:+6.1f} %" for m, v in zip(METRICS, e)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
