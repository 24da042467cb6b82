"""The shared-prefix workload (traces/shared_prefix.py), worked by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from pagesim.sim.config import SimConfig
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import run_simulation
from pagesim.traces.shared_prefix import translation_workload, with_shared_prefix


def two_requests(gap_s: float = 10.0) -> pd.DataFrame:
    return pd.DataFrame({"request_id": ["a", "b"], "arrival_s": [0.0, gap_s], "prompt_tokens": [10, 20],
                         "output_tokens": [2, 3]})


def test_prefix_prepended_and_its_full_blocks_named_alike():
    # 80 tokens = 5 full 16-token blocks; 341 = 21 full blocks (336 tokens) and 5 more, whose
    # block also holds the request's own sentence, so it is not named
    df = with_shared_prefix(two_requests(), 80, 16)
    assert df["prompt_tokens"].tolist() == [90, 100]
    assert df["prefix_hashes"].tolist() == [(1, 2, 3, 4, 5)] * 2
    assert df.attrs["hash_block_tokens"] == 16
    five = with_shared_prefix(two_requests(), 341, 16)
    assert five["prompt_tokens"].tolist() == [351, 361]
    assert five["prefix_hashes"].tolist() == [tuple(range(1, 22))] * 2
    assert with_shared_prefix(two_requests(), 80, 32)["prefix_hashes"].iloc[0] == (1, 2)
    assert two_requests()["prompt_tokens"].tolist() == [10, 20]  # the input is left as it was


def test_translation_workload_prefixes_and_bad_shots():
    one = translation_workload(1, 2.0, num_requests=200, seed=1)
    five = translation_workload(5, 2.0, num_requests=200, seed=1)
    assert (one["prompt_tokens"] >= 81).all() and (five["prompt_tokens"] >= 342).all()
    # the same sentences behind both prefixes: 341 - 80 tokens apart, row by row
    assert (five["prompt_tokens"] - one["prompt_tokens"] == 261).all()
    assert (five["output_tokens"] == one["output_tokens"]).all()
    assert len(five["prefix_hashes"].iloc[0]) == 21
    with pytest.raises(ConfigError, match="shots must be one of 1, 5"):
        translation_workload(3, 2.0, num_requests=10)
    with pytest.raises(ConfigError, match="prefix_tokens"):
        with_shared_prefix(two_requests(), -1)


def test_vllm_prefix_caching_computes_the_prefix_once():
    # b arrives after a finished: its 5 prefix blocks (80 tokens) are cached and held, but vLLM
    # 0.4.2 skips only the blocks marked computed, those before the last full block of a's
    # sequence (90 + 1 tokens: 5 full, blocks 0-3 marked): b prefills 100 - 64 = 36 tokens
    # (kv_cache.mark_computed); without prefix caching both prefill in full
    trace = with_shared_prefix(two_requests(), 80, 16)
    prefill = {}
    for caching in (True, False):
        cfg = SimConfig.for_system("vllm", model="llama-13b", gpu="a100-40gb", kv_gib=2, prefix_caching=caching)
        steps = run_simulation(cfg, trace).steps
        prefill[caching] = [int(x) for x in steps["num_prefill_tokens"] if x]
    assert prefill[True] == [90, 36]
    assert prefill[False] == [90, 100]
