"""DistServe's Fig. 8 (OPT-13B chatbot) three ways, on the same requests: pagesim's figure
(``pagesim reproduce distserve``), DistServe's own simulator (``simdistserve``, the authors'
artifact: its own vLLM and DistServe engines over step times profiled on A100s), and the
artifact's measured curves (``experiments/data/paper_numbers.csv``).

The peer runs every request of each of the figure's runs (``experiments/configs/distserve.toml``:
the ``chatbot-distserve`` lengths, 300 requests, seed 0, the same arrivals): the disaggregated
design as DistServe's OPT-13B placement (prefill TP 2, decode TP 1), the colocated one as the
figure routes it, request i to vLLM replica i mod 3, each replica a simdistserve vLLM instance
(TP 1) over its third. A request meets the SLO when its TTFT <= 0.25 s and its TPOT <= 0.1 s, over
every request (the artifact's ``get_attainment``). Then each engine's step times for a few
shapes: the artifact's profiles (``simdistserve/estimators/time_estimator.py``) beside pagesim's
cost model as the figure prices them (the roofline, its default CPU term included).

Needs DistServe in the peers' cache: ``python -m tests.peers.fetch`` (or ``--distserve DIR``, a
checkout or export of its pinned commit). Prints the tables and writes them to
``benchmarks/results/distserve_peer_<date>.txt``. Asserts nothing.
Run: ``python benchmarks/distserve_peer.py`` (~1 min on 2 cores once the core is compiled).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pagesim.experiments import paper  # noqa: E402
from pagesim.experiments.figures import distserve as figure  # noqa: E402
from pagesim.experiments.figures.common import SweepOptions, figure_specs  # noqa: E402
from pagesim.experiments.run_spec import spec_workload  # noqa: E402
from pagesim.sim.batch import StepBatch  # noqa: E402
from pagesim.sim.cost.models import make_cost_model  # noqa: E402
from pagesim.sim.specs.gpus import get_gpu  # noqa: E402
from pagesim.sim.specs.presets import get_model  # noqa: E402
from tests.peers.fetch import DISTSERVE  # noqa: E402

#: the artifact's OPT-13B chatbot SLOs, in ms (paper_numbers.csv)
TTFT_MS = 1e3 * paper.paper_value("distserve", "slo_ttft_s", workload="sharegpt")
TPOT_MS = 1e3 * paper.paper_value("distserve", "slo_tpot_s", workload="sharegpt")
COLOCATED_REPLICAS = 3
#: the artifact's profiled engines priced beside pagesim: (engine, TP)
ENGINES = (("vllm", 1), ("distserve", 1), ("distserve", 2))


def peer_attainment(trace: pd.DataFrame, backend: str, tp_prefill: int, tp_decode: int) -> np.ndarray:
    """Each request's SLO met (bool) under simdistserve's ``backend``, the trace's own arrivals."""
    from simdistserve.benchmarks import simulate_dist

    rows = [{"start_time": float(a), "prompt_len": int(p), "output_len": int(o)}
            for a, p, o in zip(trace["arrival_s"], trace["prompt_tokens"], trace["output_tokens"])]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(rows, f)
        f.flush()
        args = simulate_dist.parse_args([
            "--backend", backend, "--model", "facebook/opt-13b", "--N", str(len(rows)),
            "--arrival", "custom", "--workload", f.name, "--tp-prefill", str(tp_prefill),
            "--tp-decode", str(tp_decode), "--slo-scales", "[1.0]"])
        out: dict = {}
        with contextlib.redirect_stdout(io.StringIO()):  # it prints its own tables
            simulate_dist.main(args, out)
    lat = out["per_request_latency_df"]
    return ((lat["first_token_latency"] <= TTFT_MS) & (lat["tpot"] <= TPOT_MS)).to_numpy()


def peer_curves(specs) -> pd.DataFrame:
    """simdistserve's attainment per design and rate, over the figure's own requests."""
    rows = []
    for spec in specs:
        design, gpus = figure.design_and_gpus(spec)
        trace = spec_workload(spec.workload, spec.rate, spec.duration_s, spec.num_requests, spec.seed,
                              spec.n, spec.beam_width)
        if design == "disaggregated":
            met = peer_attainment(trace, "distserve", int(spec.disagg["prefill_tp"]),
                                  int(spec.disagg["decode_tp"]))
        else:  # round-robin, as the figure's router: request i to replica i mod 3
            met = np.concatenate([peer_attainment(trace.iloc[r::COLOCATED_REPLICAS], "vllm", 1, 1)
                                  for r in range(COLOCATED_REPLICAS)])
        rows.append({"design": design, "per_gpu_rate": spec.rate / gpus, "slo_attainment": met.mean()})
    return pd.DataFrame(rows)


