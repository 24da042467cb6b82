"""``pagesim cost``: cost models against measured GPU timings.

* ``error``: a cost model's error against a measured table (``sim/cost/error.py``);
* ``fit``: the calibrated roofline's constants of one GPU, with provenance and measured error
  (``sim/cost/calibration_fit.py``), written as ``sim/data/calibration/<gpu>.toml`` is;
* ``import``: measured tables as a profile CSV for the table cost model
  (``sim/cost/profile_format.py``);
* ``bands``: the serving model's error by regime against real serving runs (``sim/cost/regime.py``).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from pagesim.sim.cli import HelpFormatter, example
from pagesim.sim.cost import error as cost_error
from pagesim.sim.cost.calibration import SAME_CHIP, Calibration, calibration_path, load_calibration
from pagesim.sim.cost.calibration_fit import (attention_source, error_table, fit_calibration,
                                              leave_one_model_out, score)
from pagesim.sim.cost.cpu_overheads import fit_cpu_overheads, read_cpu_overheads
from pagesim.sim.cost.measured import (check_model, measured_profile_rows, read_measured,
                                       source_commit)
from pagesim.sim.cost.profile_format import write_profile
from pagesim.sim.errors import ConfigError
from pagesim.sim.specs import MODELS, get_gpu
from pagesim.sim.terminal import fill

LOG = logging.getLogger(__name__)  # a line per phase of a fit

SHARED = "../shared/measured"
#: the repository's root: the provenance a fit writes names paths relative to it
REPOSITORY = Path(__file__).resolve().parents[2]


def register(sub) -> None:
    p = sub.add_parser("cost", help="cost models against measured GPU timings: error, fit, import; bands",
                       formatter_class=HelpFormatter, description=__doc__,
                       epilog=example(f"pagesim cost error --measured {SHARED} --model llama-2-7b --gpu a100-80gb",
                                      f"pagesim cost fit --measured {SHARED} --gpu a100-80gb --out a100-80gb.toml",
                                      f"pagesim cost import --measured {SHARED} --model llama-2-7b --gpu a100-80gb "
                                      "--out llama-2-7b.csv", "pagesim cost bands"))
    cs = p.add_subparsers(dest="cost_command", metavar="COMMAND", required=True)

    e = _subcommand(cs, "error", run_error, "a cost model's error against measured iterations",
                    "Price every measured iteration cell (sim/cost/measured.py: layers at every "
                    "token count and TP degree, decode and prefill iterations where attention is "
                    "measured) and print median, p90 and max of |predicted/measured - 1| by phase, "
                    "token count, context and TP degree, and the worst cells.",
                    f"pagesim cost error --measured {SHARED} --model llama-2-7b --gpu a100-80gb "
                    "--cost-model calibrated",
                    f"pagesim cost error --measured {SHARED} --model llama-2-70b --gpu h100-80gb --tp 4 --json")
    e.add_argument("--tp", type=int, default=None,
                   help="only this tensor-parallel degree (default: every one measured)")
    e.add_argument("--cost-model", choices=["roofline", "calibrated"], default="roofline", help="cost model to score")
    e.add_argument("--calibration", metavar="FILE.toml", default=None,
                   help="calibrated: these constants instead of the GPU's shipped ones")
    e.add_argument("--worst", type=int, default=10, help="how many worst cells to list (0 or more)")
    e.add_argument("--json", action="store_true", help="print the statistics as one JSON object")

    f = _subcommand(cs, "fit", run_fit, "fit the calibrated roofline's constants of one GPU",
                    "Fit the constants (sim/cost/calibration_fit.py) on every measured model of "
                    "the GPU, score them leave-one-model-out (each model priced with constants "
                    "fitted on the others) and the roofline on all, and write the constants, their "
                    "provenance and both error tables as TOML. The shipped files are "
                    "sim/data/calibration/<gpu>.toml.",
                    f"pagesim cost fit --measured {SHARED} --gpu a100-80gb --out sim/data/calibration/a100-80gb.toml",
                    with_model=False)
    f.add_argument("--out", required=True, metavar="FILE.toml", help="where to write the constants")
    f.add_argument("--exclude-model", action="append", default=[], metavar="M",
                   help="leave this model out of the fit (repeatable)")
    f.add_argument("--cpu-overheads", metavar="FILE.csv", default=None,
                   help="Vidur's cpu_overheads.csv for this GPU (vLLM's CPU time per iteration, "
                        "measured; sim/cost/cpu_overheads.py): fits the calibrated model's CPU "
                        "overhead per TP degree, else the roofline's default stays")

    i = _subcommand(cs, "import", run_import, "measured tables as a profile CSV for --profile",
                    "Write the table cost model's profile (sim/cost/profile_format.py) from "
                    "measured tables: linear = L x (one layer's measured operations + 2 "
                    "all-reduces at tp > 1) per token count; attn_decode (a full batch x context "
                    "grid: each measured context's batches interpolated, and extended linearly "
                    "past its measured range) and attn_prefill (chunks after no cached tokens) x L "
                    "where attention is measured. No overhead row: the CPU side is not measured "
                    "(use --step-overhead-ms).",
                    f"pagesim cost import --measured {SHARED} --model llama-2-7b --gpu a100-80gb --out llama-2-7b.csv",
                    "pagesim simulate --workload sharegpt --rate 2 --duration 300 --model llama-2-7b "
                    "--gpu a100-80gb --profile llama-2-7b.csv --step-overhead-ms 3")
    i.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    i.add_argument("--layers", type=int, default=None,
                   help="number of layers (default: the model preset's; needed for a model without preset)")
    i.add_argument("--out", required=True, metavar="FILE.csv", help="profile CSV to write")

    b = cs.add_parser("bands", help="the serving model's error by regime, from real runs",
                      formatter_class=HelpFormatter,
                      description="Print each regime's real runs and the serving cost model's error on them (sim / "
                                  "real - 1 of the whole run's mean E2E, TTFT and TPOT: median and p90 of |error|, "
                                  "10th and 90th percentile of the signed error), as sim/data/serving/regimes.toml "
                                  "keeps them (benchmarks/serving_bands.py writes it; sim/cost/regime.py reads "
                                  "it). An answer's band is the widest of its regime's rows: moe or dense by its "
                                  "model, with held-out-gpu beside it on a GPU without fitted runs.",
                      epilog=example("pagesim cost bands", "pagesim cost bands --json"))
    b.add_argument("--json", action="store_true", help="print the table as one JSON object")
    b.set_defaults(func=run_bands)


def _subcommand(cs, name: str, func, help_: str, description: str, *examples: str,
                with_model: bool = True) -> argparse.ArgumentParser:
    """One ``pagesim cost`` subcommand with the options every one takes (``--measured``, ``--gpu``,
    and ``--model`` unless ``with_model`` is false)."""
    p = cs.add_parser(name, help=help_, formatter_class=HelpFormatter, description=description,
                      epilog=example(*examples))
    p.add_argument("--measured", required=True, metavar="DIR",
                   help="measured folder (layout in sim/cost/measured.py)")
    if with_model:
        p.add_argument("--model", required=True, help="measured model: llama-2-7b, llama-2-70b, llama-3-70b, "
                                                      "codellama-34b-instruct, qwen-72b, phi-2")
    p.add_argument("--gpu", required=True, help="GPU preset measured in DIR: a100-80gb, h100-80gb, a40")
    p.set_defaults(func=func)
    return p


def _read(args):
    gpu = get_gpu(args.gpu)
    measured = read_measured(args.measured, gpu.name)
    return gpu, measured, check_model(measured, args.model)


def run_bands(args: argparse.Namespace) -> int:
    """``pagesim cost bands``: one row per regime (:func:`sim.cost.regime.regime_table`)."""
    from pagesim.sim.cost.regime import REGIMES_PATH, model_table, regime_table

    rows = regime_table()
    if not rows:
        raise ConfigError(f"{REGIMES_PATH}: no regimes; run benchmarks/serving_bands.py")
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'regime':<13}{'runs':>5}  {'E2E median':>10} {'p90':>6} {'10th':>7} {'90th':>7}  "
          f"{'TTFT median':>11} {'TPOT median':>11}")
    pct, sign = (lambda v: f"{100 * v:.1f}"), (lambda v: f"{100 * v:+.1f}")
    for name, r in rows.items():
        print(f"{name.replace('_', '-'):<13}{r['runs']:>5}  {pct(r['median']):>10} {pct(r['p90']):>6} {sign(r['low']):>7} "
              f"{sign(r['high']):>7}  {pct(r['ttft_median']):>11} {pct(r['tpot_median']):>11}")
    for name, r in rows.items():
        print(fill(f"{name.replace('_', '-')}: {r['runs']} runs on {r['gpu']}, {r['method']}"))
    print(fill("percent; sim / real - 1 of each run's mean E2E (median, p90: of its absolute value; 10th, 90th: "
               "signed, negative where the model is too fast), TTFT and TPOT; an answer's band is the widest of "
               "its regime's rows (sim/cost/regime.py)"))
    models = model_table()
    if models:
        w = max(16, 2 + max(len(r["model"]) for r in models))  # the model column: its longest name
        print(f"\nby GPU and model\n{'gpu':<14}{'model':<{w}}{'runs':>4}  {'held out':<9}{'E2E':>6}{'TTFT':>7}"
              f"{'TPOT':>7}  {'E2E lowest':>10} {'highest':>8}")
        for r in models:
            print(f"{r['gpu']:<14}{r['model']:<{w}}{r['runs']:>4}  {'by ' + r['held_out']:<9}{pct(r['e2e']):>6}"
                  f"{pct(r['ttft']):>7}{pct(r['tpot']):>7}  {sign(r['e2e_low']):>10} {sign(r['e2e_high']):>8}")
        print(fill("percent; median |sim / real - 1| of the runs' mean E2E, TTFT and TPOT, and the signed E2E "
                   "error's extremes; each run priced by constants fitted without its model (by model) or without "
                   "its GPU (by GPU)"))
    return 0


def run_error(args: argparse.Namespace) -> int:
    if args.worst < 0:
        raise ConfigError(f"--worst must be >= 0, got {args.worst}")
    if args.calibration and args.cost_model != "calibrated":
        raise ConfigError("--calibration needs --cost-model calibrated")
    cal, note = None, ""
    if args.calibration:  # (checked before the timings are read: another GPU's constants would score them)
        cal, gpu = Calibration.from_toml(args.calibration), get_gpu(args.gpu)
        if get_gpu(cal.gpu).name not in (gpu.name, SAME_CHIP.get(gpu.name)):
            raise ConfigError(f"--calibration {args.calibration}: constants of {cal.gpu}, not of --gpu {gpu.name}")
    gpu, measured, model = _read(args)
    if args.cost_model == "calibrated":
        cal = cal or load_calibration(gpu.name)
        src = args.calibration or calibration_path(gpu.name)
        if model in cal.provenance.get("models", []):
            note = (f"note: {model} is among the models {src} was fitted on (in-sample); its held-out error is "
                    f"in that file's [error.calibrated.models.{model}], or fit without it: pagesim cost fit "
                    f"--exclude-model {model}")
    frame = score(measured, model, gpu, args.cost_model, cal)
    if args.tp is not None:
        scored = sorted(set(frame["tp"]))
        frame = frame[frame["tp"] == args.tp]
        if frame.empty:
            have = sorted(set(measured.models[model].ops["tp"]))
            raise ConfigError(f"--tp {args.tp}: {model} on {gpu.name} is scored at TP "
                              f"{', '.join(map(str, scored)) or 'none'} (its operations are measured at "
                              f"{', '.join(map(str, have))}; a degree above 1 also needs the GPU's all-reduce "
                              "timings at that degree)")
    if args.json:
        out = {"model": model, "gpu": gpu.name, "cost_model": args.cost_model, **cost_error.summary(frame),
               "worst": cost_error.worst(frame, args.worst)[["phase", "tokens", "context", "tp", "measured_s",
                                                              "predicted_s", "error"]].to_dict("records")}
        print(json.dumps(out))
    else:
        title = f"{args.cost_model} cost model vs measured {model} on {gpu.name} ({args.measured})"
        cost_error.print_report(frame, title, sys.stdout, args.worst)
    if note:
        print(fill(note), file=sys.stderr)
    return 0


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pagesim_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=10)
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def portable(path: str | Path) -> str:
    """``path`` as a calibration's provenance records it: relative to the repository's root when
    it lies in the folder holding the repository (``../shared/measured``), so that the file names
    no machine's folders; else as given."""
    p = Path(path).resolve()
    return os.path.relpath(p, REPOSITORY) if p.is_relative_to(REPOSITORY.parent) else str(path)


