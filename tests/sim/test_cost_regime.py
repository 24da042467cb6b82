"""The serving model's band by regime (sim/cost/regime.py), worked by hand on a small regimes
file; and the shipped regimes file checked against the fitted constants file it was written from."""

from __future__ import annotations

from pathlib import Path

import pytest
from pagesim.experiments.real_validate import replay_config
from pagesim.sim.config import read_toml
from pagesim.sim.cost.calibration import gpu_time_scales
from pagesim.sim.cost.regime import (METRICS, REGIMES_PATH, load_regimes, model_table, regime_band, statistics,
                                     widest)
from pagesim.sim.cost.serving import serving_path
from pagesim.sim.specs import get_model
from pagesim.traces.real_runs import read_real_runs

ROOT = Path(__file__).resolve().parents[2]

HAND = """
[fitted]
max_num_seqs = 128
scheduler = "vllm-v1"
engine = "vLLM 0.33.0 (v1)"

[regimes.dense]
method = "leave-one-model-out"
gpu = "h100-80gb"
runs = ["a", "b", "c", "d", "e"]
e2e = [-0.3, -0.1, 0.0, 0.1, 0.2]
ttft = [0.0, 0.0, 0.0, 0.0, 0.0]
tpot = [0.1, 0.1, 0.1, 0.1, 0.1]

[regimes.moe]
method = "leave-one-model-out"
gpu = "h100-80gb"
runs = ["m1", "m2"]
e2e = [-0.5, -0.1]
ttft = [-0.2, -0.2]
tpot = [-0.4, 0.0]

[regimes.held_out_gpu]
method = "leave-one-GPU-out"
gpu = "rtx-4090"
runs = ["g1", "g2"]
e2e = [0.0, 0.4]
ttft = [0.1, 0.1]
tpot = [0.0, 0.0]
"""


@pytest.fixture
def hand(tmp_path):
    path = tmp_path / "regimes.toml"
    path.write_text(HAND)
    load_regimes.cache_clear()
    yield path
    load_regimes.cache_clear()


def test_statistics_by_hand():
    s = statistics({"e2e": [-0.3, -0.1, 0.0, 0.1, 0.2], "ttft": [0.0] * 5, "tpot": [0.1] * 5})
    # |e| sorted 0, .1, .1, .2, .3: median .1; p90 at rank 3.6: .2 + .6 x .1
    assert s["median"] == pytest.approx(0.1) and s["p90"] == pytest.approx(0.26)
    # signed sorted -.3, -.1, 0, .1, .2: 10th at rank .4: -.3 + .4 x .2; 90th at 3.6: .1 + .6 x .1
    assert s["low"] == pytest.approx(-0.22) and s["high"] == pytest.approx(0.16)
    assert s["tpot_median"] == pytest.approx(0.1) and s["ttft_low"] == 0.0


def test_runs_by_gpu_and_model_by_hand(hand, tmp_path):
    """The hand file with its runs' GPUs and models: dense runs a-c of model x, d-e of y, all on
    the H100 (held out by model); moe's m1-m2 of z; held_out_gpu's g1 and g2 of x on an RTX 4090
    (held out by GPU), grouped apart from x on the H100. Without the columns: no table."""
    assert model_table(hand) == []
    h100 = ", ".join(['"h100-80gb"'] * 5)
    text = HAND.replace('runs = ["a", "b", "c", "d", "e"]',
                        f'runs = ["a", "b", "c", "d", "e"]\ngpus = [{h100}]\nmodels = ["x", "x", "x", "y", "y"]\n'
                        'held_out = "model"')
    text = text.replace('runs = ["m1", "m2"]', 'runs = ["m1", "m2"]\ngpus = ["h100-80gb", "h100-80gb"]\n'
                        'models = ["z", "z"]\nheld_out = "model"')
    text = text.replace('runs = ["g1", "g2"]', 'runs = ["g1", "g2"]\ngpus = ["rtx-4090", "rtx-4090"]\n'
                        'models = ["x", "x"]\nheld_out = "GPU"')
    path = tmp_path / "named.toml"
    path.write_text(text)
    rows = {(r["gpu"], r["model"]): r for r in model_table(path)}
    assert list(rows) == [("h100-80gb", "x"), ("h100-80gb", "y"), ("h100-80gb", "z"), ("rtx-4090", "x")]
    x = rows[("h100-80gb", "x")]  # E2E -0.3, -0.1, 0: |e| median 0.1; TPOT 0.1 each
    assert (x["runs"], x["held_out"], x["e2e"], x["tpot"]) == (3, "model", pytest.approx(0.1), pytest.approx(0.1))
    assert (x["e2e_low"], x["e2e_high"]) == (-0.3, 0.0)
    y = rows[("h100-80gb", "y")]  # E2E 0.1, 0.2
    assert (y["e2e"], y["e2e_low"], y["e2e_high"]) == (pytest.approx(0.15), 0.1, 0.2)
    z = rows[("h100-80gb", "z")]  # E2E -0.5, -0.1; TPOT -0.4, 0
    assert (z["e2e"], z["tpot"], z["ttft"]) == (pytest.approx(0.3), pytest.approx(0.2), pytest.approx(0.2))
    g = rows[("rtx-4090", "x")]
    assert (g["held_out"], g["runs"], g["e2e"], g["e2e_high"]) == ("GPU", 2, pytest.approx(0.2), 0.4)


