"""vLLM's measured CPU time per iteration (``sim/cost/cpu_overheads.py``): Vidur's table read and
fitted per TP degree, carried by the calibration file, charged by the calibrated model.

Tables are written by the tests from known lines, split over Vidur's columns, with the
columns Vidur does not add (the means of the median columns, the model execution) set to
values that would move the fit if they were read."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from pagesim.sim.config import SimConfig
from pagesim.sim.cost.calibration import Calibration, load_calibration
from pagesim.sim.cost.cpu_overheads import fit_cpu_overheads, read_cpu_overheads
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import run_simulation
from tests.sim.helpers import rand_trace, vidur_table


@pytest.mark.parametrize("upper", [False, True])
def test_fit_finds_the_lines_again(tmp_path, upper):
    fit = fit_cpu_overheads(read_cpu_overheads(vidur_table(tmp_path / "cpu.csv", upper=upper)))
    assert fit["tp"] == [1, 2]
    assert fit["fixed_s"] == pytest.approx([1.0e-3, 6.0e-3], rel=1e-9)
    assert fit["per_seq_s"] == pytest.approx([50e-6, 40e-6], rel=1e-9)
    assert fit["models"] == [["org/A", "org/B"]] * 2
    assert max(fit["max_error"]) < 1e-9


def test_an_iteration_by_hand(tmp_path):
    """One row: schedule 0.1 + sampler 0.3 + prepare 0.2 + outputs 0.4 medians + Ray 0.5 mean
    = 1.5 ms; the means, the Ray median and the model's execution are not CPU overhead."""
    table = read_cpu_overheads(vidur_table(tmp_path / "cpu.csv", lines=[(1, 1.5, 0.0, 0.5)]))
    assert table["cpu_ms"].iloc[0] == pytest.approx(0.1 + 0.3 + 0.2 + 0.4 + 0.5)


def test_a_missing_column_or_a_bad_value_is_one_line(tmp_path):
    df = pd.read_csv(vidur_table(tmp_path / "cpu.csv"), index_col=0)
    df.drop(columns=["sampler_e2e_median"]).to_csv(tmp_path / "missing.csv")
    with pytest.raises(ConfigError, match=r"missing.csv: no column 'sampler_e2e_median'"):
        read_cpu_overheads(tmp_path / "missing.csv")
    df.loc[3, "schedule_median"] = -1.0
    df.to_csv(tmp_path / "negative.csv")
    with pytest.raises(ConfigError, match=r"negative.csv: line 5: the CPU-time columns must be finite numbers >= 0"):
        read_cpu_overheads(tmp_path / "negative.csv")


def test_the_nearest_measured_degree_answers():
    cal = replace(load_calibration("a100-80gb"), cpu_tp=(1, 4), cpu_fixed_s=(1e-3, 8e-3), cpu_per_seq_s=(5e-5, 3e-5))
    assert cal.cpu_overhead(1) == (1e-3, 5e-5, 1)
    assert cal.cpu_overhead(4) == (8e-3, 3e-5, 4)
    assert cal.cpu_overhead(8) == (8e-3, 3e-5, 4)
    assert cal.cpu_overhead(2) == (1e-3, 5e-5, 1)  # as far from 1 as from 4 (x2): the lower
    assert cal.cpu_overhead(3)[2] == 4  # log2(3/1) = 1.58 > log2(4/3) = 0.42
    assert replace(cal, cpu_tp=(), cpu_fixed_s=(), cpu_per_seq_s=()).cpu_overhead(1) is None


def test_the_calibrated_model_charges_the_measured_cpu_time():
    """The shipped A100 file: TP 1 charges its measured line, not the roofline's 3 ms + 20 us."""
    fixed, per_seq, tp = load_calibration("a100-80gb").cpu_overhead(1)
    assert tp == 1 and 0.5e-3 < fixed < 2e-3 and 20e-6 < per_seq < 100e-6  # Vidur's A100: ~1 ms + ~50 us
    trace = rand_trace(0, n=20)
    r = run_simulation(SimConfig.for_system("vllm", model="llama-2-7b", gpu="a100-80gb", cost_model="calibrated"),
                       trace)
    assert r.summary["cpu_overhead"] == (f"{fixed * 1e3:.4g} ms + {per_seq * 1e6:.4g} us/sequence (vLLM's, "
                                         "measured on a100-80gb at TP 1 "
                                         "(Vidur; sim/cost/cpu_overheads.py))")
    one = r.steps.iloc[0]  # the first step: one prefill, priced CPU + GPU
    without = run_simulation(SimConfig.for_system("vllm", model="llama-2-7b", gpu="a100-80gb",
                                                  cost_model="calibrated", step_overhead_ms=0.0,
                                                  per_seq_overhead_ms=0.0), trace).steps.iloc[0]
    assert one["dt_s"] - without["dt_s"] == pytest.approx(fixed + per_seq * one["batch_size"], rel=1e-9)
    roof = run_simulation(SimConfig.for_system("vllm", model="llama-2-7b", gpu="a100-80gb"), trace)
    assert roof.summary["cpu_overhead"] == "3 ms + 20 us/sequence (the roofline's default (not measured))"
    set_by_hand = run_simulation(SimConfig.for_system("vllm", model="llama-2-7b", gpu="a100-80gb",
                                                      cost_model="calibrated", step_overhead_ms=2.0), trace)
    assert set_by_hand.summary["cpu_overhead"].endswith("(set by --step-overhead-ms / --per-seq-overhead-ms)")


def test_a_gpu_without_cpu_measurements_keeps_the_roofline_default():
    cal = load_calibration("h100-80gb")
    assert cal.cpu_overhead(1) is None
    r = run_simulation(SimConfig.for_system("vllm", model="llama-2-7b", gpu="h100-80gb", cost_model="calibrated"),
                       rand_trace(0, n=5))
    assert r.summary["cpu_overhead"] == ("3 ms + 20 us/sequence (the roofline's default: no CPU time measured "
                                         "on h100-80gb)")


def test_calibration_files_round_trip_with_and_without_cpu_lines(tmp_path):
    cal = load_calibration("a100-80gb")
    assert cal.cpu_tp == (1, 2, 4)
    (tmp_path / "with.toml").write_text(cal.to_toml())
    assert Calibration.from_toml(tmp_path / "with.toml") == cal
    bare = replace(cal, cpu_tp=(), cpu_fixed_s=(), cpu_per_seq_s=())
    text = bare.to_toml()
    assert "cpu_tp" not in text  # optional: files of GPUs without CPU measurements leave them out
    (tmp_path / "bare.toml").write_text(text)
    assert Calibration.from_toml(tmp_path / "bare.toml") == bare
    (tmp_path / "uneven.toml").write_text(cal.to_toml().replace("cpu_tp = [1, 2, 4]", "cpu_tp = [1, 2]"))
    with pytest.raises(ConfigError, match="cpu_tp, cpu_fixed_s, cpu_per_seq_s must have the same length"):
        Calibration.from_toml(tmp_path / "uneven.toml")
