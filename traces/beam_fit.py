"""The simulator's beam model (``sim/core/sched/beam.py``: after each decode step a beam dies with
probability p and a fork of a random survivor replaces it) next to a real beam search's record
(``traces/beam_search.py``): the block saving the core measures at a churn p on requests of the
record's lengths, and the p at which it equals the record's.

Each request runs alone (arrivals far apart), on Fig. 15's configuration (OPT-13B, A100-40GB,
12 GiB of KV, vLLM with 16-token blocks), so the saving is the beam family's own:
``blocks_shared_saving``, 1 - physical / logical blocks, time-weighted, as Fig. 15 reads it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from pagesim.sim.config import SimConfig
from pagesim.sim.core.events import replay
from pagesim.sim.core.sched import beam
from pagesim.sim.run import prepare, result

#: Fig. 15's configuration (experiments/configs/fig15.toml's [base])
FIG15_CONFIG = dict(model="opt-13b", gpu="a100-40gb", kv_gib=12, max_seq_len=2048, system="vllm", seed=0)
#: seconds between arrivals: longer than any request here runs, so each runs alone
SPACING_S = 1000.0


def lengths_trace(lengths: Sequence[tuple[int, int]], width: int) -> pd.DataFrame:
    """One request per (prompt, output) pair, ``width`` beams each, far apart."""
    prompt, output = (np.array(x, dtype=np.int64) for x in zip(*lengths))
    return pd.DataFrame({"request_id": [str(i) for i in range(prompt.size)],
                         "arrival_s": np.arange(prompt.size) * SPACING_S,
                         "prompt_tokens": prompt, "output_tokens": output,
                         "n": np.ones(prompt.size, np.int64), "beam_width": np.full(prompt.size, width, np.int64)})


def core_saving(lengths: Sequence[tuple[int, int]], width: int, churn: float, seed: int = 0) -> float:
    """The core's ``blocks_shared_saving`` on these requests at beam width ``width`` with the
    beam model's churn probability set to ``churn`` (the run's own: ``beam.set_churn``)."""

    cfg = SimConfig(**{**FIG15_CONFIG, "seed": seed})
    run = prepare(cfg, lengths_trace(lengths, width))
    beam.set_churn(run.state, churn)
    s, wall = replay.run(run.state)
    return float(result(cfg, run._replace(state=s), wall).summary["blocks_shared_saving"])


def churn_for_saving(lengths: Sequence[tuple[int, int]], width: int, saving: float, seed: int = 0,
                     iterations: int = 12) -> float:
    """The churn p in [0, 1] at which the core's saving on these requests is ``saving``
    (bisection: the saving grows with p, up to the draws' noise)."""
    lo, hi = 0.0, 1.0
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if core_saving(lengths, width, mid, seed) < saving else (lo, mid)
    return (lo + hi) / 2


def best_churn(lengths: Sequence[tuple[int, int]], widths: Sequence[int], savings: Sequence[float], seed: int = 0,
               grid: Sequence[float] = tuple(np.round(np.arange(0.02, 0.52, 0.02), 2))) -> tuple[float, float]:
    """The one churn p of ``grid`` whose core savings at ``widths`` are nearest ``savings``
    (least squares), and its RMS error (a fraction)."""
    errors = [float(np.sqrt(np.mean([(core_saving(lengths, w, p, seed) - s) ** 2 for w, s in zip(widths, savings)])))
              for p in grid]
    best = int(np.argmin(errors))
    return float(grid[best]), errors[best]
