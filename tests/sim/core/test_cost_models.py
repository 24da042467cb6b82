"""The table model's interpolation (``sim/core/price/cost_table.py``) and the scale of a model's GPU
time (``sim/core/price/cost.py``'s ``scaled_step_time``), worked by hand: tables of round numbers,
each case's value computed in the comment beside it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.batch import StepBatch
from pagesim.sim.core.price.cost import scaled_step_time
from pagesim.sim.core.price.cost_table import decode_seconds, interp_extrap
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.cost.models import make_cost_model
from pagesim.sim.cost.profile_format import write_profile
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import run_simulation
from pagesim.sim.specs import get_gpu, get_model
from tests.sim.helpers import cfg_for

XS, YS = np.array([1.0, 3.0, 7.0]), np.array([10.0, 20.0, 60.0])  # slopes 5, then 10


@pytest.fixture(params=["compiled", "interpreted"])
def interp(request):
    return interp_extrap if request.param == "compiled" else interpreted(interp_extrap)


@pytest.mark.parametrize("x,want", [
    (2.0, 15.0),  # inside the first segment: 10 + 5 * 1
    (5.0, 40.0),  # inside the second: 20 + 10 * 2
    (3.0, 20.0),  # on a point
    (7.0, 60.0),  # on the last point
    (0.5, 10.0),  # below the table: the first value, not extended
    (9.0, 80.0),  # beyond: the last segment's slope, 60 + 10 * 2
    (17.0, 160.0),  # far beyond: 60 + 10 * 10
])
def test_interpolation_inside_below_and_beyond(interp, x, want):
    assert interp(x, XS, YS) == want


def test_one_point_table_scales_through_the_origin(interp):
    xs, ys = np.array([4.0]), np.array([8.0])
    assert interp(6.0, xs, ys) == 12.0  # 8 * 6 / 4
    assert interp(2.0, xs, ys) == 4.0
    assert interp(4.0, xs, ys) == 8.0


# decode grid: batches 1 and 4 (rows), contexts 100 and 300 (columns)
#   batch 1: 1 at 100, 3 at 300 (slope 0.01);  batch 4: 4 at 100, 12 at 300 (slope 0.04)
BATCHES, CONTEXTS, GRID = np.array([1.0, 4.0]), np.array([100.0, 300.0]), np.array([1.0, 3.0, 4.0, 12.0])


@pytest.mark.parametrize("batch,context,want", [
    (1, 100.0, 1.0),  # corners
    (4, 300.0, 12.0),
    (4, 100.0, 4.0),
    (2, 200.0, 4.0),  # rows at 200: 2 and 8; batch 2 is a third of the way: 2 + 6 / 3
    (3, 300.0, 9.0),  # the last column: 3 + (12 - 3) * 2 / 3
    (2, 50.0, 2.0),  # below the contexts: each row's first value, 1 and 4; batch 2: 1 + 3 / 3
    (7, 500.0, 35.0),  # beyond both: rows at 500 are 3 + 0.01 * 200 = 5 and 12 + 0.04 * 200 = 20;
                       # batch 7 continues the last segment: 20 + (20 - 5) / 3 * 3
])
def test_bilinear_decode(batch, context, want):
    assert decode_seconds(batch, context, BATCHES, CONTEXTS, GRID) == pytest.approx(want, rel=1e-14)
    assert interpreted(decode_seconds)(batch, context, BATCHES, CONTEXTS, GRID) == \
        decode_seconds(batch, context, BATCHES, CONTEXTS, GRID)


def profile(path, prefill=True, gpu="a100-40gb", tp=1):
    """linear 1000 us at 10 tokens, 1500 at 20; the decode grid above in ms; prefill 200 us at
    10 tokens, 600 at 30; overhead 2000 us; measured on ``gpu`` at ``tp``."""
    common = dict(model="opt-13b", gpu=gpu, dtype="float16", tp=tp)
    rows = [dict(component="linear", num_tokens=n, batch=None, context=None, time_us=t, **common)
            for n, t in ((10, 1000.0), (20, 1500.0))]
    rows += [dict(component="attn_decode", num_tokens=None, batch=b, context=c, time_us=t, **common)
             for (b, c), t in zip(((1, 100), (1, 300), (4, 100), (4, 300)), (1000.0, 3000.0, 4000.0, 12000.0))]
    if prefill:
        rows += [dict(component="attn_prefill", num_tokens=n, batch=None, context=None, time_us=t, **common)
                 for n, t in ((10, 200.0), (30, 600.0))]
    rows.append(dict(component="overhead", num_tokens=None, batch=None, context=None, time_us=2000.0, **common))
    write_profile(rows, path)
    return str(path)


def table_model(tmp_path, prefill=True, **kw):
    return make_cost_model(get_model("opt-13b"), get_gpu("a100-40gb"), profile=profile(tmp_path / "p.csv", prefill),
                           **kw)


@pytest.mark.parametrize("model,refused", [("opt-13b", False), ("OPT-13B", False), ("llama-2-7b", True)])
def test_a_profile_prices_its_own_model_alone(tmp_path, model, refused):
    """The profile measured opt-13b (its ``model`` column): a run of opt-13b (its name in any case)
    takes it, a run of Llama-2-7B is refused in one line naming both."""
    path = profile(tmp_path / "p.csv")
    if not refused:
        assert make_cost_model(get_model(model), get_gpu("a100-40gb"), profile=path).path == path
        return
    with pytest.raises(ConfigError, match="the profile measured opt-13b, not llama-2-7b") as refusal:
        make_cost_model(get_model(model), get_gpu("a100-40gb"), profile=path)
    assert "\n" not in str(refusal.value)


@pytest.mark.parametrize("gpu, tp, taken", [
    ("a100-40gb", 1, None), ("A100-40GB", 1, None),
    ("a100-sxm4-40gb", 1, None),  # a device's own name (gpu calibrate's without --gpu-name): cannot tell
    ("a100-80gb", 1, "the profile was measured on a100-80gb, not a100-40gb"),
    ("a100-40gb", 2, "the profile was measured at TP 2, not --tp 1"),
])
def test_a_profile_prices_its_own_gpu_and_degree_alone(tmp_path, gpu, tp, taken):
    """The profile's ``gpu`` and ``tp`` columns: a run on that GPU (its name in any case) at that
    degree takes it; another GPU's times or another degree's shards are refused in one line."""
    path = profile(tmp_path / "p.csv", gpu=gpu, tp=tp)
    if taken is None:
        assert make_cost_model(get_model("opt-13b"), get_gpu("a100-40gb"), profile=path).path == path
        return
    with pytest.raises(ConfigError, match=taken) as refusal:
        make_cost_model(get_model("opt-13b"), get_gpu("a100-40gb"), profile=path)
    assert "\n" not in str(refusal.value)


def test_a_profile_of_two_degrees_prices_a_run_by_its_degrees_rows(tmp_path):
    """Rows at TP 1 and at TP 2 in one file (the TP 2 rows 3x the TP 1 ones): a run at TP 2 reads
    the TP 2 rows alone, at TP 1 the TP 1 rows, not the two degrees' rows together."""
    import pandas as pd

    rows = pd.read_csv(profile(tmp_path / "two.csv", tp=2))
    rows["time_us"] *= 3
    both = tmp_path / "both.csv"
    pd.concat([pd.read_csv(profile(tmp_path / "one.csv", tp=1)), rows]).to_csv(both, index=False)
    one_degree = len(make_cost_model(get_model("opt-13b"), get_gpu("a100-40gb"), 1,
                                     profile=str(tmp_path / "one.csv")).tables())
    for tp, linear_us in ((1, [1000.0, 1500.0]), (2, [3000.0, 4500.0])):
        tables = make_cost_model(get_model("opt-13b"), get_gpu("a100-40gb"), tp, profile=str(both)).tables()
        # the layout (sim.core.cost_table): the linear rows' tokens, then their times in seconds, ...
        assert len(tables) == one_degree and list(tables[:2]) == [10.0, 20.0]
        assert list(tables[2:4] * 1e6) == pytest.approx(linear_us)


