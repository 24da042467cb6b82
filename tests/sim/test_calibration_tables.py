"""The calibrated model's measured tables, worked by hand: each GEMM's correction from the nearest
measured shapes (``sim.cost.calibrated.nearest_ratios``), its fit (``gemm_ratio_table``,
``choose_neighbours``) and the all-reduce priced from the measured collective table."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pagesim.sim.batch import StepBatch
from pagesim.sim.cost import calibration_fit as fit
from pagesim.sim.cost.calibrated import CalibratedCostModel, nearest_ratios
from pagesim.sim.cost.calibration import Calibration
from pagesim.sim.specs import ModelSpec
from tests.sim.test_calibration import (A100, TOY, TOY_CAL, TOY_GPU, TRUE, assert_bad_file_is_one_line, decode_batch,
                                       write_measured)


def toy(cal: Calibration, tp: int = 1) -> CalibratedCostModel:
    cm = CalibratedCostModel(TOY, TOY_GPU, tp, cal)
    cm.overhead_s, cm.per_seq_overhead_s = 0.1, 0.01
    return cm


# the toy's TP 1 GEMMs (K, N): qkv (4, 8), o (4, 4), up (4, 16), down (8, 4), each measured; qkv's
# time is 2x the formula at 2 tokens and 4x at 6, the others' the formula's
RATIOS = replace(TOY_CAL, gemm_neighbours=1, gemm_radius=math.inf, gemm_shape_k=(4.0, 4.0, 4.0, 8.0),
                 gemm_shape_n=(8.0, 4.0, 16.0, 4.0),
                 gemm_grid_tokens=(2.0, 6.0), gemm_ratio=(2.0, 4.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0))


def test_a_gemm_is_the_formula_times_its_shapes_ratio_interpolated_by_hand():
    # 3 tokens: qkv's formula 3.976 (test_calibration's hand count) x 2.5 (a quarter of the way
    # from 2 to 4): 1.5 x 3.976 more per layer, two layers
    extra = toy(RATIOS).step_time(decode_batch(3, 30)) - toy(TOY_CAL).step_time(decode_batch(3, 30))
    assert extra == pytest.approx(2 * 1.5 * 3.976, rel=1e-12)


def test_beyond_the_grid_a_gemm_keeps_the_last_ratio():
    # 20 tokens: qkv's formula 13.16, x 4 (the ratio at 6 tokens, the grid's last)
    extra = toy(RATIOS).step_time(decode_batch(20, 400)) - toy(TOY_CAL).step_time(decode_batch(20, 400))
    assert extra == pytest.approx(2 * 3 * 13.16, rel=1e-12)


def test_nearest_shapes_by_hand():
    measured = np.array([[4.0, 8.0], [8.0, 4.0], [4.0, 16.0]])
    rows = np.array([[1.0], [2.0], [6.0]])
    # (4, 12): ln 1.5 = 0.41 from (4, 8), ln 3 + ln 2 = 1.79 from (8, 4), ln 4/3 = 0.29 from (4, 16)
    assert [r[0] for r in nearest_ratios([(4, 12)], measured, rows, 1, math.inf)] == [6.0]
    assert [r[0] for r in nearest_ratios([(4, 12)], measured, rows, 2, math.inf)] == [3.5]  # the median of 6 and 1
    assert [r[0] for r in nearest_ratios([(4, 12)], measured, rows, 3, math.inf)] == [2.0]  # of 6, 1, 2 (not 3)
    assert [r[0] for r in nearest_ratios([(4, 8), (8, 4)], measured, rows, 1, math.inf)] == [1.0, 2.0]  # its own
    # (4, 4) is ln 2 from both (4, 8) and (8, 4): the earlier
    assert nearest_ratios([(4, 4)], measured, rows, 1, math.inf)[0][0] == 1.0


def test_only_shapes_within_the_radius_count():
    measured = np.array([[4.0, 8.0], [8.0, 4.0], [4.0, 16.0]])
    rows = np.array([[1.0, 1.0], [2.0, 2.0], [6.0, 6.0]])
    # (4, 12) within 0.35: (4, 16) alone, even of 3 neighbours; within 0.2: none, the formula's 1
    assert nearest_ratios([(4, 12)], measured, rows, 3, 0.35)[0].tolist() == [6.0, 6.0]
    assert nearest_ratios([(4, 12)], measured, rows, 3, 0.2)[0].tolist() == [1.0, 1.0]
    assert nearest_ratios([(4, 12)], measured, rows, 3, 0.5)[0].tolist() == [3.5, 3.5]  # 6 and 1


def test_a_model_with_no_measured_shape_near_reads_no_grid():
    from pagesim.sim.core.price.cost_calibrated import GRID_POINTS

    far = replace(RATIOS, gemm_shape_k=(400.0,) * 4, gemm_radius=1.0)  # ln 100 from every toy GEMM
    assert toy(far).tables()[GRID_POINTS] == 0 and toy(RATIOS).tables()[GRID_POINTS] == 2
    assert toy(far).step_time(decode_batch(3, 30)) == toy(TOY_CAL).step_time(decode_batch(3, 30))


# TP 2: hidden 4 x 2 bytes = 8 bytes per token; the table holds 8 and 80 bytes (1 and 10 tokens)
AR_TABLE = replace(TOY_CAL, allreduce_table_tp=(2, 2), allreduce_table_bytes=(8.0, 80.0), allreduce_table_s=(1.0, 3.25))


def test_the_allreduce_is_priced_from_the_measured_table_within_it():
    # 3 tokens: 1 + (3 - 1) / 9 x 2.25 = 1.5 s each, 2 per layer x 2 layers = 6, against the
    # line's 2 x 2 x (0.5 + 3 x 8 / 8) = 14 (test_calibration's TP 2 count)
    extra = toy(AR_TABLE, 2).step_time(decode_batch(3, 30)) - toy(TOY_CAL, 2).step_time(decode_batch(3, 30))
    assert extra == pytest.approx(6 - 14, rel=1e-12)
    assert AR_TABLE.allreduce_table(2) == ((8.0, 80.0), (1.0, 3.25)) and AR_TABLE.allreduce_table(4) == ((), ())


def test_beyond_the_table_the_allreduce_grows_from_its_last_size_at_the_lines_bandwidth():
    # 20 tokens: 3.25 + (20 - 10) x 8 B / 8 B/s = 13.25 s each, x 2 x 2 layers = 53; the line's
    # 2 x 2 x (0.5 + 20 x 8 / 8) = 82
    extra = toy(AR_TABLE, 2).step_time(decode_batch(20, 400)) - toy(TOY_CAL, 2).step_time(decode_batch(20, 400))
    assert extra == pytest.approx(53 - 82, rel=1e-12)


def compiled_step_time(*args) -> float:
    """``calibrated_step_time`` as the core's loop runs it: numba-compiled, called from compiled
    code (a call from Python runs the interpreted source, ``sim.core.jit``)."""
    numba = pytest.importorskip("numba")
    from pagesim.sim.core.compile import jit
    from pagesim.sim.core.price.cost_calibrated import calibrated_step_time

    step = jit.compiled(calibrated_step_time)

    @numba.njit
    def call(c, tables, a, b, d, e, f, g, h, i, j):
        return step(c, tables, a, b, d, e, f, g, h, i, j)

    return call(*args)


def test_compiled_step_time_is_the_same_float():
    # TP 2 of this model: qkv (4096, 3072), o (2048, 4096), up (4096, 14336), down (7168, 4096);
    # 8192 bytes per token on the wire; the tables' grid and collectives at 1, 50 and 200 tokens
    tabled = replace(TRUE, gemm_neighbours=2, gemm_radius=1.0, gemm_shape_k=(4096.0, 4096.0),
                     gemm_shape_n=(3072.0, 14336.0), gemm_grid_tokens=(1.0, 64.0, 128.0, 4096.0),
                     gemm_ratio=(1.1, 0.9, 1.3, 1.0, 1.2, 1.05, 0.95, 1.0),
                     allreduce_table_tp=(2, 2, 2), allreduce_table_bytes=(8192.0, 409600.0, 1638400.0),
                     allreduce_table_s=(2e-5, 3e-5, 5e-5))
    model = ModelSpec("l", 32, 4096, 32, 8, 128, 14336, 32000, 8192)
    for cal in (TRUE, tabled):
        cm = CalibratedCostModel(model, A100, 2, cal)
        for new in (7, 100, 5000):  # 19 and 112 tokens inside the collective table, 5,012 beyond it and the grid
            b = StepBatch(prefill_seq_ids=np.arange(2), prefill_tokens=np.array([new, 7]),
                          prefill_context=np.array([new + 200, 7]), decode_seq_ids=np.arange(2, 7),
                          decode_context=np.array([40, 1, 5, 900, 3]))
            args = (b.num_seqs, new + 12, 5, 949, 2, new * 200, new * new + 49, 0, 0)
            assert compiled_step_time(cm.constants(), cm.tables(), *args) == cm.step_time(b)
    assert cm.step_time(b) != CalibratedCostModel(model, A100, 2, TRUE).step_time(b)


def test_a_one_point_grid_holds_its_ratio_on_both_sides():
    one = replace(RATIOS, gemm_grid_tokens=(6.0,), gemm_ratio=(4.0, 1.0, 1.0, 1.0))
    for tokens, formula in ((3, 3.976), (20, 13.16)):  # qkv's formula at 3 and 20 tokens, x 4 either side
        extra = toy(one).step_time(decode_batch(tokens, 30)) - toy(TOY_CAL).step_time(decode_batch(tokens, 30))
        assert extra == pytest.approx(2 * 3 * formula, rel=1e-12)


def fake_rows(monkeypatch, table: dict) -> None:
    """The fit's GEMM timings replaced by ``table[model] = [(tokens, K, N, seconds)]``, against a
    formula of 1 s: each timing is its own ratio."""
    def rows(measured, models):
        r = np.array([x for m in models for x in table[m]], float)
        return r[:, 0], r[:, 1], r[:, 2], np.full(len(r), 2.0), r[:, 3]
    monkeypatch.setattr(fit, "_gemm_rows", rows)
    monkeypatch.setattr(fit, "_gemm_formula", lambda rows, gpu, constants: np.ones(len(rows[0])))


def test_ratio_table_is_the_median_per_shape_and_token_count(monkeypatch):
    fake_rows(monkeypatch, {"a": [(8, 100, 100, 2.0), (24, 100, 100, 4.0), (8, 100, 200, 1.0), (24, 100, 200, 3.0)],
                            "b": [(8, 100, 100, 4.0), (16, 100, 100, 3.0), (24, 100, 100, 6.0)],
                            "c": [(8, 100, 100, 10.0)]})
    shapes, grid, ratios = fit.gemm_ratio_table(None, ["a", "b", "c"], A100, {})
    assert shapes.tolist() == [[100, 100], [100, 200]] and grid.tolist() == [8, 16, 24]
    # (100, 100): medians 4 (of 2, 4, 10), 3 (b alone), 5; (100, 200): 1, 2 (between its own 8 and 24), 3
    assert ratios.tolist() == [[4, 3, 5], [1, 2, 3]]


def test_each_timing_takes_its_own_shapes_ratio_at_its_token_count():
    shapes, grid, ratios = np.array([[100.0, 100.0], [100.0, 200.0]]), np.array([8.0, 24.0]), np.array([[1, 3], [2, 5]])
    rows = (np.array([16, 8, 40]), np.array([100, 100, 100]), np.array([100, 200, 100]))
    # (100, 100) halfway from 8 to 24: 2; (100, 200) at 8: 2; (100, 100) past the grid: 3, its last
    assert fit.row_ratios(rows, shapes, grid, ratios, 1, math.inf).tolist() == [2, 2, 3]


# one shape per model, K 100, N 100 .. 800, ratios 1, 5, 1, 1 (B the odd one out). Held out, each
# is priced by the others (ties: the earlier shape):
#   one neighbour:  A by B: |5 - 1| = 4;  B by A: 0.8;  C by B (tied with D): 4;  D by C: 0
#   two neighbours: A by B, C: |3 - 1| = 2;  B by A, C: 0.8;  C by B, D: 2;  D by C, B: 2
# p90 of (0, 0.8, 4, 4) = 4, of (0.8, 2, 2, 2) = 2: two neighbours
ODD_ONE_OUT = {"a": [(8, 100, 100, 1.0)], "b": [(8, 100, 200, 5.0)], "c": [(8, 100, 400, 1.0)],
               "d": [(8, 100, 800, 1.0)]}


def test_the_neighbour_count_is_chosen_leaving_each_model_out(monkeypatch):
    monkeypatch.setattr(fit, "NEIGHBOURS", (1, 2))
    monkeypatch.setattr(fit, "RADII", (math.inf,))
    fake_rows(monkeypatch, ODD_ONE_OUT)
    assert fit.choose_neighbours(None, ["a", "b", "c", "d"], A100, {}) == (2, math.inf)
    # with B's ratio 1 too, every pair prices every model exactly: the fewer neighbours, then the
    # smaller radius, win the tie
    fake_rows(monkeypatch, {**ODD_ONE_OUT, "b": [(8, 100, 200, 1.0)]})
    monkeypatch.setattr(fit, "RADII", (math.inf, 1.0))
    assert fit.choose_neighbours(None, ["a", "b", "c", "d"], A100, {}) == (1, 1.0)
    assert fit.choose_neighbours(None, ["a"], A100, {}) == (1, math.inf)  # nothing to leave out


# two clusters of shapes, N 100-120 at ratio 1 and 1000-1100 at ratio 3, and E at N 10,000, ratio 3.
# One neighbour: each model of a cluster is priced by the other (d <= 0.18): exact; E by D
# (d = ln 9.1 = 2.2): exact with no radius, the formula's 1 within 1 (|1/3 - 1| = 0.67)
CLUSTERS = {"a": [(8, 100, 100, 1.0)], "b": [(8, 100, 120, 1.0)], "c": [(8, 100, 1000, 3.0)],
            "d": [(8, 100, 1100, 3.0)], "e": [(8, 100, 10000, 3.0)]}


def test_the_radius_is_chosen_leaving_each_model_out(monkeypatch):
    monkeypatch.setattr(fit, "NEIGHBOURS", (1,))
    monkeypatch.setattr(fit, "RADII", (1.0, math.inf))
    fake_rows(monkeypatch, CLUSTERS)
    assert fit.choose_neighbours(None, sorted(CLUSTERS), A100, {}) == (1, math.inf)
    # E's ratio 1: its far neighbour misleads (error 2), the radius leaves it to the formula
    fake_rows(monkeypatch, {**CLUSTERS, "e": [(8, 100, 10000, 1.0)]})
    assert fit.choose_neighbours(None, sorted(CLUSTERS), A100, {}) == (1, 1.0)


def test_fit_keeps_the_collective_table_and_the_gemm_ratios(tmp_path):
    m = fit.read_measured(write_measured(tmp_path), "a100-80gb")
    got = fit.fit_calibration(m, A100)
    sizes, seconds = got.allreduce_table(2)
    table = m.allreduce[m.allreduce["tp"] == 2]
    assert sizes == tuple(table["size"].astype(float)) and seconds == pytest.approx(list(table["ms"] * 1e-3), rel=1e-5)
    # the measured timings are the formula's own: every ratio 1
    assert got.gemm_neighbours >= 1 and np.asarray(got.gemm_ratio) == pytest.approx(1.0, rel=1e-5)
    assert len(got.gemm_ratio) == len(got.gemm_shape_k) * len(got.gemm_grid_tokens)


TABLED = replace(TRUE, gemm_neighbours=1, gemm_radius=0.5, gemm_shape_k=(4096.0,), gemm_shape_n=(4096.0,),
                 gemm_grid_tokens=(1.0, 8.0),
                 gemm_ratio=(1.5, 1.25), allreduce_table_tp=(2, 2), allreduce_table_bytes=(2048.0, 4096.0),
                 allreduce_table_s=(1e-5, 2e-5))


def test_tables_round_trip_through_the_file(tmp_path):
    path = tmp_path / "c.toml"
    for cal in (TABLED, replace(TABLED, gemm_radius=math.inf)):  # inf: any distance
        path.write_text(cal.to_toml())
        assert Calibration.from_toml(path) == cal


@pytest.mark.parametrize("edit,msg", [
    (("gemm_ratio = [1.5, 1.25]", "gemm_ratio = [1.5]"), "gemm_ratio needs a value per shape and token count (1 x 2)"),
    (("gemm_neighbours = 1", "gemm_neighbours = 2"), "gemm_neighbours must be between 1 and the 1 shapes"),
    (("gemm_radius = 0.5\n", ""), "gemm_radius goes with the GEMM shapes, both or neither"),
    (("gemm_radius = 0.5", "gemm_radius = -inf"), "field 'gemm_radius' must hold finite numbers > 0"),
    (("gemm_grid_tokens = [1.0, 8.0]", "gemm_grid_tokens = [8.0, 1.0]"), "gemm_grid_tokens must be increasing"),
    (("allreduce_table_bytes = [2048.0, 4096.0]", "allreduce_table_bytes = [4096.0, 2048.0]"),
     "the all-reduce table must be sorted"),
    (("allreduce_table_s = [1e-05, 2e-05]", "allreduce_table_s = [1e-05]"), "must have the same length"),
    (("gemm_shape_k = [4096.0]", "gemm_shape_k = 4096.0"), "field 'gemm_shape_k' must be a list of numbers"),
    (("gemm_radius = 0.5", "gemm_radius = [0.5]"), "field 'gemm_radius' must be one number"),
    (("gemm_neighbours = 1", "gemm_neighbours = 1.5"), "field 'gemm_neighbours' must hold whole numbers"),
    (("allreduce_table_tp = [2, 2]", "allreduce_table_tp = [2.5, 2.5]"), "'allreduce_table_tp' must hold whole numbers"),
])
def test_bad_tables_in_a_calibration_file_are_one_line(tmp_path, capsys, edit, msg):
    assert_bad_file_is_one_line(tmp_path, capsys, TABLED, edit, msg)