def check_writable_file(path: Path, flag: str) -> None:
    """Refuse a file ``flag`` names that cannot be written (a folder, under a file, in a folder
    without write permission), before anything slow runs."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give the file to write (e.g. {path / 'gpu.toml'})")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: {folder} is not a folder")
    if not os.access(folder if not path.exists() else path, os.W_OK):
        raise ConfigError(f"{flag} {path}: {path if path.exists() else folder} is not writable")


def run_fit(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import pandas as pd

    gpu = get_gpu(args.gpu)
    check_writable_file(Path(args.out), "--out")  # before the fit's minutes, not after them
    # the CPU-overhead table is read and fitted first: a missing or malformed file is one line at
    # once, not after the minutes the GPU fit takes
    cpu = fit_cpu_overheads(read_cpu_overheads(args.cpu_overheads)) if args.cpu_overheads else None
    if cpu is not None and min(cpu["fixed_s"] + cpu["per_seq_s"]) <= 0:
        raise ConfigError(f"{args.cpu_overheads}: the fitted CPU time is not positive at every TP degree "
                          f"(fixed {cpu['fixed_s']}, per sequence {cpu['per_seq_s']})")
    root = Path(args.measured)
    measured = read_measured(root, gpu.name)
    excluded = {check_model(measured, m) for m in args.exclude_model}
    for m in excluded:
        del measured.models[m]
        measured.attention.pop(m, None)
    if not measured.models:
        raise ConfigError("--exclude-model left no model to fit")
    source = attention_source(root, measured)
    LOG.info("fitting %s's constants on %s", gpu.name, ", ".join(sorted(measured.models)))
    cal = fit_calibration(measured, gpu, attention_from=source)
    lomo = leave_one_model_out(measured, gpu, source)
    roof = [score(measured, m, gpu, "roofline") for m in sorted(measured.models)]
    error = {"scope": "GPU time per iteration: one layer's measured operations + attention where measured + "
                      "tensor-parallel all-reduces; LM head and CPU left out "
                      "(sim/cost/measured.py, sim/cost/error.py)",
             "calibrated": {"method": "leave-one-model-out", **error_table(lomo)},
             "roofline": {"method": "all measured models", **error_table(pd.concat(roof))}}
    if measured.attention:
        att = "fitted on " + ", ".join(f"{measured.folder} {m}" for m in sorted(measured.attention))
    elif source is not None:
        att = (f"taken from {source[1].name} ({', '.join(sorted(source[0].attention))}): no attention timings for "
               f"{gpu.name}; efficiencies are fractions of {gpu.name}'s own peaks")
    else:  # pragma: no cover (fit_calibration raised already)
        att = "none"
    files = sorted(measured.files + (source[0].files if source else []))
    provenance = {
        "gpu": gpu.name, "source": portable(root), "source_commit": source_commit(root),
        "source_license": "MIT (Microsoft Vidur profiling data; Agrawal et al., MLSys 2024)",
        "files": [f"{p.resolve().relative_to(root.resolve())} sha256:{_sha256(p)}" for p in files],
        "models": sorted(measured.models), "excluded_models": sorted(excluded), "attention": att,
        "pagesim_commit": _pagesim_commit(),
        "command": " ".join(["pagesim cost fit --measured", portable(args.measured), "--gpu", args.gpu,
                             "--out", portable(args.out),
                             *(f"--exclude-model {m}" for m in args.exclude_model)]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    }
    if cpu is not None:
        cal = replace(cal, cpu_tp=tuple(cpu["tp"]), cpu_fixed_s=tuple(cpu["fixed_s"]),
                      cpu_per_seq_s=tuple(cpu["per_seq_s"]))
        path = Path(args.cpu_overheads)
        provenance["cpu_overheads"] = {
            "file": f"{path.name} sha256:{_sha256(path)}",
            "source": "github.com/microsoft/vidur, data/profiling/<gpu>/cpu_overheads.csv in its history (removed "
                      "after commit 6d98aa8f; MIT license, Agrawal et al., MLSys 2024)",
            "rule": "schedule + sampler_e2e + prepare_inputs_e2e + process_model_outputs medians + ray_comm_time mean "
                    "(Vidur's sklearn_execution_time_predictor), fitted as fixed + per_seq x batch per TP degree",
            "models": [", ".join(m) for m in cpu["models"]],
            "median_error": cpu["median_error"], "max_error": cpu["max_error"]}
        provenance["command"] += f" --cpu-overheads {portable(args.cpu_overheads)}"
    cal = replace(cal, provenance=provenance, error=error)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(cal.to_toml())
    print(fill(f"fitted {gpu.name} on {', '.join(sorted(measured.models))}; attention {att}"))
    for name, frame in (("calibrated, leave-one-model-out", lomo), ("roofline", pd.concat(roof))):
        s = cost_error.summary(frame)
        print(fill(", ".join(f"{k} median {cost_error.pct(v['median'])} p90 {cost_error.pct(v['p90'])}"
                             for k, v in s.items()), first=f"  {name:32s} ", rest=" " * 35))
    print(f"wrote {out}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    if args.layers is not None and args.layers < 1:
        raise ConfigError(f"--layers must be >= 1, got {args.layers}")
    gpu, measured, model = _read(args)
    layers = args.layers or (MODELS[model].num_layers if model in MODELS else None)
    if not layers:
        raise ConfigError(f"--layers: {model} has no preset; give its number of layers (>= 1)")
    rows = measured_profile_rows(measured, model, args.tp, layers)
    path = write_profile(rows, args.out)
    print(fill(f"wrote {path}: {len(rows)} rows ({model}, {gpu.name}, tp {args.tp}, {layers} layers)"))
    return 0