def mixed_batch() -> StepBatch:
    """Two prompts (10 new tokens after none; 5 after 15 cached) and two decodes holding 400."""
    return StepBatch(prefill_seq_ids=np.array([0, 1]), prefill_tokens=np.array([10, 5]),
                     prefill_context=np.array([10, 20]), decode_seq_ids=np.array([2, 3]),
                     decode_context=np.array([150, 250]))


def test_table_step_by_hand(tmp_path):
    #   overhead                                     2000 us
    #   linear at 17 tokens: 1000 + 50 * 7           1350
    #   decode: batch 2 at mean context 200          4000
    #   prefill at contexts 10 and 20: 200 + 400      600
    assert table_model(tmp_path).step_time(mixed_batch()) == pytest.approx(7950e-6, rel=1e-12)
    # per-sequence overhead 0.1 ms x 4 sequences
    assert table_model(tmp_path, per_seq_overhead_ms=0.1).step_time(mixed_batch()) == pytest.approx(8350e-6,
                                                                                                    rel=1e-12)


def test_table_swap_and_copy_as_the_roofline(tmp_path):
    # one decode at context 100 (linear below the table: 1000; decode corner: 1000), plus
    # 16 tokens swapped (OPT-13B's 819,200 B over 25 GB/s PCIe: 32.768 us each) and 8 copied
    # (a read and a write at 1555e9 x 0.8 B/s: 2 x 0.658521 us each)
    b = StepBatch(decode_seq_ids=np.array([0]), decode_context=np.array([100]), swap_in_tokens=16, copy_tokens=8)
    want = 2000 + 1000 + 1000 + 16 * 32.768 + 16 * 0.658521
    assert table_model(tmp_path).step_time(b) == pytest.approx(want * 1e-6, rel=1e-6)


