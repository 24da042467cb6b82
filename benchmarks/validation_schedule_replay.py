"""Replay a GPU validation's schedule on the CPU with the step times it measured, and add the step
columns that run did not record (``max_decode_context``, the longest decode context of each step).

The scheduler is the simulator's own and its clock the measured steps, so the replay takes the
same decisions step by step: the script refuses a replay whose decode batches or context sums
differ from the run's. Then it fits the measured device time of the decode steps whose launches
were hidden against the batch's shape, with and without the longest context::

    python benchmarks/validation_schedule_replay.py STEPS_CSV --out DIR -- VALIDATE_ARGS...

``VALIDATE_ARGS`` are the run's own ``pagesim validate`` options (its log's first line), less
``--out`` and ``--profile``; ``--backend fake`` is added. Used on the H100 run of 2026-11-26
(benchmarks/results/2026-11-26-h100-80gb-hbm3/README.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

sys.path.insert(0, import_path())
from pagesim.gpu import validate_cli  # noqa: E402
from pagesim.sim.cli import main as cli  # noqa: E402

FITS = (("graph", "seqs", "kctx"), ("graph", "seqs", "kctx", "seqs_kmax"), ("graph", "kctx", "seqs_kmax"))


def replay(steps: pd.DataFrame, out: Path, args: list[str]) -> pd.DataFrame:
    gpu_s, host_s = steps.measured_gpu_s.to_numpy(), steps.measured_host_s.to_numpy()
    made = validate_cli.make_backend

    def measured_backend(a, cfg=None):
        backend = made(a, cfg)
        backend.time_fn = lambda plan: float(gpu_s[plan.step])
        backend.host_fn = lambda plan: float(host_s[plan.step])
        return backend

    validate_cli.make_backend = measured_backend
    try:
        cli(["validate", *args, "--backend", "fake", "--out", str(out)])
    finally:
        validate_cli.make_backend = made
    again = pd.read_csv(out / "steps.csv")
    same = len(again) == len(steps) and all((again[c].to_numpy() == steps[c].to_numpy()).all()
                                            for c in ("num_decode_seqs", "sum_decode_context"))
    if not same:
        raise SystemExit(f"the replay's schedule differs from the run's ({len(again)} steps against "
                         f"{len(steps)}): check VALIDATE_ARGS")
    return steps.assign(max_decode_context=again.max_decode_context.to_numpy())


def fits(steps: pd.DataFrame) -> list[str]:
    hidden = ~steps.gaps_hidden.eq(False)  # a backend without a hold records none (NaN)
    d = steps[(steps.step_type == "decode") & hidden]
    feats = {"graph": d.graph_size, "seqs": d.num_decode_seqs, "kctx": d.sum_decode_context / 1e3,
             "seqs_kmax": d.num_decode_seqs * d.max_decode_context / 1e3}
    lines = [f"{len(d)} decode steps with their launches hidden; ms = a + sum(coefficient x feature)"]
    if len(d) < 2 * max(map(len, FITS)):
        return lines + ["  too few to fit"]
    for what, y in (("measured", d.measured_gpu_s * 1e3), ("table", d.predicted_table_gpu_s * 1e3)):
        for names in FITS:
            X = np.c_[np.ones(len(d)), *[feats[n] for n in names]]
            coef, *_ = np.linalg.lstsq(X, y, rcond=None)
            resid = np.abs(y - X @ coef)
            lines.append(f"  {what:8s} a={coef[0]:.2f} " + " ".join(f"{n}={c:+.3f}" for n, c in zip(names, coef[1:]))
                         + f"  |resid| med {np.median(resid):.3f} p90 {np.percentile(resid, 90):.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("steps", help="the validation's steps.csv (or .csv.gz)")
    ap.add_argument("--out", required=True, help="where the replay writes its own validation folder")
    a = ap.parse_args(argv[:split])
    steps = replay(pd.read_csv(a.steps), Path(a.out), argv[split + 1:])
    print("\n".join(fits(steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
