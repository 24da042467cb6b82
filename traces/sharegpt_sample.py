"""A ShareGPT benchmark rebuilt from what it published: its prompts sent at once, their token counts.

``sglang.bench_serving`` and vLLM's ``benchmark_serving.py`` (``--dataset-name sharegpt``, 2024)
take each ShareGPT conversation's first prompt and first answer, keep those of 4 to 1,024 prompt
tokens and at most 2,048 with the answer, generate the answer's length (``ignore_eos``), and
under ``--request-rate inf`` send every prompt at once (``sample_sharegpt_requests``; the
vLLM paper's benchmark filter, which the built-in ``sharegpt`` workload states). A published
result keeps the sample's totals, not its lengths: the lengths here are the built-in workload's
shape (``traces/synth.py``: the same filter, the same log-space spreads) with the sample's own
mean prompt and answer (its total input and output tokens over its prompts). A run's
``workload`` section states them (:data:`FORMAT` runs of a fact table).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagesim.sim.errors import TraceError
from pagesim.traces.synth import PAPER_WORKLOADS, PaperWorkload, paper_lengths

#: a fact table's format for such runs (``traces.real_runs``)
FORMAT = "sharegpt-offline"
#: the workload keys a run must state
KEYS = ("num_prompts", "prompt_tokens_mean", "output_tokens_mean")


def sample_workload(run) -> PaperWorkload:
    """The lengths' distribution: ShareGPT's shape (:data:`traces.synth.PAPER_WORKLOADS`) at the
    run's means."""
    for key in KEYS:
        if key not in run.workload:
            raise TraceError("missing (a ShareGPT sample states its prompts and their mean tokens)",
                             path=run.source, field=f"{run.name}: workload.{key}")
    shape = PAPER_WORKLOADS["sharegpt"]
    return PaperWorkload(f"{run.name} sample", float(run.workload["prompt_tokens_mean"]),
                         float(run.workload["output_tokens_mean"]), prompt_sigma=shape.prompt_sigma,
                         output_sigma=shape.output_sigma)


def sharegpt_sample_trace(run, seed: int) -> pd.DataFrame:
    """The run's prompts, every one sent at 0, with lengths drawn by :func:`sample_workload`."""
    count = int(run.workload["num_prompts"]) if "num_prompts" in run.workload else 0
    workload = sample_workload(run)
    if count < 1:
        raise TraceError(f"must be >= 1, got {count}", path=run.source, field=f"{run.name}: workload.num_prompts")
    r_prompt, r_output = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    prompt, output = paper_lengths(workload, count, r_prompt, r_output)
    return pd.DataFrame({"request_id": [f"{run.name}-{i}" for i in range(count)], "arrival_s": np.zeros(count),
                         "prompt_tokens": prompt, "output_tokens": output, "stage": 0})
