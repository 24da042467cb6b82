"""benchmarks/vidur_speed.py: the stand-in for Vidur's attention table (kept in Git LFS upstream),
written from the measured rows in Vidur's columns, worked by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import vidur_speed  # noqa: E402


def test_the_stand_in_attention_table_by_hand(tmp_path):
    # a decode of 4 sequences over 512 cached tokens in 0.02 ms; a prefill chunk of 256 tokens
    # after 1,024 in 0.11 ms; a duplicate row (not a measurement) left out
    subset = tmp_path / "rows.csv"
    subset.write_text("kind,kv,n,median_ms\ndecode,512,4,0.02\nprefill,1024,256,0.11\ndecode_dup,512,4,0.03\n")
    out = tmp_path / "a100" / "attention.csv"
    assert vidur_speed.stand_in_attention(subset, out) == 2
    table = pd.read_csv(out)
    decode, prefill = table.iloc[0], table.iloc[1]
    # the shape Vidur filters by: Llama-2-7B, blocks of 16, one GPU
    assert (table[["n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers"]].to_numpy()
            == [4096, 32, 32, 16, 1]).all()
    # Vidur reads a decode as prefill_chunk_size 0 (is_decode) over (batch_size, kv_cache_size)
    assert (decode["batch_size"], decode["kv_cache_size"], decode["prefill_chunk_size"]) == (4, 512, 0)
    assert decode["time_stats.attn_decode.median"] == 0.02
    # a prefill over (kv_cache_size, prefill_chunk_size)
    assert (prefill["batch_size"], prefill["kv_cache_size"], prefill["prefill_chunk_size"]) == (1, 1024, 256)
    assert prefill["time_stats.attn_prefill.median"] == 0.11