def test_widest_takes_each_side_apart():
    w = widest([{"median": 0.1, "p90": 0.3, "low": -0.2, "high": 0.1},
                {"median": 0.2, "p90": 0.25, "low": -0.1, "high": 0.3}])
    assert w == {"median": 0.2, "p90": 0.3, "low": -0.2, "high": 0.3}


def test_a_dense_model_on_the_fitted_gpu_is_the_dense_runs_alone(hand):
    band = regime_band("h100-80gb", "h100-80gb", False, moe=False, scheduler="vllm-v1", max_num_seqs=128, path=hand)
    assert band["regime_sets"] == ["dense"] and band["runs"] == 5
    assert band["low"] == pytest.approx(-0.22)
    assert band["regime"] == ["dense models: 5 runs on h100-80gb, leave-one-model-out"]


def test_a_mixture_of_experts_takes_the_moe_runs(hand):
    band = regime_band("h100-80gb", "h100-80gb", False, moe=True, path=hand)
    # e2e -.5, -.1: |e| median .3; signed 10th -.5 + .1 x .4 = -.46, 90th -.5 + .9 x .4 = -.14
    assert band["regime_sets"] == ["moe"]
    assert band["median"] == pytest.approx(0.3) and band["low"] == pytest.approx(-0.46)
    assert band["high"] == pytest.approx(-0.14)


def test_an_unfitted_gpu_widens_with_the_held_out_gpus(hand):
    band = regime_band("a100-80gb", "h100-80gb", False, moe=False, path=hand)
    assert band["regime_sets"] == ["dense", "held_out_gpu"] and band["runs"] == 7
    # held out: e2e 0, .4 -> median .2, p90 .36, 10th .04, 90th .36; dense's -.22 stays the low side
    assert band["median"] == pytest.approx(0.2) and band["p90"] == pytest.approx(0.36)
    assert band["low"] == pytest.approx(-0.22) and band["high"] == pytest.approx(0.36)
    assert "a100-80gb: no fitted run; the band takes 2 runs on GPUs held out of the fit too" in band["regime"][1]


def test_the_same_chip_keeps_the_fitted_band_and_says_so(hand):
    band = regime_band("h200-141gb", "h100-80gb", True, moe=False, path=hand)
    assert band["regime_sets"] == ["dense"]
    assert band["regime"][1] == "h200-141gb: no run of its own; the band is h100-80gb's (the same chip)"


def test_what_has_no_run_says_so(hand, tmp_path):
    band = regime_band("h100-80gb", "h100-80gb", False, moe=False, scheduler="sglang", max_num_seqs=256,
                       engine="SGLang 0.5", path=hand)
    assert band["regime"][1:] == [
        "batches up to 256 sequences: beyond the 128 of every fitted run, extrapolated (no real run)",
        "no real run of SGLang 0.5 was measured: the band is vLLM 0.33.0 (v1)'s"]
    assert len(regime_band("h100-80gb", "h100-80gb", False, moe=False, max_num_seqs=128, path=hand)["regime"]) == 1
    bare = tmp_path / "bare.toml"
    bare.write_text(HAND.split("[regimes.held_out_gpu]")[0])
    band = regime_band("a100-80gb", "h100-80gb", False, moe=False, path=bare)
    assert band["regime_sets"] == ["dense"]
    assert band["regime"][1] == ("a100-80gb: no fitted run, and no run on a GPU held out of the fit: the band is "
                                 "h100-80gb's")
    assert regime_band("h100-80gb", "h100-80gb", False, path=tmp_path / "absent.toml") is None


def test_an_expert_parallel_answer_takes_the_runs_that_split_their_experts(hand, tmp_path):
    """The runs flagged expert_parallel, wherever their regime, join the answer's sets; none: said."""
    split = tmp_path / "split.toml"
    split.write_text(HAND.replace('runs = ["g1", "g2"]', 'runs = ["g1", "g2"]\ngpus = ["rtx-4090", "l40s"]\n'
                                  'expert_parallel = [false, true]'))
    band = regime_band("h100-80gb", "h100-80gb", False, moe=True, path=split, expert_parallel=True)
    # the moe runs (e2e -.5, -.1) and g2 (e2e .4): the widest of each side
    assert band["regime_sets"] == ["moe", "expert_parallel"] and band["runs"] == 3
    assert band["median"] == pytest.approx(0.4) and band["high"] == pytest.approx(0.4)
    assert band["low"] == pytest.approx(-0.46)
    assert band["regime"][1] == "expert parallel: 1 real run (l40s); the band takes it"
    band = regime_band("h100-80gb", "h100-80gb", False, moe=True, path=hand, expert_parallel=True)
    assert band["regime_sets"] == ["moe"]
    assert band["regime"][1] == "expert parallel: no real run; the band is the mixture of experts' without it"


