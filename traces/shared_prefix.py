"""A workload whose every prompt starts with one fixed prefix (few-shot examples, a system
prompt): the vLLM paper's §6.4 (Fig. 16), LLaMA-13B translating WMT16 English to German with
a 1-shot prefix of 80 tokens or a 5-shot prefix of 341 tokens.

Each request's prompt is ``prefix_tokens`` followed by its own sentence; ``prefix_hashes``
names the prefix's full hash blocks of ``hash_block_tokens`` tokens with the same ids in every
request (``1 .. prefix_tokens // hash_block_tokens``), so prefix caching shares them, and names
none of the rest (the block holding the prefix's tail and the sentence's start differs per
request, and the sentence is the request's own). Nothing is downloaded: lengths come from
stated statistics.

WMT16 En-De sentence lengths (the paper gives none): the test split (newstest2016) holds 2,999
sentence pairs in 735,508 bytes (the Hugging Face dataset card of ``wmt/wmt16``, config
``de-en``), 245 bytes a pair; at about 4 bytes per LLaMA token for English and German text
that is ~61 tokens a pair, which we split as 29 English (the prompt's sentence) and 32 German
(the output, German running ~10 % longer), each lognormal with sigma 0.5. These are derived
estimates, not measured token counts; the figure's ratios depend mostly on the prefix, which
dominates every prompt (80 or 341 tokens against ~29).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagesim.sim.errors import ConfigError
from pagesim.traces import synth

#: the paper's §6.4 prefixes, tokens per number of shots
FEW_SHOT_PREFIX_TOKENS = {1: 80, 5: 341}
#: the sentences' length scale of the ``-long`` workloads: Fig. 16's test of its derived lengths
#: (``experiments/figures/fig16.py``, ``length_runs``)
TESTED_LENGTH_SCALE = 2.0
#: the workload names experiments use (``workload = "wmt16-5shot"`` in a figure's TOML): shots, and
#: the sentences' lengths as a multiple of the derived ones
WORKLOADS = {"wmt16-1shot": (1, 1.0), "wmt16-5shot": (5, 1.0),
             "wmt16-1shot-long": (1, TESTED_LENGTH_SCALE), "wmt16-5shot-long": (5, TESTED_LENGTH_SCALE)}
#: WMT16 En-De, derived as the module docstring states: mean tokens of a source and a target sentence
WMT16_SOURCE_TOKENS = 29
WMT16_TARGET_TOKENS = 32


def with_shared_prefix(df: pd.DataFrame, prefix_tokens: int, hash_block_tokens: int = 16) -> pd.DataFrame:
    """``df`` with ``prefix_tokens`` prepended to every prompt and the prefix's full hash blocks
    named alike in every row (``prefix_hashes``; ``attrs['hash_block_tokens']``)."""
    if int(prefix_tokens) != prefix_tokens or prefix_tokens < 0:
        raise ConfigError(f"prefix_tokens must be an integer >= 0, got {prefix_tokens}")
    if int(hash_block_tokens) != hash_block_tokens or hash_block_tokens < 1:
        raise ConfigError(f"hash_block_tokens must be an integer >= 1, got {hash_block_tokens}")
    out = df.copy()
    out["prompt_tokens"] = out["prompt_tokens"].to_numpy(np.int64) + int(prefix_tokens)
    shared = tuple(range(1, int(prefix_tokens) // int(hash_block_tokens) + 1))
    out["prefix_hashes"] = [shared] * len(out)
    out.attrs = {**df.attrs, "hash_block_tokens": int(hash_block_tokens), "shared_prefix_tokens": int(prefix_tokens)}
    return out


def translation_workload(shots: int, rate: float, duration_s: float | None = None, num_requests: int | None = None,
                         seed: int = 0, hash_block_tokens: int = 16, length_scale: float = 1.0) -> pd.DataFrame:
    """WMT16 En->De requests behind the paper's ``shots``-shot prefix (1: 80 tokens, 5: 341),
    Poisson arrivals at ``rate``; sentences of the derived lengths times ``length_scale``
    (lognormal, sigma 0.5)."""
    if shots not in FEW_SHOT_PREFIX_TOKENS:
        raise ConfigError(f"shots must be one of {', '.join(map(str, FEW_SHOT_PREFIX_TOKENS))} (the paper's "
                          f"prefixes), got {shots}")
    df = synth.make_workload("custom", rate, duration_s=duration_s, num_requests=num_requests, seed=seed,
                       prompt_dist=f"lognormal:mean={WMT16_SOURCE_TOKENS * length_scale:g},sigma=0.5",
                       output_dist=f"lognormal:mean={WMT16_TARGET_TOKENS * length_scale:g},sigma=0.5")
    return with_shared_prefix(df, FEW_SHOT_PREFIX_TOKENS[shots], hash_block_tokens)


def make_workload(name: str, rate: float, duration_s: float | None = None, num_requests: int | None = None,
                  seed: int = 0, n: int = 1, beam_width: int = 1) -> pd.DataFrame:
    """The workload ``name`` of :data:`WORKLOADS` (the sweep's run function calls it as it calls
    ``traces.synth.make_workload`` for the others); one sequence per request."""
    if name not in WORKLOADS:
        raise ConfigError(f"unknown shared-prefix workload '{name}'; valid: {', '.join(WORKLOADS)}")
    if n != 1 or beam_width != 1:
        raise ConfigError(f"{name}: one sequence per request (n = beam_width = 1), got n={n}, beam_width={beam_width}")
    shots, length_scale = WORKLOADS[name]
    return translation_workload(shots, rate, duration_s=duration_s, num_requests=num_requests, seed=seed,
                                length_scale=length_scale)
