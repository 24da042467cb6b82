"""The 2023 engines' GPU-time factor (experiments/engine_era.py): how a config names it, what it
was fitted on, and that its file is what the fit's command gives."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from pagesim.experiments import engine_era, paper
from pagesim.experiments.run_spec import load_experiment, spec_from_settings
from pagesim.sim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
#: the vLLM paper's figures that read time (the memory figures 2 and 15 keep the roofline's speed)
TIMED = ("fig12", "fig13", "fig14", "fig16", "fig17", "fig18b", "fig19")


def fit_script():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_engine_era
    return fit_engine_era


def test_engine_era_in_a_config_is_the_factor_of_the_runs_cost_model():
    """``cost_scale = "engine-era"`` becomes the file's factor for the run's cost model (the
    roofline where none is named), whatever else the run sets; a number stays a number."""
    scales = engine_era.load()["scale"]
    assert spec_from_settings({"cost_scale": "engine-era"}).sim["cost_scale"] == scales["roofline"]
    calibrated = spec_from_settings({"cost_scale": "engine-era", "cost_model": "calibrated"})
    assert calibrated.sim["cost_scale"] == scales["calibrated"] != scales["roofline"]
    assert spec_from_settings({"cost_scale": 1.0}).sim["cost_scale"] == 1.0
    with pytest.raises(ConfigError, match="no engine-era factor for --cost-model table"):  # a measured profile
        spec_from_settings({"cost_scale": "engine-era", "profile": "measured.csv"})
    # a system's own default cost model where none is named: vLLM v1's is the one fitted on
    # today's runs (serving), which has no 2023 factor
    with pytest.raises(ConfigError, match="no engine-era factor for --cost-model serving"):
        spec_from_settings({"cost_scale": "engine-era", "system": "vllm-v1"})


def test_the_vllm_papers_timed_figures_take_the_factor_and_the_figure_it_was_fitted_on_does_not():
    for name in TIMED:
        assert load_experiment(name)["base"]["cost_scale"] == engine_era.ENGINE_ERA, name
    for name in ("fig2", "fig2_sensitivity", "fig15", "distserve", "hybrid"):
        assert "cost_scale" not in load_experiment(name)["base"], name
    # Fig. 13 prints the cost model's own speed beside it: the test of its reading's cause
    assert load_experiment("fig13")["grid"]["cost_scale"] == [engine_era.ENGINE_ERA, 1.0]


def test_the_fit_scores_a_curve_by_the_root_mean_square_over_the_measured_rates():
    """By hand: ours 0.9 and 0.8 at rates 1 and 2 against 1.0, 0.8 and 0.5 at 1, 2 and 3: the
    rates both have, sqrt((0.1^2 + 0^2) / 2) = 0.0707."""
    fit = fit_script()
    assert fit.rms({1.0: 0.9, 2.0: 0.8}, {1.0: 1.0, 2.0: 0.8, 3.0: 0.5}) == pytest.approx(math.sqrt(0.005))
    assert fit.rms({1.0: 0.5}, {1.0: 0.5}) == 0.0


def test_the_file_was_fitted_on_the_artifacts_measured_vllm():
    """The measured curve in the file is the DistServe artifact's vLLM (paper_numbers.csv's
    distserve rows) and nothing else; each factor is its fit's, inside the grid searched."""
    data = engine_era.load()
    theirs = paper.distserve_paper_curve()
    theirs = theirs[theirs["design"] == "colocated"].sort_values("per_gpu_rate")
    fit = fit_script()
    for cost_model, scale in data["scale"].items():
        found = engine_era.fit(cost_model)
        assert found["per_gpu_rate"] == pytest.approx(theirs["per_gpu_rate"].tolist())
        assert found["measured"] == pytest.approx(theirs["slo_attainment"].tolist())
        assert fit.LOW <= scale <= fit.HIGH
        # the fitted curve's own error, as written
        ours = dict(zip(found["per_gpu_rate"], found["slo_attainment"]))
        measured = dict(zip(found["per_gpu_rate"], found["measured"]))
        assert fit.rms(ours, measured) == pytest.approx(found["rms"], rel=1e-4)
        # a CPU cost alone fits worse than the GPU time's factor
        assert all(v["rms"] > found["rms"] for v in found["alternatives"].values())


@pytest.mark.parametrize("cost_model", ["roofline", "calibrated"])
def test_the_fitted_curve_is_what_the_colocated_runs_give_at_the_factor(tmp_path, cost_model):
    """Each cost model's curve in the file is the ``distserve`` figure's colocated runs at its
    factor, run again here (24 runs of 100 requests a replica: a few seconds)."""
    from pagesim.experiments.figures.common import SweepOptions

    found = engine_era.fit(cost_model)
    opts = SweepOptions(workers=1, cache_dir=tmp_path, progress=False)
    curve = fit_script().colocated_curve(opts, cost_model=cost_model, cost_scale=found["scale"])
    assert [curve[r] for r in found["per_gpu_rate"]] == pytest.approx(found["slo_attainment"], abs=1e-6)
