"""Fig. 2's Orca (Pow2) under other readings of "reserves up to 2x the output", and other
placements: what each does to the memory breakdown (the study behind fig2.py's note on Pow2).

The paper (vLLM, SOSP'23, Sec. 6.1, Baselines): Orca (Pow2) "over-reserves the space for outputs
by at most 2x. For example, if the true output length is 25, it reserves 32 positions for
outputs" -- the reading the simulator runs (``sim/core/kv/extent.py``: R = P + next_pow2(O),
capped at max_seq_len). The others are run through the core's predicted reservation, whose
R = P + round(O (1 + e z)) takes any R >= P + 1 once each request's draw z is set (e = 1):

    pow2-output   R = P + next_pow2(O)           the default (the core's pow2 kind)
    pow2-total    R = next_pow2(P + O)           the whole sequence to a power of two
    double-output R = P + 2 O                    exactly 2x the output
    double-total  R = 2 (P + O)                  2x the sequence

each capped at max_seq_len (so "capped at max_seq_len - P" is pow2-output itself). None
outgrows its reservation (R >= P + O), so the predicted kind never re-reserves.

Placements: the core's buddy (the pool carved into power-of-two blocks, down to the smallest, so
small extents also use the pool's remainder: 15,728 slots = 8192 + 4096 + 2048 + 1024 + 256 +
64 + 32 + 16), first-fit and best-fit, and ``buddy-arenas``: a buddy allocator within
max_seq_len-sized arenas only, the remainder of the pool never used (what Orca (Max) sees
anyway: 7 arenas of 2048 and 1,392 slots, 8.9 %, unusable). It runs on a pool of the arenas
alone; its categories are then rescaled to the whole pool and the remainder counted as
external fragmentation and others.

``python3 -m pagesim.experiments.figures.fig2_pow2 [--duration S]`` prints the table.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from pagesim.experiments.figures.common import MEM_COLS, WARMUP_FRAC, categories, window_mean
from pagesim.sim.config import SimConfig
from pagesim.sim.core.events import replay
from pagesim.sim.core.state import PREDICTOR_ERROR
from pagesim.sim.run import prepare, result
from pagesim.traces.synth import make_workload

#: reading -> R as a function of (prompt P, output O) arrays (before the max_seq_len cap)
READINGS = {
    "pow2-output": lambda p, o: p + next_pow2(o),
    "pow2-total": lambda p, o: next_pow2(p + o),
    "double-output": lambda p, o: p + 2 * o,
    "double-total": lambda p, o: 2 * (p + o),
}
PLACEMENTS = ("buddy", "first-fit", "best-fit", "buddy-arenas")


def next_pow2(x: np.ndarray) -> np.ndarray:
    return (1 << np.ceil(np.log2(np.maximum(x, 1))).astype(np.int64)).astype(np.int64)


def predictor_draws_for(reserve: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """The draws z that make the predicted reservation P + round(O (1 + z)) equal ``reserve``
    (with predictor error 1): z = (R - P) / O - 1, nudged by a quarter token so that rounding
    lands on R."""
    return (reserve - prompt + 0.25) / output - 1.0


def run_reading(reading: str, placement: str, trace: pd.DataFrame, base: dict, t0: float, t1: float) -> dict:
    """Fig. 2's four categories (percent) for Orca under ``reading`` and ``placement``."""
    share = 1.0  # of the whole pool the run's pool is
    if placement == "buddy-arenas":
        whole = prepare(SimConfig.for_system("orca-pow2", **base), trace)
        capacity, per_token = whole.pool.capacity, whole.budget.kv_bytes_per_token
        arenas = capacity // base["max_seq_len"] * base["max_seq_len"]
        base, placement, share = {**base, "kv_gib": arenas * per_token / 2 ** 30}, "buddy", arenas / capacity
    if reading == "pow2-output":
        cfg = SimConfig.for_system("orca-pow2", **base, placement=placement)
        run = prepare(cfg, trace)
    else:
        cfg = SimConfig.for_system("orca-pow2", **base, placement=placement, reservation="predicted",
                                   predictor_error=1.0)
        run = prepare(cfg, trace)
        t = run.table
        run.state.clock[PREDICTOR_ERROR] = 1.0
        run.state.predictor_draw[:] = predictor_draws_for(READINGS[reading](t.prompt, t.output), t.prompt, t.output)
    s, wall = replay.run(run.state)
    res = result(cfg, run._replace(state=s), wall)
    m = window_mean(res.steps, MEM_COLS, t0, t1)
    cap = sum(m.values())
    f = {k[4:]: share * v / cap for k, v in m.items()}
    f["free_idle"] += 1 - share  # the remainder no arena holds
    return {"reading": reading, "placement": "buddy-arenas" if share < 1 else placement, **categories(f),
            "overflows": int(res.summary.get("mgr_num_overflows", 0) or 0)}


def table(duration_s: float = 3600.0, rate: float = 4.0, seed: int = 0,
          readings=tuple(READINGS), placements=PLACEMENTS) -> pd.DataFrame:
    """Every reading x placement on Fig. 2's workload (fig2.toml: ShareGPT, OPT-13B, A100-40GB,
    12 GiB of KV, max_seq_len 2048, 4 req/s), measured over Fig. 2's window (the arrivals
    after the first ``WARMUP_FRAC``)."""
    base = dict(model="opt-13b", gpu="a100-40gb", kv_gib=12, max_seq_len=2048, seed=seed, max_len_policy="drop")
    trace = make_workload("sharegpt", rate, duration_s=duration_s, seed=seed)  # as experiments/run_spec.py builds it
    t0, t1 = WARMUP_FRAC * duration_s, duration_s
    return pd.DataFrame([run_reading(r, p, trace, base, t0, t1) for r in readings for p in placements])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--rate", type=float, default=4.0)
    args = ap.parse_args(argv)
    df = table(args.duration, args.rate)
    pd.set_option("display.width", 200)
    print(df.round(1).to_string(index=False))
    print("paper (Orca Pow2): token_states 26.8, reservation 17.9, internal_frag 13.6, external_frag_and_others 41.6")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
