"""``pagesim plan disaggregation``: aggregated or disaggregated, and how many of each.

For a target rate and an SLO, at ``N`` GPUs: ``N / tp`` aggregated ``vllm-v1`` replicas behind
the router (``sim/cluster.py``) beside every disaggregated split ``P:D`` with ``P + D = N / tp``
(``sim/disagg.py``), each a probe of the same workload at the same rate through plan's
:class:`experiments.probe.Runner` (its cache, its SLO verdict, its count of runs). Per design:
whether it meets the SLO, its SLO attainment and goodput (requests meeting every threshold, per
second, and per GPU), its p99 TTFT and TPOT. The choice at ``N`` is the passing design with the
most goodput (the aggregated one on a tie: one pool is the simpler deployment); none when no
design passes.

Then the fewest GPUs meeting the SLO each way, by :func:`experiments.plan.fewest` from ``N``
(down while the next fewer passes, up while it fails): aggregated, one probe per count;
disaggregated, a count passes when one of its splits does. The splits of a count are probed in
rounds of the runner's parallel slots, nearest first to the best split's prefill share at ``N``
(half where none passed), and the count's probing ends at the first round with a pass (the
early stop: a count's remaining splits are not run once one meets the SLO).

**The SLO's scale.** Each design at ``N`` is read again (its run's requests, no new run) under
the SLO with every threshold x s, s in :data:`SLO_SCALES`: its attainment and goodput per GPU
against how strict the SLO is, as DistServe's Fig. 8 draws its bottom row.

``quick``: at ``N`` only the splits whose prefill pool is about a quarter, a half and three
quarters of it, and no error band for the fewest GPUs.

**Band.** With the GPU time scales the cost model's measured error gives
(``sim.cost.calibration.gpu_time_scales``), each design at ``N`` is probed again with the GPU
time x the first ("slow") and x the second ("fast"), and the fewest GPUs are
searched again under each (from the central answer, so a few probes each): the answers the
cost model's error allows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pagesim.experiments.plan import PlanSetup, _clean, _lightweight, fewest
from pagesim.experiments.probe import Runner
from pagesim.experiments.run_spec import RunSpec
from pagesim.experiments.slo import evaluate_point
from pagesim.sim.errors import ConfigError

SYSTEM = "vllm-v1"  # the engine whose KV connector sim/disagg.py models
#: the SLO's scales the designs' goodput is read at: every threshold x s (DistServe's Fig. 8 scales
#: its SLOs so, its bottom row; :func:`goodput_by_slo_scale`)
SLO_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
#: a design's row: its point's keys kept
POINT_KEYS = ("passed", "slo_attainment", "request_goodput", "p99_ttft_s", "p99_tpot_s",
              "request_throughput", "fail_reason")


def splits(units: int, quick: bool = False) -> list[tuple[int, int]]:
    """The ``P:D`` splits of ``units`` replicas (each pool at least one); ``quick``: the prefill
    pool at about a quarter, a half and three quarters (rounded, repeats dropped)."""
    every = [(p, units - p) for p in range(1, units)]
    if not quick:
        return every
    wanted = sorted({min(max(round(units * f), 1), units - 1) for f in (0.25, 0.5, 0.75)})
    return [(p, units - p) for p in wanted if units >= 2]


@dataclasses.dataclass
class Designs:
    """How to probe each design at the target ``rate``: the base probe and the pools' options."""

    setup: PlanSetup
    rate: float
    router: str = "round-robin"
    kv_link: str = "ib-ndr"

    @property
    def tp(self) -> int:
        return int(self.setup.sim.get("tensor_parallel") or 1)

    def base(self, sim: dict[str, Any] | None = None) -> RunSpec:
        # full: a cluster's run is never stopped early, and one key per design
        return self.setup.spec(SYSTEM, self.rate, full=True, **(sim or {}))

    def aggregated(self, units: int, sim: dict[str, Any] | None = None) -> RunSpec:
        return dataclasses.replace(self.base(sim), replicas=units, router=self.router)

    def disaggregated(self, p: int, d: int, sim: dict[str, Any] | None = None) -> RunSpec:
        return dataclasses.replace(self.base(sim), router=self.router,
                                   disagg={"prefill_replicas": p, "decode_replicas": d, "kv_link": self.kv_link})


