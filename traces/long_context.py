"""A long-context workload built in (no trace file needed): request lengths shaped like the
Mooncake conversation trace (Kimi's online chat, Qin et al., FAST '25; the one-hour sample
``FAST25-release/traces/conversation_trace.jsonl`` of github.com/kvcache-ai/Mooncake), whose
prompts carry long documents and histories.

That trace's 12,031 requests (statistics computed from the file with pandas, 2026-11-25):
prompts mean 12,035 and median 6,909 tokens, 66 % past 4,096 and 45 % past 8,192, max 126,195;
outputs mean 343, quartiles 156 / 350 / 472, p90 597. We draw

* prompts from a lognormal of mean 12,035 and sigma 1.05, whose median is then
  ``12,035 x exp(-1.05^2 / 2)`` = 6,935 (the trace's 6,909; its log-std is 1.20, widened by
  a few hundred prompts under 1,000 tokens that a lognormal of this median does not make);
* outputs uniform on 1..686 (mean 343.5, quartiles 172 / 343 / 515, p90 617);

independently, with Poisson arrivals (the trace's timestamps are quantized to ~3 s). A model
whose context is shorter than a prompt needs a ``max_len_policy`` (``clip-prompt`` keeps the
prompt's end, as a chat client cuts old history).
"""

from __future__ import annotations

import pandas as pd

from pagesim.sim.errors import ConfigError
from pagesim.traces import synth

#: the workload names experiments use (``workload = "long-context"`` in a figure's TOML)
WORKLOADS = ("long-context",)
#: prompt and output lengths, as the module docstring derives them
PROMPT_DIST = "lognormal:mean=12035,sigma=1.05"
OUTPUT_DIST = "uniform:low=1,high=686"


def make_workload(name: str, rate: float, duration_s: float | None = None, num_requests: int | None = None,
                  seed: int = 0, n: int = 1, beam_width: int = 1) -> pd.DataFrame:
    """The workload ``name`` of :data:`WORKLOADS`, Poisson arrivals at ``rate`` (the sweep's run
    function calls it as it calls ``traces.synth.make_workload`` for the others)."""
    if name not in WORKLOADS:
        raise ConfigError(f"unknown long-context workload '{name}'; valid: {', '.join(WORKLOADS)}")
    df = synth.make_workload("custom", rate, duration_s=duration_s, num_requests=num_requests, seed=seed, n=n,
                             beam_width=beam_width, prompt_dist=PROMPT_DIST, output_dist=OUTPUT_DIST)
    df.attrs = {"source": f"builtin:{name}", "workload": {**df.attrs["workload"], "workload": name}}
    return df