def test_gpu_time_scales():
    # signed: real = sim / (1 + e); -.2 -> x 1.25, +.25 -> x .8
    assert gpu_time_scales({"low": -0.2, "high": 0.25, "p90": 0.3}) == pytest.approx([1.25, 0.8])
    # too fast everywhere: the fast side stays at the answer itself
    assert gpu_time_scales({"low": -0.5, "high": -0.1, "p90": 0.5}) == pytest.approx([2.0, 1.0])
    assert gpu_time_scales({"p90": 0.1}) == pytest.approx([1.1, 0.9])
    assert gpu_time_scales({"p90": 1.5}) is None and gpu_time_scales("uncalibrated: x") is None


def fitted_runs():
    facts = ROOT / "experiments" / "data" / "real_runs_h100.csv"
    return [r for r in read_real_runs(facts) if r.info.get("gpu") == "h100-80gb"]


def test_the_shipped_regimes_are_the_fitted_files_held_out_errors():
    """regimes.toml (benchmarks/serving_bands.py) holds each fitting run's held-out errors as the
    constants file states them, split by the run's model kind; rerun the script after a fit."""
    data = read_toml(REGIMES_PATH, "serving regimes")
    err = read_toml(serving_path(data["provenance"]["fitted_on"]), "serving constants")["error"]
    regimes = data["regimes"]
    runs = fitted_runs()
    assert sorted(regimes["dense"]["runs"] + regimes["moe"]["runs"]) == sorted(r.name for r in runs)
    for run in runs:
        kind = "moe" if get_model(replay_config(run, "h100-80gb").model).moe is not None else "dense"
        i = regimes[kind]["runs"].index(run.name)
        assert [regimes[kind][m][i] for m in METRICS] == [err[f"{run.name}.{m}_mean"] for m in METRICS]
    assert data["fitted"]["max_num_seqs"] == max(int(r.engine["max_num_seqs"]) for r in runs)
    assert {data["fitted"]["scheduler"]} == {replay_config(r, "h100-80gb").scheduler for r in runs}


def test_the_held_out_gpu_runs_replay_as_shipped():
    """LLMServingSim's runs, replayed from their shipped fact and per-request tables with the
    shipped constants, give the errors regimes.toml keeps (rerun benchmarks/serving_bands.py
    after a change of the model)."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from serving_bands import HELD_OUT, held_out_gpu_runs

    held, gpus = held_out_gpu_runs([HELD_OUT])
    shipped = read_toml(REGIMES_PATH, "serving regimes")["regimes"]["held_out_gpu"]
    assert list(held) == shipped["runs"] and ", ".join(gpus) == shipped["gpu"]
    for i, (errors, gpu, model, split) in enumerate(held.values()):
        assert errors == pytest.approx([shipped[m][i] for m in METRICS], abs=1e-5)
        assert (gpu, model, split) == (shipped["gpus"][i], shipped["models"][i], shipped["expert_parallel"][i])


def test_cost_bands_prints_every_regime(capsys, monkeypatch):
    import json

    from pagesim.sim import cost
    from pagesim.sim.cli import main
    from pagesim.sim.cost.regime import regime_table

    assert main(["cost", "bands", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == regime_table() and list(rows) == ["dense", "moe", "held_out_gpu"]
    assert main(["cost", "bands"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:3] == ["dense", "12", f"{100 * rows['dense']['median']:.1f}"]
    assert out.splitlines()[3].startswith("held-out-gpu")
    lines = out.splitlines()
    by_model = lines[lines.index("by GPU and model") + 2:]
    assert by_model[0].split()[:5] == ["h100-80gb", "llama-2-7b", "4", "by", "model"]
    assert any(line.split()[:4] == ["rtx-4090", "llama-3.1-8b", "1", "by"] for line in by_model)
    assert max(len(line) for line in lines) <= 100
    monkeypatch.setattr(cost.regime, "load_regimes", lambda path=None: {})
    assert main(["cost", "bands"]) == 2
    assert "no regimes; run benchmarks/serving_bands.py" in capsys.readouterr().err


def test_a_band_of_gpu_timings_says_no_serving_run_measured_it():
    from pagesim.sim.config import SimConfig
    from pagesim.sim.cost.calibration import describe_band, run_error_band

    band = run_error_band(SimConfig.for_system("vllm", gpu="h100-80gb"))
    assert band["cost_model"] == "roofline"
    assert band["cost_error"]["regime"] == ["no real serving run of vLLM 0.4.2 (v0) measured it end to end"]
    assert describe_band(band, "h100-80gb").endswith("; no real serving run of vLLM 0.4.2 (v0) measured it end to end)")
    assert gpu_time_scales(band["cost_error"]) == pytest.approx([1 + band["cost_error"]["p90"],
                                                                 1 - band["cost_error"]["p90"]])
    sglang = run_error_band(SimConfig.for_system("sglang", gpu="h100-80gb", max_num_seqs=128))["cost_error"]
    assert sglang["regime"][-1].startswith("no real run of SGLang 0.5 was measured")