def test_table_without_prefill_rows_takes_the_roofline_prefill(tmp_path):
    # prompts of 512 and 256 tokens: linear beyond the table, 1500 + 50 * (768 - 20) = 38900;
    # prefill attention as the roofline prices it (tests/sim/test_cost.py): 860.370 us
    b = StepBatch(prefill_seq_ids=np.array([0, 1]), prefill_tokens=np.array([512, 256]),
                  prefill_context=np.array([512, 256]))
    assert table_model(tmp_path, prefill=False).step_time(b) == pytest.approx((2000 + 38900 + 860.370) * 1e-6,
                                                                              rel=1e-7)


def test_scaled_step_time_scales_the_gpu_time_only():
    # CPU 1 + 0.5 x 2 = 2; GPU 10 - 2 = 8, x3 = 24
    assert scaled_step_time(10.0, 3.0, 1.0, 0.5, 2) == 26.0
    assert interpreted(scaled_step_time)(np.array([10.0, 2.0]), 3.0, 1.0, 0.5, 2).tolist() == [26.0, 2.0]


def test_scaled_table_model_by_hand(tmp_path):
    # the mixed batch: CPU 2000 + 4 x 100 = 2400 us, GPU 1350 + 4000 + 600 = 5950 -> 2400 + 2 x 5950
    cm = table_model(tmp_path, per_seq_overhead_ms=0.1, cost_scale=2.0)
    assert cm.step_time(mixed_batch()) == pytest.approx(14300e-6, rel=1e-12)


@pytest.mark.parametrize("scale,want", [(1.0, [3.2e-3, 4e-3]), (2.0, [4.4e-3, 6e-3])])
def test_core_prices_a_run_by_hand(tmp_path, scale, want):
    # one request of 10 prompt tokens and 2 output tokens on the core:
    #   prefill: overhead 2 + linear(10) 1 + prefill(10) 0.2 = 3.2 ms; scaled: 2 + 2 x 1.2 = 4.4
    #   decode at context 11: 2 + linear(1) below the table 1 + decode below the grid 1 = 4 ms;
    #   scaled: 2 + 2 x 2 = 6
    trace = pd.DataFrame({"request_id": ["a"], "arrival_s": [0.0], "prompt_tokens": [10], "output_tokens": [2]})
    cfg = cfg_for(profile=profile(tmp_path / "p.csv", gpu="a100-80gb"), cost_scale=scale, per_seq_overhead_ms=0.0)
    r = run_simulation(cfg, trace)
    assert r.steps["dt_s"].to_numpy() == pytest.approx(want, rel=1e-12)


# three prompts (n new tokens after b cached) whose float terms n * (b + n / 2) sum to
# 157593599762635936 or ...968 depending on the order, and so the step to one of two times; the
# integer sum(n * (2b + n)) is 315187199525271911 whatever the order, half of it as a float
# 157593599762635968 (the nearest of its neighbours 32 apart)
HUGE_PROMPTS = [(189570197, 85031152), (149161433, 211275785), (249287805, 199748349)]
HALF_PAIRS = 157593599762635968.0


def test_the_prefill_pair_sum_is_exact_in_any_order():
    """The core prices prefill from half the integer pair sum, rounded once: three huge
    prompts in each of their orders give the same flop sum (sim.cost.roofline.prefill_sums) and the
    same step time from the core's loop (loop.step_time), that of the exact sum."""
    import itertools

    from pagesim.sim.core import state
    from pagesim.sim.core.events import loop
    from pagesim.sim.core.price.cost import roofline_step_time
    from pagesim.sim.cost.roofline import prefill_sums
    from pagesim.sim.run import initial_state
    from tests.sim.helpers import trace

    exact = sum(n * (2 * b + n) for n, b in HUGE_PROMPTS)
    assert exact == 315187199525271911 and float(exact) * 0.5 == HALF_PAIRS
    floats = {sum(n * (b + n * 0.5) for n, b in order) for order in itertools.permutations(HUGE_PROMPTS)}
    assert floats == {157593599762635936.0, HALF_PAIRS}  # a float sum would depend on the order
    s = initial_state(cfg_for(), trace([(0, 5, 5)] * 3))
    times = set()
    for order in itertools.permutations(HUGE_PROMPTS):
        new, before = np.array([n for n, _ in order]), np.array([b for _, b in order])
        assert prefill_sums(StepBatch(prefill_seq_ids=np.arange(3), prefill_tokens=new,
                                      prefill_context=new + before)) == (HALF_PAIRS, int(before.sum()))
        s.count[state.STEP_PREFILL_SEQS], s.count[state.STEP_PREFILL_TOKENS] = 3, new.sum()
        s.step_prefill_tokens[:3], s.step_prefill_context[:3] = new, new + before
        times.add(loop.step_time(s, 0, s.config[state.FAMILY_TRAITS]))
    want = roofline_step_time(s.cost, 3, int(sum(n for n, _ in HUGE_PROMPTS)), 0, 3, HALF_PAIRS,
                              int(sum(b for _, b in HUGE_PROMPTS)), 0, 0)
    assert times == {want}