def row_of(design: str, p: int, d: int, gpus: int, point: dict) -> dict[str, Any]:
    """A design's row: its name, pools, GPUs, its point's SLO figures and goodput per GPU."""
    row = {"design": design, "prefill": p or None, "decode": d or None, "gpus": gpus}
    row.update({k: point.get(k) for k in POINT_KEYS})
    goodput = point.get("request_goodput")
    row["goodput_per_gpu"] = goodput / gpus if goodput is not None and goodput == goodput else None
    return row


def choose(rows: list[dict]) -> dict | None:
    """The passing design with the most goodput; the aggregated one on a tie; None if none
    passes."""
    passing = [r for r in rows if r["passed"]]
    if not passing:
        return None
    return max(passing, key=lambda r: (r["request_goodput"] or 0.0, r["design"] == "aggregated"))


def cases_at(designs: Designs, units: int, quick: bool,
             sim: dict[str, Any] | None = None) -> list[tuple[str, int, int, RunSpec]]:
    """Every design at ``units`` replicas as (name, P, D, probe): aggregated first, then each
    split."""
    cases = [("aggregated", 0, 0, designs.aggregated(units, sim))]
    return cases + [(f"{p}:{d}", p, d, designs.disaggregated(p, d, sim)) for p, d in splits(units, quick)]


def compare_at(designs: Designs, units: int, runner: Runner, quick: bool,
               sim: dict[str, Any] | None = None) -> list[dict]:
    """Every design at ``units`` replicas (one batch of probes)."""
    cases = cases_at(designs, units, quick, sim)
    points = runner.evaluate([spec for *_k, spec in cases])
    return [row_of(name, p, d, units * designs.tp, point) for (name, p, d, _s), point in zip(cases, points)]


def goodput_by_slo_scale(designs: Designs, units: int, runner: Runner, quick: bool) -> list[dict]:
    """Each design at ``units`` replicas (:func:`compare_at`'s runs, read back) under its SLO
    with every threshold x s, for each s of :data:`SLO_SCALES`: its SLO attainment and goodput
    per GPU (DistServe's Fig. 8, bottom row, as goodput). At s = 1, the designs' table's."""
    rows = []
    gpus = units * designs.tp
    for name, _p, _d, spec in cases_at(designs, units, quick):
        point = runner.evaluate([spec])[0]  # memoized: its run's duration
        if point.get("error"):
            continue
        requests = runner.requests(spec)
        for scale in SLO_SCALES:
            scored = evaluate_point(requests, runner.slo.scaled(scale), duration_s=point.get("duration_s"))
            rows.append({"design": name, "slo_scale": scale, "slo_attainment": scored["slo_attainment"],
                         "goodput_per_gpu": scored["request_goodput"] / gpus})
    return rows


def best_split(designs: Designs, units: int, runner: Runner, share: float,
               sim: dict[str, Any] | None = None) -> dict | None:
    """A passing split of ``units`` replicas, or None: splits probed in rounds of the runner's
    slots, nearest first to the prefill ``share``, ending at the first round with a pass (its
    best by goodput)."""
    order = sorted(splits(units), key=lambda s: (abs(s[0] / units - share), s[0]))
    step = max(1, runner.slots)
    for i in range(0, len(order), step):
        chunk = order[i:i + step]
        points = runner.evaluate([designs.disaggregated(p, d, sim) for p, d in chunk])
        rows = [row_of(f"{p}:{d}", p, d, units * designs.tp, pt)
                for (p, d), pt in zip(chunk, points)]
        best = choose(rows)
        if best is not None:
            return best
    return None


