"""A ShareGPT benchmark rebuilt from what it published: its prompts sent at once, their token counts.

``sglang.bench_serving`` and vLLM's ``benchmark_serving.py`` (``--dataset-name sharegpt``, 2024)
take each ShareGPT conversation's first prompt and first answer, keep them under the vLLM paper's
benchmark filter (the one the built-in ``sharegpt`` workload states, ``traces/synth.py``),
generate the answer's length (``ignore_eos``), and under ``--request-rate inf`` send every
prompt at once (``sample_sharegpt_requests``). A published result keeps the sample's totals, not
its lengths: the lengths here are the built-in workload's shape (the same filter, the same
log-space spreads) with the sample's own mean prompt and answer (its total input and output
tokens over its prompts), which the shape must be able to reach. A run's ``workload`` section
states them (:data:`FORMAT` runs of a fact table) and its ``measured overall`` section the
request throughput.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagesim.sim.errors import TraceError
from pagesim.traces.synth import PAPER_WORKLOADS, PaperWorkload, fit_lengths, paper_lengths

#: a fact table's format for such runs (``traces.real_runs``)
FORMAT = "sharegpt-offline"
#: the workload keys a run must state
KEYS = ("num_prompts", "prompt_tokens_mean", "output_tokens_mean")
#: how far the drawn shape's mean may sit from the stated one (the filter bounds what it can reach)
MEAN_TOLERANCE = 0.01


def _number(run, key: str, whole: bool = False) -> float:
    """``run``'s workload ``key`` as a positive number (a whole one with ``whole``), or one line."""
    field = f"{run.name}: workload.{key}"
    if key not in run.workload:
        raise TraceError("missing (a ShareGPT sample states its prompts and their mean tokens)",
                         path=run.source, field=field)
    value = run.workload[key]
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"expected a number, got {value!r}", path=run.source, field=field) from None
    if not number > 0 or (whole and number != int(number)):
        raise TraceError(f"must be a {'whole number ' if whole else 'number '}> 0, got {value!r}",
                         path=run.source, field=field)
    return number


def sample_workload(run) -> PaperWorkload:
    """The lengths' distribution: ShareGPT's shape (:data:`traces.synth.PAPER_WORKLOADS`) at the
    run's means; a mean the shape cannot reach under the filter is refused."""
    shape = PAPER_WORKLOADS["sharegpt"]
    prompt, output = _number(run, "prompt_tokens_mean"), _number(run, "output_tokens_mean")
    workload = PaperWorkload(f"{run.name} sample", prompt, output, prompt_sigma=shape.prompt_sigma,
                             output_sigma=shape.output_sigma)
    fit = fit_lengths(workload)
    for key, stated, drawn in (("prompt_tokens_mean", prompt, fit["prompt_mean"]),
                               ("output_tokens_mean", output, fit["output_mean"])):
        if abs(drawn / stated - 1) > MEAN_TOLERANCE:
            raise TraceError(f"{stated:g} tokens cannot be the mean of ShareGPT's shape under the benchmark's "
                             f"filter (it reaches {drawn:.1f})", path=run.source, field=f"{run.name}: workload.{key}")
    return workload


def sharegpt_sample_trace(run, seed: int) -> pd.DataFrame:
    """The run's prompts, every one sent at 0, with lengths drawn by :func:`sample_workload`."""
    count = int(_number(run, "num_prompts", whole=True))
    workload = sample_workload(run)
    if "requests_per_s" not in run.measured.get("overall", {}):
        raise TraceError("missing (the request throughput it is compared on)", path=run.source,
                         field=f"{run.name}: measured overall.requests_per_s")
    r_prompt, r_output = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    prompt, output = paper_lengths(workload, count, r_prompt, r_output)
    return pd.DataFrame({"request_id": [f"{run.name}-{i}" for i in range(count)], "arrival_s": np.zeros(count),
                         "prompt_tokens": prompt, "output_tokens": output, "stage": 0})
