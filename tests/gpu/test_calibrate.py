"""gpu/calibrate.py on the CPU: the decode grid cut to a full rectangle within the memory budget,
and the refusal to write a profile the table cost model would refuse."""

from __future__ import annotations

import pandas as pd
import pytest

from pagesim.gpu.calibrate import check_profile, decode_bytes, decode_grid, fake_profile, grids
from pagesim.sim.cost.roofline import TableCostModel
from pagesim.sim.errors import ConfigError
from pagesim.sim.specs import get_gpu, get_model

M = get_model("llama-2-7b")  # 32 KV heads x 128: 16 KiB of K+V per token


def test_decode_bytes_by_hand():
    # 2 (K, V) x 4 seqs x 100 tokens x 32 heads x 128 x 2 B + the queries 4 x 32 x 128 x 2 B
    assert decode_bytes(M, 4, 100) == 2 * 4 * 100 * 32 * 128 * 2 + 4 * 32 * 128 * 2


def test_decode_grid_keeps_the_largest_full_rectangle():
    pairs = [(b, c) for b in (1, 2, 4) for c in (100, 200, 400)]
    # budget: K/V of b x c <= 400 tokens and at most 4 queries; the staircase is
    #   b=1: 100 200 400   b=2: 100 200   b=4: 100
    budget = decode_bytes(M, 4, 100)
    keep, dropped = decode_grid(M, pairs, budget)
    # rectangles: 1x3 = 3, 2x2 = 4, 3x1 = 3 -> batches {1, 2} x contexts {100, 200} (not the last one)
    assert keep == [(1, 100), (1, 200), (2, 100), (2, 200)]
    assert sorted(dropped) == [(1, 400), (2, 400), (4, 100), (4, 200), (4, 400)]
    # everything fits: nothing dropped
    assert decode_grid(M, pairs, 1e15) == (pairs, [])


def _rows(decode):
    common = dict(model=M.name, gpu="h200", dtype="float16", tp=1, num_tokens=None, batch=None, context=None)
    rows = [dict(common, component="linear", num_tokens=n, time_us=10.0 + n) for n in (1, 64)]
    rows += [dict(common, component="attn_decode", batch=b, context=c, time_us=1.0 + b * c / 100) for b, c in decode]
    return rows + [dict(common, component="overhead", time_us=5.0)]


def test_check_profile_refuses_a_grid_with_a_hole_and_accepts_the_cut_one():
    pairs = [(b, c) for b in (1, 2, 4) for c in (100, 200, 400)]
    budget = decode_bytes(M, 4, 100)
    fitting = [p for p in pairs if decode_bytes(M, *p) <= budget]  # the old rule: skip what does not fit
    with pytest.raises(ConfigError, match="would refuse this profile.*full batch x context grid"):
        check_profile(_rows(fitting), M, "h200")
    check_profile(_rows(decode_grid(M, pairs, budget)[0]), M, "h200")
    with pytest.raises(ConfigError, match="no 'attn_decode' rows"):
        check_profile(_rows([]), M, "h200")


def test_fake_profile_is_read_by_the_table_model(tmp_path, capsys):
    p = fake_profile("llama-2-7b", "h200", tmp_path / "p.csv", budget_gib=4.0)
    df = pd.read_csv(p)
    dec = df[df.component == "attn_decode"]
    pairs, _, _ = grids(M, False)
    assert 0 < len(dec) < len(pairs)  # 4 GiB cuts the grid, to a full rectangle
    assert len(dec) == len(set(dec.batch)) * len(set(dec.context))
    TableCostModel(p, M, get_gpu("h200"))
    assert "decode points left out" in capsys.readouterr().out
