"""Prefix hashes: --hash-block-tokens, dict-valued hash_ids, a hashes= column, and telling Mooncake
from files that only share its keys (RAGPulse)."""

from __future__ import annotations

import warnings

import pytest

from pagesim.sim.errors import TraceError
from pagesim.traces.loaders import load_trace
from pagesim.traces.schema import TraceWarning

# RAGPulse's layout: timestamps in seconds as strings, hash_ids a dict of lists. The second row
# lists its keys in another order; the concatenation order is the keys' first appearance in the
# file (sys_prompt, passages_ids, user_input), whatever a row's own order.
RAGPULSE = (
    '{"timestamp": "82", "input_length": 3112, "output_length": 192, '
    '"hash_ids": {"sys_prompt": [1, 2], "passages_ids": [7, 8], "user_input": [9]}, "session_id": "a"}\n'
    '{"timestamp": "93", "input_length": 3167, "output_length": 86, '
    '"hash_ids": {"user_input": [5], "sys_prompt": [1, 3], "passages_ids": []}, "session_id": "b"}\n'
    '{"timestamp": "604685", "input_length": 2890, "output_length": 170, '
    '"hash_ids": {"sys_prompt": [1, 2], "passages_ids": [4]}, "session_id": "c"}\n')


def test_ragpulse_is_not_read_as_mooncake(write):
    with pytest.warns(TraceWarning, match=r"Mooncake's keys but not its numbers \(timestamp holds strings.*"
                                          r"timestamp in s.*hash_ids ignored"):
        df = load_trace(write("rag.jsonl", RAGPULSE))
    # seconds, re-zeroed to 82: 0, 11, 604603 (its week), not milliseconds (604.6 s)
    assert df["arrival_s"].tolist() == [0.0, 11.0, 604603.0]
    assert df.attrs["load_report"]["format"] == "generic" and "prefix_hashes" not in df.columns


def test_dict_hash_ids_concatenate_in_first_appearance_order(write):
    with pytest.warns(TraceWarning, match="Mooncake's keys but not its numbers"):
        df = load_trace(write("rag.jsonl", RAGPULSE), hash_block_tokens=256)
    assert df["prefix_hashes"].tolist() == [(1, 2, 7, 8, 9), (1, 3, 5), (1, 2, 4)]
    assert df.attrs["hash_block_tokens"] == 256


def test_explicit_mooncake_format_accepts_dict_hashes_in_ms(write):
    df = load_trace(write("rag.jsonl", RAGPULSE), format="mooncake")
    assert df["arrival_s"].tolist() == pytest.approx([0.0, 0.011, 604.603], abs=1e-9)  # the user said Mooncake: ms
    assert df["prefix_hashes"].tolist()[0] == (1, 2, 7, 8, 9) and df.attrs["hash_block_tokens"] == 512


def test_mooncake_needs_hash_lengths_that_fit_512_token_blocks(write):
    # 1000 tokens need ceil(1000 / 512) = 2 hashes; one row has 3
    text = ('{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}\n'
            '{"timestamp": 3000, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1, 2]}\n')
    with pytest.warns(TraceWarning, match=r"hash_ids lengths are not ceil\(input_length / 512\)"):
        df = load_trace(write("m.jsonl", text))
    assert df["arrival_s"].tolist() == [0.0, 3000.0] and df.attrs["load_report"]["format"] == "generic"
    fixed = text.replace("[0, 1, 2]", "[0, 2]")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = load_trace(write("m2.jsonl", fixed))
    assert df["arrival_s"].tolist() == [0.0, 3.0] and df.attrs["load_report"]["format"] == "mooncake"


def test_mooncake_without_hashes_cannot_be_confirmed(write):
    text = '{"timestamp": 0, "input_length": 5, "output_length": 5}\n{"timestamp": 2000, "input_length": 5, "output_length": 5}\n'
    with pytest.warns(TraceWarning, match="no hash_ids to confirm"):
        df = load_trace(write("m.jsonl", text))
    assert df["arrival_s"].tolist() == [0.0, 2000.0]
    # saying the unit silences the unit warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_trace(write("m.jsonl", text), time_unit="ms")["arrival_s"].tolist() == [0.0, 2.0]


def test_hash_block_tokens_overrides_mooncake(write):
    text = '{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}\n'
    assert load_trace(write("m.jsonl", text), hash_block_tokens=16).attrs["hash_block_tokens"] == 16


def test_hashes_column_for_generic_traces(write):
    csv = "t,p,o,h\n0,32,1,5 6\n1,20,1,5 7\n2,8,1,\n"
    df = load_trace(write("q.csv", csv), columns="prompt=p,output=o,arrival=t,hashes=h", hash_block_tokens=16)
    assert df["prefix_hashes"].tolist() == [(5, 6), (5, 7), ()]
    assert df.attrs["hash_block_tokens"] == 16
    jsonl = '{"t": 0, "p": 32, "o": 1, "h": [5, 6]}\n{"t": 1, "p": 20, "o": 1, "h": [5, 7]}\n'
    j = load_trace(write("q.jsonl", jsonl), columns="prompt=p,output=o,arrival=t,hashes=h", hash_block_tokens=16)
    assert j["prefix_hashes"].tolist() == [(5, 6), (5, 7)]


def test_hashes_column_needs_a_block_size_and_integers(write):
    path = write("q.csv", "t,p,o,h\n0,32,1,5 6\n1,20,1,5 x\n")
    with pytest.raises(TraceError, match="needs --hash-block-tokens") as ei:
        load_trace(path, columns="prompt=p,output=o,arrival=t,hashes=h")
    assert ei.value.field == "h"
    with pytest.raises(TraceError, match="must be a list of integers") as ei:
        load_trace(path, columns="prompt=p,output=o,arrival=t,hashes=h", hash_block_tokens=16)
    assert (ei.value.row, ei.value.field) == (2, "h")


def test_prefix_caching_shares_a_hashes_column(write):
    """Two 40-token prompts whose first two 16-token hashes agree: the second reuses the first's
    two full 16-token blocks (32 tokens; the third block is not full)."""
    import argparse

    from pagesim.sim.config import SimConfig
    from pagesim.sim.run import run_simulation
    from pagesim.traces.args import add_workload_args, workload_from_args
    p = argparse.ArgumentParser()
    add_workload_args(p)
    path = write("q.csv", "t,p,o,h\n0,40,1,5 6 8\n100,40,1,5 6 9\n")
    args = p.parse_args(["--trace", str(path), "--columns", "prompt=p,output=o,arrival=t,hashes=h",
                         "--hash-block-tokens", "16"])
    trace, _ = workload_from_args(args, 2048, "error")
    cfg = SimConfig.for_system("vllm", prefix_caching=True, kv_gib=2.0)
    res = run_simulation(cfg, trace, progress=False)
    assert res.summary["completed"] == 2 and res.summary["mgr_prefix_hit_tokens"] == 32