def step_times() -> pd.DataFrame:
    """A few OPT-13B steps on an A100-80GB, in ms: the artifact's profiled vLLM 0.1.7 (TP 1) and
    DistServe (TP 1, TP 2) against pagesim's roofline with its default CPU term (the figure's)."""
    from simdistserve.estimators.time_estimator import get_decode_time, get_prefill_time

    model, gpu = get_model("opt-13b"), get_gpu("a100-80gb")
    ours = {tp: make_cost_model(model, gpu, tp, cost_model="roofline") for tp in (1, 2)}
    shapes = [("prefill", 1, n) for n in (256, 780, 1500, 2000)] + \
             [("decode", b, 1000) for b in (1, 32, 128)]
    rows = []
    for phase, batch, tokens in shapes:
        if phase == "prefill":
            step = StepBatch(prefill_seq_ids=np.zeros(1, np.int64), prefill_tokens=np.array([tokens]),
                             prefill_context=np.array([tokens]))
            theirs = {f"{e} TP{tp}": get_prefill_time(prefill_len_list=[tokens], TP=tp, engine_type=e)
                      for e, tp in ENGINES}
        else:
            step = StepBatch(decode_seq_ids=np.arange(batch, dtype=np.int64),
                             decode_context=np.full(batch, tokens + 1, np.int64))
            theirs = {f"{e} TP{tp}": get_decode_time(batch, token_generated_list=[tokens] * batch,
                                                     TP=tp, engine_type=e)
                      for e, tp in ENGINES}
        rows.append({"step": f"{phase} {batch} x {tokens}", **theirs,
                     **{f"pagesim TP{tp}": 1e3 * cm.step_time(step) for tp, cm in ours.items()}})
    return pd.DataFrame(rows)


def main() -> int:
    folder = DISTSERVE.folder()
    if not (folder / ".unpacked").exists():
        print(f"distserve_peer: DistServe's simulator is not in {folder}: run "
              "`python -m tests.peers.fetch` (or --distserve DIR)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(folder))
    specs = figure_specs("distserve", False, 1.0)
    ours = figure.run(SweepOptions(progress=False))
    theirs = peer_curves(specs)
    measured = paper.distserve_paper_curve()
    key = ["design", "per_gpu_rate"]
    table = (ours[key + ["slo_attainment"]].rename(columns={"slo_attainment": "pagesim"})
             .merge(theirs.rename(columns={"slo_attainment": "simdistserve"}), on=key)
             .merge(measured.rename(columns={"slo_attainment": "measured"}), on=key, how="left"))
    target = paper.paper_value("distserve", "slo_attainment_target", workload="sharegpt")
    goodput, notes = [], []  # notes: a goodput not interpolated between two probes, and why
    for name in ("pagesim", "simdistserve", "measured"):
        found = {d: figure.goodput_per_gpu(g["per_gpu_rate"], g[name], target)
                 for d, g in table.groupby("design", sort=False)}
        dis, col = found["disaggregated"][0], found["colocated"][0]
        goodput.append({"source": name, "disaggregated": dis, "colocated": col, "ratio": dis / col})
        notes += [f"{name} {d}: {h}" for d, (_, h) in found.items() if h != "interpolated"]
    lengths = pd.concat([spec_workload(s.workload, s.rate, s.duration_s, s.num_requests, s.seed, s.n,
                                       s.beam_width) for s in specs])
    lines = [f"distserve_peer {_dt.date.today()}: DistServe Fig. 8 (OPT-13B chatbot, A100-80GB),",
             f"{len(specs)} runs of {specs[0].num_requests} requests ({specs[0].workload}: prompts mean "
             f"{lengths['prompt_tokens'].mean():.0f}, outputs mean {lengths['output_tokens'].mean():.0f});",
             f"simdistserve at {DISTSERVE.commit[:7]}",
             "", "SLO attainment (TTFT <= 0.25 s and TPOT <= 0.1 s) by per-GPU rate:",
             table.to_string(index=False, float_format=lambda v: f"{v:.3f}"),
             "", f"Goodput (req/s per GPU at {100 * target:.0f} % attainment) and the ratio:",
             pd.DataFrame(goodput).to_string(index=False, float_format=lambda v: f"{v:.2f}"),
             *notes,
             "", "Step times (ms), OPT-13B on an A100-80GB: the artifact's profiles (vllm: vLLM 0.1.7;",
             "distserve: DistServe's engine) and pagesim's roofline with its CPU term:",
             step_times().to_string(index=False, float_format=lambda v: f"{v:.1f}")]
    text = "\n".join(lines)
    print(text)
    out = ROOT / "benchmarks" / "results" / f"distserve_peer_{_dt.date.today()}.txt"
    out.write_text(text + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
