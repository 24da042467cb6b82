"""The vLLM paper's chatbot workload (§6.5, Fig. 17): each request is a conversation's history
plus its last user query as one prompt, cut to the last 1,024 tokens, with at most 1,024
generated tokens (OPT-13B's 2,048-token context).

The paper synthesizes history and query from ShareGPT conversations. We have no conversation
texts, only token counts: the etalon ShareGPT length file (``shared/traces``, README there)
whose prompts carry the multi-turn history (mean 2,340, median 1,730 tokens; 64 % of them reach
1,024, matching the paper's "the input prompts for most requests have 1024 tokens") and whose
outputs are already at most 1,024. (prompt, output) pairs are resampled jointly with
replacement, arrivals are Poisson. The file is named by ``$PAGESIM_SHAREGPT_LENGTHS``
(default: :data:`DEFAULT_LENGTHS`). Its contents are not part of a sweep's cache key: after
replacing the file, run with ``--no-cache``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from pagesim.sim.errors import ConfigError
from pagesim.traces.arrivals import arrivals
from pagesim.traces.loaders import load_trace
from pagesim.traces.schema import ids_for
from pagesim.traces.transform import keep_last_prompt_tokens

#: the ShareGPT length file used when ``$PAGESIM_SHAREGPT_LENGTHS`` is not set
DEFAULT_LENGTHS = "/work/shared/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
#: §6.5: "we cut the prompt to the last 1024 tokens and let the model generate at most 1024 tokens"
CHAT_MAX_PROMPT = 1024
CHAT_MAX_OUTPUT = 1024


def lengths_path() -> Path:
    path = Path(os.environ.get("PAGESIM_SHAREGPT_LENGTHS") or DEFAULT_LENGTHS)
    if not path.is_file():
        raise ConfigError(f"the chatbot workload needs ShareGPT request lengths: {path} not found "
                          "(set PAGESIM_SHAREGPT_LENGTHS to sharegpt_8k_filtered_stats_llama2_tokenizer.csv)")
    return path


def chatbot_workload(rate: float, duration_s: float | None = None, num_requests: int | None = None,
                     seed: int = 0, lengths: pd.DataFrame | None = None) -> pd.DataFrame:
    """Poisson arrivals at ``rate``; (prompt, output) resampled from ``lengths`` (default: the
    ShareGPT length file), prompts cut to their last :data:`CHAT_MAX_PROMPT` tokens and outputs
    capped at :data:`CHAT_MAX_OUTPUT`."""
    if lengths is None:
        lengths = load_trace(lengths_path())
    r_arr, r_len = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    t = arrivals("poisson", rate, duration_s=duration_s, num_requests=num_requests, rng=r_arr)
    i = r_len.integers(0, len(lengths), t.size)
    df = pd.DataFrame({"request_id": ids_for(t.size), "arrival_s": t,
                       "prompt_tokens": lengths["prompt_tokens"].to_numpy()[i].astype(np.int64),
                       "output_tokens": lengths["output_tokens"].to_numpy()[i].astype(np.int64),
                       "n": np.ones(t.size, dtype=np.int64), "beam_width": np.ones(t.size, dtype=np.int64)})
    df.attrs = {"source": "builtin:chatbot", "workload": dict(kind="synthetic", workload="chatbot", rate=rate,
                                                              duration_s=duration_s, num_requests=num_requests,
                                                              seed=seed)}
    return keep_last_prompt_tokens(df, CHAT_MAX_PROMPT, CHAT_MAX_OUTPUT)
