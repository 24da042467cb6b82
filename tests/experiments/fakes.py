"""A cheap stand-in for the engine: deterministic, plausible SimResult-shaped outputs.

``fake_run(spec)`` returns a RunOutput with a summary (the keys of summary.json), a step table
whose memory columns sum to the capacity, and a request table. Numbers are chosen so the figure
functions' arithmetic can be checked by hand:

* memory: outside the steady window (t < 10% of the trace) everything is free; inside it the
  fractions are ``MEM_FRACTIONS[system]`` exactly.
* batch size: ``BATCH[system]`` in every step inside the window (0 outside).
* normalized latency: ``0.05`` s/token up to ``CAPACITY[workload][system]`` req/s, then
  ``0.05 + (rate - cap) / cap``.
* swap preemption: latency times ``1 + 4 / block_size`` (recompute: as above).
* sharing: ``avg_allocated_blocks`` = 100 * width unshared, 100 * (1 + 0.1 (width - 1)) shared.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagesim.experiments.run_cache import RunOutput
from pagesim.experiments.run_spec import RunSpec

CAP_TOKENS = 15728
MEM_FRACTIONS = {  # token_states, reservation, internal_frag, allocator_slack, external_frag, free_idle
    "orca-max": (0.20, 0.13, 0.57, 0.02, 0.05, 0.03),
    "orca-pow2": (0.27, 0.18, 0.14, 0.01, 0.20, 0.20),
    "orca-oracle": (0.38, 0.25, 0.00, 0.00, 0.30, 0.07),
    "vllm": (0.90, 0.00, 0.02, 0.00, 0.00, 0.08),
}
BATCH = {"orca-max": 7.0, "orca-pow2": 10.0, "orca-oracle": 14.0, "vllm": 33.0}
CAPACITY = {"sharegpt": {"orca-max": 0.3, "orca-pow2": 0.5, "orca-oracle": 0.8, "vllm": 1.8},
            "alpaca": {"orca-max": 4.0, "orca-pow2": 10.0, "orca-oracle": 15.0, "vllm": 30.0}}
CALLS: list[str] = []  # labels of runs made in this process


def _duration(spec: RunSpec) -> float:
    return spec.duration_s if spec.duration_s is not None else spec.num_requests / spec.rate


def fake_steps(spec: RunSpec, num: int = 200) -> pd.DataFrame:
    dt = _duration(spec) / 100  # 200 steps over 2x the arrival window; steps 10.. are steady
    start = np.arange(num) * dt
    steady = np.arange(num) >= 10
    fr = MEM_FRACTIONS.get(spec.system, MEM_FRACTIONS["vllm"])
    cols = {}
    names = ("mem_token_states", "mem_reservation", "mem_internal_frag", "mem_allocator_slack",
             "mem_external_frag", "mem_free_idle")
    for i, c in enumerate(names):
        inside = fr[i] * CAP_TOKENS
        outside = CAP_TOKENS if c == "mem_free_idle" else 0.0
        cols[c] = np.where(steady, inside, outside)
    batch = np.where(steady, BATCH.get(spec.system, 20.0), 0.0)
    return pd.DataFrame({"step": np.arange(num), "start_s": start, "dt_s": np.full(num, dt), "batch_size": batch,
                         "num_prefill_tokens": 0, "num_decode_tokens": batch, "num_waiting": np.where(steady, 3, 0),
                         "num_running": batch, **cols})


def fake_requests(spec: RunSpec, num: int = 50) -> pd.DataFrame:
    rng = np.random.default_rng(spec.seed)
    arr = np.sort(rng.uniform(0, _duration(spec), num))
    ttft = rng.gamma(2.0, 0.1, num)
    tpot = rng.gamma(5.0, 0.01, num)
    out = rng.integers(10, 500, num)
    e2el = ttft + tpot * out
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(num)], "arrival_s": arr,
                         "prompt_tokens": rng.integers(10, 500, num), "output_tokens": out, "n": spec.n,
                         "beam_width": spec.beam_width, "status": "finished", "reject_reason": "",
                         "first_token_s": arr + ttft, "finish_s": arr + e2el, "ttft_s": ttft, "tpot_s": tpot,
                         "e2el_s": e2el, "normalized_latency_s": e2el / out, "preemptions": 0})


def fake_summary(spec: RunSpec) -> dict:
    cap = CAPACITY.get(spec.workload, CAPACITY["sharegpt"]).get(spec.system, 1.0)
    lat = 0.05 if spec.rate <= cap else 0.05 + (spec.rate - cap) / cap
    bs = spec.sim.get("block_size", 16)
    lat *= 1 + abs(np.log2(bs / 32)) / 20  # fig18b: best at 32
    if spec.sim.get("preemption") == "swap":
        lat *= 1 + 4 / bs  # fig19: swap dearer than recompute by 4 / block size
    width = max(spec.n, spec.beam_width)
    blocks = 100.0 * width if spec.unshare else 100.0 * (1 + 0.1 * (width - 1))
    fr = MEM_FRACTIONS.get(spec.system, MEM_FRACTIONS["vllm"])
    names = ("token_states", "reservation", "internal_frag", "allocator_slack", "external_frag", "free_idle")
    s = {"completed": int(spec.rate * _duration(spec)), "rejected": 0, "duration_s": _duration(spec) * 1.2,
         # every rate served in full; an unshared run's sequences are each a request (fig14's capacity)
         "request_throughput": spec.rate * (width if spec.unshare else 1), "output_throughput": spec.rate * 200,
         "total_token_throughput": spec.rate * 400,
         "mean_ttft_ms": 100.0, "median_ttft_ms": 90.0, "p99_ttft_ms": 400.0,
         "mean_tpot_ms": 30.0, "median_tpot_ms": 28.0, "p99_tpot_ms": 60.0,
         "mean_itl_ms": 30.0, "median_itl_ms": 28.0, "p99_itl_ms": 70.0,
         "mean_e2el_ms": 1000 * lat * 200, "median_e2el_ms": 900 * lat * 200, "p99_e2el_ms": 3000 * lat * 200,
         "normalized_latency_s_per_token": float(lat), "avg_batch_size": BATCH.get(spec.system, 20.0) * 0.9,
         "num_preemptions": 0, **{f"mem_{k}": fr[i] * 0.9 + (0.1 if k == "free_idle" else 0.0) for i, k in enumerate(names)},
         "kv_capacity_tokens": CAP_TOKENS, "wall_time_s": float(np.random.default_rng().uniform(0.1, 1.0)),
         "system": spec.system, "avg_allocated_blocks": blocks}
    return s


def fake_run(spec: RunSpec) -> RunOutput:
    CALLS.append(spec.label())
    return RunOutput(summary=fake_summary(spec), steps=fake_steps(spec), requests=fake_requests(spec))


def fake_summary_only(spec: RunSpec) -> dict:
    return fake_summary(spec)
