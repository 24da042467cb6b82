"""The requests an inference-perf run sent, rebuilt from its config (``traces.real_runs``): its
load stages and its ``shared_prefix`` data generator, as inference-perf's own code sends them
(kubernetes-sigs/inference-perf at e60b98d, the last commit before the public inference-sim
training runs of 2026-02-17):

- **Stages** run one after another: stage ``s`` sends ``int(rate * duration)`` requests
  (``loadgen/load_generator.py:329``), then the client waits until every one has finished
  (``:356``), sleeps ``load.interval`` (``:555``), and the next stage's clock starts 1 s after it
  is set up (``:325``). The server is idle between stages, so how long the gap lasts changes no
  request's latency; :func:`stage_starts` places each stage after the previous one's last
  finish as the client would, once a replay knows it.
- **Arrivals** (``loadgen/load_timer.py``): ``constant`` draws ``n`` exponential gaps of mean
  ``1/rate`` and scales them to sum to the stage's duration (``ConstantLoadTimer``, ``:45-62``);
  ``poisson`` draws a Poisson count for each second and spreads it over that second the same way
  (``PoissonLoadTimer``, ``:78-95``).
- **Prompts** (``datagen/shared_prefix_datagen.py``): ``num_groups`` random system prompts of
  ``system_prompt_len`` tokens, each followed by ``num_prompts_per_group`` random questions of
  ``question_len`` tokens (``:141-170``); the prompts are shuffled once (``:184-187``) and request
  ``j`` of every stage sends prompt ``j mod (groups x prompts)`` with ``max_tokens = output_len``
  (``:97-111``; each stage starts its own data generator, ``load_generator.py:335``). So every
  prompt repeats, and prefix caching finds the whole prompt of a repeat, not just its group's
  system prompt.

What the config does not give, and what we take instead:

- **Token counts.** The generator decodes random token ids to text and the server tokenizes
  the text again, which yields more tokens than were drawn (Llama-2-7B general: 559-592 tokens
  for 100 + 447 drawn). We give the prompts the lengths the client counted (the run's
  ``prompt_len`` quantiles, one prompt at each of ``groups x prompts`` evenly spaced quantiles,
  interpolated) and scale the system prompt by the same ratio (plus the BOS token, shared too).
- **Outputs.** With ``ignore_eos`` the server generates exactly ``max_tokens``; the client's
  ``output_len`` is a recount of the streamed text and runs lower (mean 209 for 248 generated),
  so it is not used. Without ``ignore_eos`` the outputs take the client's ``output_len``
  quantiles the same way as the prompts.
- **The shuffle and the gaps** are unseeded in inference-perf; here they come from ``seed``.

Prefix hashes name full blocks of :data:`HASH_BLOCK_TOKENS` tokens (vLLM's default block
size): blocks inside a group's system prompt carry the group's ids, the rest the prompt's own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagesim.sim.errors import ConfigError
from pagesim.traces.real_runs import LENGTH_QUANTILES, RealRun

#: tokens per prefix hash: vLLM's default block size (vllm/config/cache.py: block_size 16 on CUDA)
HASH_BLOCK_TOKENS = 16
#: the client's clock starts 1 s after a stage is set up (load_generator.py:325)
STAGE_START_DELAY_S = 1.0
#: hash ids: a group's system-prompt block k is GROUP_IDS + g * BLOCK_IDS + k, a prompt's own
#: block PROMPT_IDS + p * BLOCK_IDS + k (distinct for any prompt under BLOCK_IDS blocks)
BLOCK_IDS = 1 << 20
GROUP_IDS, PROMPT_IDS = 1, 1 << 40


def quantile_lengths(run: RealRun, length: str, count: int) -> np.ndarray:
    """``count`` lengths at evenly spaced quantiles ((i + 0.5) / count) of the run's ``length``
    (``prompt_len`` or ``output_len``) quantiles, interpolated linearly, at least 1."""
    points = sorted((q, run.workload[f"{length}.{name}"]) for name, q in LENGTH_QUANTILES.items()
                    if f"{length}.{name}" in run.workload)
    if not points:
        raise ConfigError(f"{run.source}: the run states no {length} quantiles to rebuild its lengths from")
    qs, values = np.array([p[0] for p in points]), np.array([p[1] for p in points], dtype=np.float64)
    if len(qs) == 1:
        return np.full(count, max(1, round(values[0])), dtype=np.int64)
    wanted = (np.arange(count) + 0.5) / count
    return np.maximum(np.rint(np.interp(wanted, qs, values)), 1).astype(np.int64)


def stage_arrivals(load_type: str, rate: float, duration: float, rng: np.random.Generator) -> np.ndarray:
    """One stage's send times from its clock's start (see the module docstring)."""
    n = int(rate * duration)
    if n == 0:
        return np.zeros(0)
    if load_type == "constant":
        gaps = rng.exponential(1.0 / rate, n)
        return np.cumsum(gaps * (duration / gaps.sum()))
    times, second = [], 0.0
    while len(times) < n:
        k = int(rng.poisson(rate))
        if k:
            gaps = rng.exponential(1.0 / k, k)
            times.extend(second + np.cumsum(gaps * (1.0 / gaps.sum())))
        second += 1.0
    return np.asarray(times[:n])


def inference_perf_trace(run: RealRun, seed: int = 0, starts: list[float] | None = None) -> pd.DataFrame:
    """The requests ``run`` sent (canonical trace columns, ``prefix_hashes`` and ``stage``;
    ``attrs['stage_starts']``: each stage's clock start).
    ``starts``: each stage's clock start in seconds; None places stage ``s + 1`` a long idle gap
    after stage ``s``'s last send (any gap longer than the drain gives the same latencies;
    :func:`stage_starts` gives the client's own)."""
    w = run.workload
    groups, per_group = int(w["shared_prefix.num_groups"]), int(w["shared_prefix.num_prompts_per_group"])
    system, question = int(w["shared_prefix.system_prompt_len"]), int(w["shared_prefix.question_len"])
    num_prompts = groups * per_group
    rng = np.random.default_rng(seed)
    lengths = quantile_lengths(run, "prompt_len", num_prompts)
    outputs = (np.full(num_prompts, int(w["shared_prefix.output_len"]), dtype=np.int64) if w.get("ignore_eos")
               else quantile_lengths(run, "output_len", num_prompts))
    # the counted tokens per drawn token, applied to the system prompt; the BOS token is shared too
    ratio = (float(np.median(lengths)) - 1.0) / max(system + question, 1)
    shared = 1 + int(round(system * ratio)) if system else 0
    order = rng.permutation(num_prompts)  # the generator's shuffle: position p holds prompt order[p]
    group = order // per_group
    outputs = outputs[order]
    lengths = lengths[rng.permutation(num_prompts)]  # which prompt re-tokenizes longer: random
    hashes = []
    for p in range(num_prompts):
        full = int(lengths[p]) // HASH_BLOCK_TOKENS
        in_system = min(full, min(shared, int(lengths[p])) // HASH_BLOCK_TOKENS)
        hashes.append(tuple(GROUP_IDS + int(group[p]) * BLOCK_IDS + k for k in range(in_system))
                      + tuple(PROMPT_IDS + p * BLOCK_IDS + k for k in range(in_system, full)))
    frames, clock, used = [], STAGE_START_DELAY_S, []
    for s in range(run.num_stages):
        rate, duration = float(w[f"stage.{s}.rate"]), float(w[f"stage.{s}.duration"])
        start = starts[s] if starts is not None else clock
        used.append(start)
        arrivals = start + stage_arrivals(str(w.get("load.type", "constant")), rate, duration, rng)
        prompt = np.arange(len(arrivals)) % num_prompts
        frames.append(pd.DataFrame({
            "request_id": [f"s{s}-{j}" for j in range(len(arrivals))], "arrival_s": arrivals,
            "prompt_tokens": lengths[prompt], "output_tokens": outputs[prompt],
            "prefix_hashes": [hashes[p] for p in prompt], "stage": s}))
        clock = start + duration * 10 + 1e4  # an idle gap no stage's drain reaches
    df = pd.concat(frames, ignore_index=True)
    df.attrs = {"hash_block_tokens": HASH_BLOCK_TOKENS, "source": run.source,
                "shared_prefix_tokens": shared, "stage_starts": used}
    return df


def stage_starts(run: RealRun, last_finish: list[float], first_start: list[float]) -> list[float]:
    """Each stage's clock start as the client would set it, given each stage's last finish and its
    clock start in a replay: stage ``s + 1`` starts ``load.interval`` + 1 s after stage ``s``'s
    last request finished."""
    starts = [STAGE_START_DELAY_S]
    for s in range(1, run.num_stages):
        drained = starts[s - 1] + (last_finish[s - 1] - first_start[s - 1])
        starts.append(drained + float(run.workload.get("load.interval", 0.0)) + STAGE_START_DELAY_S)
    return starts
