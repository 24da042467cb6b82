"""The vLLM paper's chatbot workload (§6.5, Fig. 17): each request is a conversation's history
plus its last user query as one prompt, cut to the last 1,024 tokens, with at most 1,024
generated tokens (OPT-13B's 2,048-token context).

The paper synthesizes history and query from ShareGPT conversations. We have no conversation
texts, only token counts: the etalon ShareGPT length file (``shared/traces``, README there)
whose prompts carry the multi-turn history (mean 2,340, median 1,730 tokens; 64 % of them reach
1,024, matching the paper's "the input prompts for most requests have 1024 tokens") and whose
outputs are already at most 1,024. (prompt, output) pairs are resampled jointly with
replacement, arrivals are Poisson. The file is named by ``$PAGESIM_SHAREGPT_LENGTHS``, else
it is :data:`LENGTHS_NAME` in the ``traces`` folder of the shared data (:func:`shared_dir`). Its
contents are not part of a sweep's cache key: after replacing the file, run with ``--no-cache``.

``chatbot-short-output`` is the same with outputs capped at :data:`CHAT_TESTED_OUTPUT`: the
runs that test how much Fig. 17's ratios owe to these outputs' lengths, which the paper does not
give.

``chatbot-distserve`` is DistServe's (OSDI '24) chatbot workload as near as these lengths allow:
its artifact keeps the ShareGPT pairs under OPT's 2,048 positions and cuts nothing
(:func:`distserve_lengths`), where the vLLM paper cuts every prompt to its last 1,024 tokens.
What it does that no length file can: it joins the first k turns of a conversation into the
prompt (k drawn at random) and takes turn k as the output, a user's turn about as often as
ChatGPT's, so its outputs are shorter than the ChatGPT answers these pairs end with.
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

#: the ShareGPT length file's name in the shared data's ``traces`` folder
LENGTHS_NAME = "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
#: §6.5: "we cut the prompt to the last 1024 tokens and let the model generate at most 1024 tokens"
CHAT_MAX_PROMPT = 1024
CHAT_MAX_OUTPUT = 1024
#: the cap of ``chatbot-short-output``: Fig. 17's test of its own output lengths
#: (``experiments/figures/fig17.py``, ``output_runs``)
CHAT_TESTED_OUTPUT = 256
#: DistServe's artifact keeps a pair only when prompt + output stay under OPT's 2,048 positions
DISTSERVE_MAX_TOKENS = 2048


def shared_dir() -> Path:
    """The shared data (real traces, measurements): ``$PAGESIM_SHARED``, else the ``shared``
    folder beside the repository (``../shared`` from its root)."""
    return Path(os.environ.get("PAGESIM_SHARED") or Path(__file__).resolve().parents[2] / "shared")


def lengths_path() -> Path:
    """The ShareGPT length file: ``$PAGESIM_SHAREGPT_LENGTHS``, else :data:`LENGTHS_NAME` in the
    shared data's ``traces`` (:func:`shared_dir`); a ConfigError naming both when absent."""
    path = Path(os.environ.get("PAGESIM_SHAREGPT_LENGTHS") or shared_dir() / "traces" / LENGTHS_NAME)
    if not path.is_file():
        raise ConfigError(f"the chatbot workload needs ShareGPT request lengths: {path} not found (set "
                          f"PAGESIM_SHAREGPT_LENGTHS to {LENGTHS_NAME}, or PAGESIM_SHARED to its shared folder)")
    return path


def distserve_lengths(lengths: pd.DataFrame) -> pd.DataFrame:
    """The (prompt, output) pairs DistServe's artifact keeps of ShareGPT
    (github.com/LLMServe/DistServe, evaluation/2-benchmark-serving/0-prepare-dataset.py:49-54): a
    pair goes when both sides are under 4 tokens or when prompt + output reach 2,048 (OPT's
    positions); nothing is cut."""
    p, o = lengths["prompt_tokens"].to_numpy(), lengths["output_tokens"].to_numpy()
    keep = ~((p < 4) & (o < 4)) & (p + o < DISTSERVE_MAX_TOKENS)
    return lengths[keep].reset_index(drop=True)


#: the length rules by workload name: what each keeps of the length file before resampling
VARIANTS = {
    "chatbot": lambda lengths: keep_last_prompt_tokens(lengths, CHAT_MAX_PROMPT, CHAT_MAX_OUTPUT),
    "chatbot-short-output": lambda lengths: keep_last_prompt_tokens(lengths, CHAT_MAX_PROMPT, CHAT_TESTED_OUTPUT),
    "chatbot-distserve": distserve_lengths,
}


def chatbot_workload(rate: float, duration_s: float | None = None, num_requests: int | None = None,
                     seed: int = 0, lengths: pd.DataFrame | None = None,
                     variant: str = "chatbot") -> pd.DataFrame:
    """Poisson arrivals at ``rate``; (prompt, output) resampled from ``lengths`` (default: the
    ShareGPT length file) after the ``variant``'s rule (:data:`VARIANTS`): ``chatbot``, the vLLM
    paper's (prompts cut to their last :data:`CHAT_MAX_PROMPT` tokens, outputs capped at
    :data:`CHAT_MAX_OUTPUT`); ``chatbot-distserve``, DistServe's artifact's
    (:func:`distserve_lengths`)."""
    if lengths is None:
        lengths = load_trace(lengths_path())
    lengths = VARIANTS[variant](lengths)
    if lengths.empty:
        raise ConfigError(f"workload {variant!r}: no (prompt, output) pair of the length file is kept")
    r_arr, r_len = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    t = arrivals("poisson", rate, duration_s=duration_s, num_requests=num_requests, rng=r_arr)
    i = r_len.integers(0, len(lengths), t.size)
    df = pd.DataFrame({"request_id": ids_for(t.size), "arrival_s": t,
                       "prompt_tokens": lengths["prompt_tokens"].to_numpy()[i].astype(np.int64),
                       "output_tokens": lengths["output_tokens"].to_numpy()[i].astype(np.int64),
                       "n": np.ones(t.size, dtype=np.int64), "beam_width": np.ones(t.size, dtype=np.int64)})
    df.attrs = {"source": f"builtin:{variant}", "workload": dict(kind="synthetic", workload=variant, rate=rate,
                                                              duration_s=duration_s, num_requests=num_requests,
                                                              seed=seed)}
    return df
