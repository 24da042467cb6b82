"""CPU tests: profile CSV format, partition heuristics, swap run coalescing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.gpu import paged_attention as pa
from pagesim.gpu.cache_ops import coalesce_runs
from pagesim.gpu.kernels_src import HEAD_DIMS, HEADS_PER_BLOCK, heads_per_block
from pagesim.sim.cost.profile_format import COLUMNS, read_profile, write_profile
from pagesim.sim.errors import ConfigError


# ---- profile format ---------------------------------------------------------------------------
def rows():
    c = dict(model="llama-2-7b", gpu="h200", dtype="float16", tp=1)
    return [dict(component="linear", num_tokens=1, batch=None, context=None, time_us=1234.5, **c),
            dict(component="linear", num_tokens=64, batch=None, context=None, time_us=1500.25, **c),
            dict(component="attn_decode", num_tokens=None, batch=8, context=1024, time_us=300.0, **c),
            dict(component="attn_prefill", num_tokens=512, batch=None, context=None, time_us=800.0, **c),
            dict(component="overhead", num_tokens=None, batch=None, context=None, time_us=50.0, **c)]


def test_profile_round_trip(tmp_path):
    p = write_profile(rows(), tmp_path / "sub" / "profile.csv")
    text = p.read_text().splitlines()
    assert text[0] == ",".join(COLUMNS)
    assert text[1] == "linear,1,,,1234.500,llama-2-7b,h200,float16,1"
    df = read_profile(p)
    assert list(df.columns) == list(COLUMNS)
    assert str(df["batch"].dtype) == "Int64" and df["time_us"].dtype == np.float64
    assert df.loc[2, "batch"] == 8 and df.loc[2, "context"] == 1024 and pd.isna(df.loc[2, "num_tokens"])
    assert df["time_us"].tolist() == [1234.5, 1500.25, 300.0, 800.0, 50.0]
    # a DataFrame goes back in unchanged
    write_profile(df, tmp_path / "again.csv")
    pd.testing.assert_frame_equal(read_profile(tmp_path / "again.csv"), df)


@pytest.mark.parametrize("change,msg", [
    (dict(component="mlp"), "row 1, field 'component': unknown component"),
    (dict(num_tokens=None), "row 1, field 'num_tokens': required"),
    (dict(num_tokens="x"), "field 'num_tokens': not an integer"),
    (dict(num_tokens=0), "field 'num_tokens': must be >= 1"),
    (dict(num_tokens=1.5), "not an integer"),
    (dict(batch=4), "field 'batch': must be empty"),
    (dict(time_us=-1), "field 'time_us'"),
    (dict(time_us="nan"), "field 'time_us'"),
    (dict(model=""), "field 'model': must not be empty"),
    (dict(dtype="fp8"), "field 'dtype'"),
    (dict(tp=0), "field 'tp'"),
])
def test_profile_errors_name_row_and_field(tmp_path, change, msg):
    r = rows()
    r[0].update(change)
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(")):
        write_profile(r, tmp_path / "p.csv")


def test_read_profile_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_profile(tmp_path / "missing.csv")
    p = tmp_path / "p.csv"
    p.write_text("component,num_tokens,batch,time_us,model,gpu,dtype,tp\n")
    with pytest.raises(ConfigError, match="missing column 'context'"):
        read_profile(p)
    p.write_text(",".join(COLUMNS) + "\n")
    with pytest.raises(ConfigError, match="no rows"):
        read_profile(p)
    p.write_text(",".join(COLUMNS) + "\noverhead,,,,5,m,g,float16,1\nattn_decode,,2,,5,m,g,float16,1\n")
    with pytest.raises(ConfigError, match=r"p.csv: row 2, field 'context': required"):
        read_profile(p)
    p.write_text(",".join(COLUMNS) + "\noverhead,,,,5,m,g,float16,1\noverhead,,,,6,m,g,float16,1\n")
    with pytest.raises(ConfigError, match="row 2: duplicate"):
        read_profile(p)
    p.write_text(",".join(COLUMNS) + "\noverhead,,,,5,m,g,float16,1,extra\n")
    with pytest.raises(ConfigError, match="row 1: more fields"):
        read_profile(p)
    p.write_text("")
    with pytest.raises(ConfigError, match="empty profile"):
        read_profile(p)


# ---- launch heuristics (pure functions) --------------------------------------------------------
def test_heads_per_block():
    assert [heads_per_block(g) for g in (1, 2, 3, 4, 5, 8, 16, 32)] == [1, 2, 4, 4, 8, 8, 8, 8]


def test_choose_partition_size():
    # 132 SMs: halved while the grid has under 8 x 132 = 1,056 blocks, the halving not below 64;
    # then the longest context cut in that many equal partitions (which may be shorter than 64)
    # big grid: default 512; context <= 512 gives one partition of it all (v1 path)
    assert pa.choose_partition_size(256, 32, 32768, 132) == 512
    assert pa.choose_partition_size(256, 32, 300, 132) == 300
    assert pa.choose_partition_size(32, 32, 1000, 132) == 500  # 32 x 32 x 2 = 2,048 blocks
    assert pa.choose_partition_size(32, 32, 600, 132) == 300  # 512 + 88 made 300 + 300
    # small grid on a long context: smaller partitions to fill the GPU, halved not below 64
    assert pa.choose_partition_size(1, 8, 32768, 132) == 128  # 512, 1,024 blocks, then 2,048 at 128
    assert pa.choose_partition_size(2, 8, 8192, 132) == 64  # 256, 512, 1,024 blocks, then the floor
    assert pa.choose_partition_size(1, 1, 4096, 132) == 64
    # llama-2-7b's decode at 8 sequences, the longest 580 (the H200's steps of 2026-11-27):
    # 512 -> 2 partitions, 512 blocks; 256 -> 3, 768; 128 -> 5, 1,280
    assert pa.choose_partition_size(8, 32, 580, 132) == 116  # 5 of 128, made equal
    # a short context: from the power of two that holds it, 128, halved as a long one is
    assert pa.choose_partition_size(1, 1, 100, 132) == 50  # 2 of 64, made equal
    assert pa.choose_partition_size(1, 32, 256, 132) == 64  # 256 -> 128 -> 64: 32, 64, 128 blocks
    assert pa.choose_partition_size(16, 32, 256, 132) == 64  # 512, 1,024 blocks, then 2,048 at 64
    assert pa.choose_partition_size(33, 32, 256, 132) == 256  # 1,056 blocks in one partition each
    assert pa.choose_partition_size(5, 32, 200, 132) == 50  # 256 -> 128 -> 64: 160, 320, 640 blocks; 4 of 50
    assert pa.choose_partition_size(1, 1, 1, 132) == 1  # (a one-token context: one token a partition)
    assert pa.choose_partition_size(4, 8, 1000, 132, num_partitions=3) == 334
    assert pa.choose_partition_size(4, 8, 0, 132, num_partitions=3) == 1
    with pytest.raises(ValueError):
        pa.choose_partition_size(4, 8, 1000, 132, num_partitions=0)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads", HEADS_PER_BLOCK)
def test_default_partitions_fit_default_shared_memory(head_dim, heads):
    assert pa.smem_bytes(heads, head_dim, pa.DEFAULT_PARTITION) <= 48 * 1024


def test_coalesce_runs():
    assert coalesce_runs(np.zeros((0, 2))) == []
    assert coalesce_runs([[5, 0], [3, 10], [4, 11], [6, 1], [9, 2]]) == [(3, 10, 2), (5, 0, 2), (9, 2, 1)]


def test_launch_config_refuses_more_sequences_than_grid_y():
    cfg = pa.launch_config(65535, 8, 8, 128, 100, 132, 227 * 1024)
    assert cfg.grid_x == 8
    with pytest.raises(ValueError, match="num_seqs 65536 exceeds 65535, the grid's y limit; split the batch"):
        pa.launch_config(65536, 8, 8, 128, 100, 132, 227 * 1024)
