"""Whole-step and end-to-end errors of device-timed validations, each priced with a host term fitted
on another model's run (held out), from their committed files on the CPU.

    python benchmarks/validation_host_heldout.py --run DIR PROFILE --run DIR2 PROFILE2 [...]

A validation (``pagesim validate``) prices each step with the table model's device time plus its
host term (``--step-overhead-ms``, ``--per-seq-overhead-ms``: 0.02 ms by default), while the runner
spends 0.3-0.5 ms of host time a step on a Firecracker VM (benchmarks/results/2026-11-27-h200). It
reports ``host_fit``, a host term fitted on its own steps (fitted again here from them,
both terms >= 0), and errors with it in place (in-sample).
This prices each run with the host term of every *other* model's run instead: its steps (the
recorded device-time prices plus that term, against the measured whole steps) and its table-model
simulation, rerun here from the run's own configuration and synthetic workload with
``--step-overhead-ms`` / ``--per-seq-overhead-ms`` set (the rerun without them is checked against
the recorded simulation first). ``PROFILE`` is the profile the run was validated against (its
recorded path is the device's). A run validated against the roofline (as the programme validated
its copy-on-write and swap run) is rerun with ``PROFILE``'s table model too: with the profile's own host
term, then with each other model's (its steps' table prices were not recorded: no whole-step
errors there). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pagesim.gpu.validate import host_fit, rel_errors  # noqa: E402
from pagesim.sim.config import SimConfig  # noqa: E402
from pagesim.sim.run import run_simulation  # noqa: E402
from pagesim.traces.synth import make_workload  # noqa: E402
from pagesim.traces.transform import apply_max_len_policy, set_parallel  # noqa: E402

E2E = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")


def read_steps(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "steps.csv.gz" if (run / "steps.csv.gz").exists() else run / "steps.csv")


def simulated(run: Path) -> str:
    """The run's simulation folder: the table model's, else (a run validated against the roofline)
    the roofline's, whose settings are rerun here with the profile in its place."""
    return "sim_table" if (run / "sim_table" / "config.json").exists() else "sim_roofline"


def simulate(run: Path, profile: str | None, host: dict | None) -> dict:
    """The run's simulation, rerun: its configuration (``profile``, the table model, in place of
    its cost model; None: as recorded), its synthetic workload with the transforms the validation
    recorded (parallel sampling's n, a beam width)."""
    config = json.loads((run / simulated(run) / "config.json").read_text())
    recorded = json.loads((run / "validation.json").read_text())["workload"]
    workload = recorded["workload"]
    if workload.get("kind") != "synthetic":
        raise SystemExit(f"{run}: validation.json field workload.kind: only a synthetic workload is rerun here")
    names = {f.name for f in dataclasses.fields(SimConfig)}
    cfg = SimConfig(**{k: v for k, v in config.items() if k in names})
    if profile is not None:
        cfg = cfg.replace(profile=profile, cost_model="roofline")
    if host is not None:
        cfg = cfg.replace(step_overhead_ms=host["intercept_ms"], per_seq_overhead_ms=host["per_seq_ms"])
    trace = make_workload(workload["workload"], rate=workload["rate"], num_requests=workload["num_requests"],
                          seed=workload["seed"])
    for step in recorded.get("steps", []):
        if step.get("step") != "parallel":
            raise SystemExit(f"{run}: validation.json field workload.steps: {step.get('step')!r} is not rerun here")
        trace = set_parallel(trace, step.get("n"), step.get("beam_width"))
    trace, _ = apply_max_len_policy(trace, cfg.max_seq_len, cfg.max_len_policy)
    return run_simulation(cfg, trace).summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", nargs=2, action="append", metavar=("DIR", "PROFILE"), required=True)
    a = ap.parse_args(argv)
    runs = {}
    for d, profile in a.run:
        run = Path(d)
        for need in (run / "validation.json", run / simulated(run) / "config.json", Path(profile)):
            if not need.exists():
                raise SystemExit(f"--run {d} {profile}: {need} not found")
        v = json.loads((run / "validation.json").read_text())
        # the host term fitted again: a run validated before 2026-11-28 may record a negative one
        steps = read_steps(run)
        runs[run] = dict(model=v["model"], name=run.name, host=host_fit(steps), profile=profile, steps=steps,
                         real=json.loads((run / "real" / "summary.json").read_text()),
                         recorded=json.loads((run / simulated(run) / "summary.json").read_text()),
                         table=simulated(run) == "sim_table")
    common = Path(os.path.commonpath([run.parent for run in runs]))
    print(f"{'run (folder)':<38} {'host from':<14} {'host ms':>14} {'med':>6} {'p90':>6} "
          + " ".join(f"{name:>6}" for name in ("tput", "TTFT", "TPOT")))
    for run, r in runs.items():
        rerun = simulate(run, r["profile"] if r["table"] else None, None)
        key = "output_throughput"
        if not np.isclose(rerun[key], r["recorded"][key], rtol=1e-9):
            raise SystemExit(f"{run}: the rerun's {key} {rerun[key]} is not the recorded {r['recorded'][key]}")
        others = [o for o in runs.values() if o["model"] != r["model"]]
        # a roofline run: as validated, then with the table model and the profile's host term, then
        # with each other model's (its steps' table prices were not recorded: no whole-step errors)
        for host in [None] + ([] if r["table"] else ["profile"]) + [o["host"] for o in others]:
            s = r["steps"]
            if host is None:
                name, shown, summary = "its own", "as validated", r["recorded"]
                priced = s["predicted_table_s"] if r["table"] else s["predicted_roofline_s"]
            elif host == "profile":
                name, shown, summary = "profile", "the table's", simulate(run, r["profile"], None)
                priced = s["predicted_table_s"]
            else:
                name = next(o["name"] for o in others if o["host"] is host)
                priced = s["predicted_table_gpu_s"] + 1e-3 * (host["intercept_ms"] + host["per_seq_ms"] * s["batch_size"])
                summary = simulate(run, r["profile"], host)
                shown = f"{host['intercept_ms']:.3f} + {host['per_seq_ms']:.4f}"
            e = rel_errors(priced, s["measured_s"])
            ends = [abs(summary[k] - r["real"][k]) / r["real"][k] for k in E2E]
            label = str(run.relative_to(common)) if run != common else run.name
            print(f"{label[-38:]:<38} {name[-14:]:<14} {shown:>14} {np.median(e):6.3f} {np.quantile(e, 0.9):6.3f} "
                  + " ".join(f"{x:6.3f}" for x in ends))
    print("host ms: a step's host term (intercept + per sequence); med, p90: |error| of whole steps;\n"
          "tput (output throughput), TTFT, TPOT (means): |sim - real| / real")
    return 0


if __name__ == "__main__":
    sys.exit(main())
