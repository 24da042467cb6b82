"""Every run ends, and every request is accounted for (issue #15's fuzz classes), over random
configurations of every system: static; Orca with max / pow2 / oracle / predicted
reservations on buddy, first-fit or best-fit placement; vLLM's paged manager with any block
size, token-level paging and vAttention pages; prefix caching, parallel sampling and beam
search, recompute or swap preemption (with little or much swap space), chunked prefill,
watermarks, ``waiting_served_ratio``, ``max_num_seqs`` and pools barely larger than one
request. Each run must end within a time bound, finish or reject (with a reason) every request
that arrived, and raise nothing: no InvariantError (``--check`` in some examples), no
traceback. ``PAGESIM_FUZZ_EXAMPLES=2000`` hunts for more faults than CI's 200, and
``PAGESIM_FUZZ_SEED=1 pytest --hypothesis-seed=1`` elsewhere than CI's fixed examples."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pagesim.sim.config import SimConfig
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import initial_state, run_simulation
from tests.sim.helpers import OPT13B_SLOT, ends_within

EXAMPLES = int(os.environ.get("PAGESIM_FUZZ_EXAMPLES", "200"))  # 200 find the faults of #15 (~30 s)
MAX_LEN = 64


@st.composite
def configurations(draw):
    system = draw(st.sampled_from(["vllm", "static", "orca-max", "orca-pow2", "orca-oracle", "orca-predicted",
                                   "vllm", "token", "vattention", "vllm"]))
    kw = dict(max_seq_len=MAX_LEN, seed=draw(st.integers(0, 2**16)),
              max_num_seqs=draw(st.sampled_from([1, 2, 3, 8, 256])))
    # a pool from one request's worth (where a decode step preempts everyone) to a few dozen
    slots = draw(st.sampled_from([MAX_LEN, MAX_LEN + 3, 2 * MAX_LEN, 3 * MAX_LEN + 5, 6 * MAX_LEN, 40 * MAX_LEN]))
    width = 1
    if system == "static":
        kw["static_batch_size"] = draw(st.sampled_from([None, 1, 3]))
    elif system.startswith("orca"):
        kw["placement"] = draw(st.sampled_from(["buddy", "first-fit", "best-fit"]))
        if system == "orca-predicted":
            system = "orca-max"
            kw["reservation"] = "predicted"
            kw["predictor_error"] = draw(st.sampled_from([0.0, 0.3, 1.0]))
        if kw["placement"] == "buddy":
            slots = max(slots, 2 * MAX_LEN)  # a buddy block of max_seq_len must exist
    else:
        if system == "vllm":
            kw["block_size"] = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
            kw["prefix_caching"] = draw(st.booleans())
        elif system == "token":
            kw["prefix_caching"] = draw(st.booleans())
        kw["watermark"] = draw(st.sampled_from([0.0, 0.01, 0.1, 0.3]))
        kw["append_rule"] = draw(st.sampled_from(["free-block-per-seq", "exact"]))
        width = draw(st.sampled_from([1, 1, 2, 4]))
    if system != "static":
        kw["preemption"] = draw(st.sampled_from(["recompute", "swap"]))
        kw["swap_gib"] = draw(st.sampled_from([0, 10, 100, 10_000])) * OPT13B_SLOT / 2**30
        kw["chunked_prefill"] = draw(st.booleans())
        if kw["chunked_prefill"]:
            kw["chunk_budget"] = draw(st.sampled_from([1, 7, 64, 512]))
        kw["waiting_served_ratio"] = draw(st.sampled_from([None, None, 0.5, 2.0]))
    kw["check"] = draw(st.booleans())
    cfg = SimConfig.for_system(system, model="opt-13b", gpu="a100-80gb", kv_gib=slots * OPT13B_SLOT / 2**30, **kw)
    return cfg, width


@st.composite
def traces(draw, width):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = int(rng.integers(1, 33))  # (numpy's draws: hypothesis favours tiny traces)
    gaps = rng.exponential(draw(st.sampled_from([0.01, 0.1, 1.0])), n) * (rng.random(n) < 0.7)
    prompt = rng.integers(1, MAX_LEN, n)
    output = np.maximum(1, np.minimum(rng.integers(1, MAX_LEN, n), MAX_LEN - prompt))
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_s": np.cumsum(gaps),
                       "prompt_tokens": prompt, "output_tokens": output})
    if width > 1:
        df[draw(st.sampled_from(["n", "beam_width"]))] = rng.integers(1, width + 1, n)
    if draw(st.booleans()):  # shared prompt prefixes (used where prefix caching is on)
        df["prefix_hashes"] = [tuple(rng.integers(0, 2, max(p // 8, 0)).tolist()) for p in prompt]
        df.attrs["hash_block_tokens"] = 8
    return df


@st.composite
def runs(draw):
    cfg, width = draw(configurations())
    return cfg, draw(traces(width))


@settings(max_examples=EXAMPLES, deadline=None, derandomize="PAGESIM_FUZZ_SEED" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(runs())
def test_every_run_ends_and_accounts_for_every_request(run):
    cfg, trace = run
    try:  # a configuration refused up front, in one line, is an answer too (a pool that cannot
        initial_state(cfg, trace)  # hold one max_seq_len request in whole vAttention pages, ...)
    except ConfigError as e:
        assert "\n" not in str(e)
        assume(False)
    with ends_within(120):
        result = run_simulation(cfg, trace)
    s, requests = result.summary, result.requests
    assert s["completed"] + s["rejected"] == len(trace), (s["completed"], s["rejected"], s["unfinished"])
    rejected = requests[requests["status"] == "rejected"]
    assert (rejected["reject_reason"].str.len() > 0).all()
    assert (requests["status"] != "unfinished").all()