def fewest_each_way(designs: Designs, units: int, most: int, runner: Runner, share: float,
                    sim: dict[str, Any] | None = None,
                    start: dict[str, int | None] | None = None) -> dict[str, tuple]:
    """The fewest replicas meeting the SLO aggregated (from 1) and disaggregated (from 2), each
    searched from ``start``'s count for it (default ``units``) by
    :func:`experiments.plan.fewest`: per way, (replicas or None, the passing row or None)."""
    start = start or {}

    def aggregated(k: int) -> dict | None:
        point = runner.evaluate([designs.aggregated(k, sim)])[0]
        row = row_of("aggregated", 0, 0, k * designs.tp, point)
        return row if row["passed"] else None

    return {"aggregated": fewest(aggregated, start.get("aggregated") or units, most),
            "disaggregated": fewest(lambda k: best_split(designs, k, runner, share, sim),
                                    start.get("disaggregated") or units, most, least=2)}


def disaggregation(setup: PlanSetup, rate: float, gpus: int, runner: Runner, *,
                   max_gpus: int | None = None, router: str = "round-robin",
                   kv_link: str = "ib-ndr", quick: bool = False,
                   scales: list[float] | None = None) -> dict[str, Any]:
    """Aggregated or disaggregated at ``gpus`` GPUs for ``rate`` (req/s), and the fewest GPUs
    meeting the SLO each way up to ``max_gpus`` (default twice ``gpus``); ``scales``: the GPU
    time scales of the band (module docstring), None for none."""
    if not rate > 0:
        raise ConfigError(f"--rate must be > 0, got {rate}")
    designs = Designs(setup, float(rate), router, kv_link)
    tp = designs.tp
    max_gpus = max_gpus or 2 * gpus
    if gpus % tp or gpus < 2 * tp:
        raise ConfigError(f"--gpus must be a multiple of --tp ({tp}) holding two replicas at least "
                          f"(one per pool), got {gpus}")
    if max_gpus < gpus:
        raise ConfigError(f"--max-gpus {max_gpus} is below --gpus {gpus}")
    units, most = gpus // tp, max_gpus // tp
    rows = compare_at(designs, units, runner, quick)
    by_scale = goodput_by_slo_scale(designs, units, runner, quick)
    chosen = choose(rows)
    split_rows = [r for r in rows if r["prefill"] and r["passed"]]
    share = 0.5  # the best passing split's prefill share, else half
    if split_rows:
        share = max(split_rows, key=lambda r: r["request_goodput"])["prefill"] / units
    found = fewest_each_way(designs, units, most, runner, share)
    band = None
    if scales is not None:
        band = {"gpu_time_scales": list(scales)}
        for scale, key in zip(scales, ("slow", "fast")):
            sim = {"cost_scale": scale}
            again = {r["design"]: r for r in compare_at(designs, units, runner, quick, sim)}
            for r in rows:
                r[f"meets_{key}"] = again[r["design"]]["passed"]
            again_chosen = choose(list(again.values()))
            band[f"choice_{key}"] = again_chosen["design"] if again_chosen else None
            if not quick:
                start = {way: k for way, (k, _p) in found.items()}
                again_found = fewest_each_way(designs, units, most, runner, share, sim, start)
                band[f"fewest_{key}"] = {way: None if k is None else k * tp
                                         for way, (k, _p) in again_found.items()}
    fewest_rows = []
    for way, (k, point) in found.items():
        row = {"way": way, "gpus": None if k is None else k * tp,
               "design": point["design"] if point else None}
        if point:
            keys = ("slo_attainment", "request_goodput", "goodput_per_gpu", "p99_ttft_s",
                    "p99_tpot_s")
            row.update({key: point.get(key) for key in keys})
        else:
            row["note"] = f"no {way} design of up to {max_gpus} GPUs meets the SLO"
        if band and "fewest_slow" in band:
            row["gpus_slow"], row["gpus_fast"] = band["fewest_slow"][way], band["fewest_fast"][way]
        fewest_rows.append(row)
    return {"mode": "disaggregation", "rate": float(rate), "gpu_count": gpus, "max_gpus": max_gpus,
            "router": router, "kv_link": kv_link, "quick": quick,
            "designs": [{k: _clean(v) for k, v in r.items()} for r in rows],
            "choice": chosen["design"] if chosen else None,
            "fewest": [{k: _clean(v) for k, v in r.items()} for r in fewest_rows],
            "slo_scales": [{k: _clean(v) for k, v in r.items()} for r in by_scale],
            "error_band": band, "points": _lightweight([]), "warnings": [],
            "num_simulated": runner.num_simulated}
