"""A bare ``simulate`` or ``plan`` (none of --system, --model, --gpu, by flag or --config) runs vLLM
v1 on Llama-3.1-8B on an H100-80GB and says so in its first line; naming any of them keeps the
others at SimConfig's defaults, the vLLM paper's (OPT-13B, A100-40GB, vLLM 0.4.2), which
``reproduce`` keeps whatever happens (sim/args.py: TODAYS_DEFAULTS)."""

from __future__ import annotations

import json

from pagesim.sim.args import TODAYS_DEFAULTS, defaults_line, take_todays_defaults
from pagesim.sim.cli import build_parser, main
from pagesim.sim.config import SimConfig

LINE = "defaults: vllm-v1, llama-3.1-8b on h100-80gb (--system/--model/--gpu to change)"


def simulate(capsys, *argv):
    rc = main(["simulate", "--num-requests", "20", "--rate", "4", "--no-progress", "--json", *argv])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out), err


def test_a_bare_simulate_runs_todays_defaults_and_says_so_first(capsys):
    assert TODAYS_DEFAULTS == {"system": "vllm-v1", "model": "llama-3.1-8b", "gpu": "h100-80gb"}
    summary, err = simulate(capsys)
    assert (summary["system"], summary["model"], summary["gpu"]) == ("vllm-v1", "llama-3.1-8b", "h100-80gb")
    assert err.splitlines()[0] == LINE and len(LINE) <= 100
    assert main(["simulate", "--num-requests", "20", "--rate", "4", "--no-progress"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == LINE  # at the top of what it prints


def test_a_flag_or_the_config_file_keeps_the_papers_defaults_for_the_rest(capsys, tmp_path):
    summary, err = simulate(capsys, "--model", "opt-13b")
    assert (summary["system"], summary["model"], summary["gpu"]) == ("vllm", "opt-13b", "a100-40gb")
    assert "defaults:" not in err
    summary, err = simulate(capsys, "--system", "vllm-v1", "--gpu", "a100-80gb")
    assert (summary["system"], summary["model"], summary["gpu"]) == ("vllm-v1", "opt-13b", "a100-80gb")
    toml = tmp_path / "run.toml"
    toml.write_text('gpu = "h200-141gb"\n')
    summary, err = simulate(capsys, "--config", str(toml))
    assert (summary["system"], summary["model"], summary["gpu"]) == ("vllm", "opt-13b", "h200-141gb")
    assert "defaults:" not in err


def test_a_bare_plan_takes_them_too_and_compare_gpus_keeps_its_gpus():
    args = build_parser("plan").parse_args(["plan", "--slo-ttft-p99", "2"])
    from pagesim.experiments.plan_cli import DEFAULT_SYSTEMS
    taken = take_todays_defaults(args, system_given=args.systems is not DEFAULT_SYSTEMS)
    assert taken == TODAYS_DEFAULTS and (args.model, args.gpu) == ("llama-3.1-8b", "h100-80gb")
    assert defaults_line(taken, "--systems") == LINE.replace("--system/", "--systems/")
    args = build_parser("plan").parse_args(["plan", "--systems", "vllm", "--slo-ttft-p99", "2"])
    assert take_todays_defaults(args, system_given=args.systems is not DEFAULT_SYSTEMS) == {}
    assert (args.model, args.gpu) == (None, None)
    args = build_parser("plan").parse_args(["plan", "compare-gpus", "--gpus", "a100-80gb,h100-80gb",
                                            "--slo-ttft-p99", "2"])
    taken = take_todays_defaults(args, system_given=False, skip=("gpu",))
    assert defaults_line(taken, "--systems") == "defaults: vllm-v1, llama-3.1-8b (--systems/--model to change)"
    assert args.gpu is None


def test_a_bare_compare_gpus_checks_no_gpu_it_does_not_compare(capsys):
    """A bare ``plan compare-gpus`` prices each GPU it names, never the paper's A100-40GB (its
    configuration's GPU before each is set): 50 GiB of KV fit on an H100-80GB, not on an
    A100-40GB, and the plan runs."""
    argv = ["plan", "compare-gpus", "--gpus", "h100-80gb", "--kv-gib", "50", "--duration", "5", "--json",
            "--no-error-band", "--no-progress", "--workers", "1"]
    assert main(argv) == 0, capsys.readouterr().err
    plan = json.loads(capsys.readouterr().out)
    assert "a100-40gb" not in json.dumps(plan)


def test_reproduce_keeps_the_papers_defaults():
    from pagesim.experiments.figures.common import figure_specs

    assert (SimConfig().system, SimConfig().model, SimConfig().gpu) == ("vllm", "opt-13b", "a100-40gb")
    configs = [spec.sim_config() for spec in figure_specs("fig2", quick=True, scale=1.0)]
    assert {(c.model, c.gpu) for c in configs} == {("opt-13b", "a100-40gb")}
    assert "vllm" in {c.system for c in configs} and "vllm-v1" not in {c.system for c in configs}


def test_a_manager_or_scheduler_named_keeps_the_papers_defaults(capsys):
    """--manager or --scheduler names what runs, as --system does: the rest stay the paper's."""
    summary, err = simulate(capsys, "--manager", "contiguous", "--scheduler", "orca")
    assert (summary["model"], summary["gpu"]) == ("opt-13b", "a100-40gb") and "defaults:" not in err


def test_plan_takes_the_config_files_system(capsys, tmp_path):
    """``system = "orca-max"`` in plan's --config plans orca-max (it planned vLLM, the file's line
    dropped); --systems on the command line wins over the file, as every flag does."""
    toml = tmp_path / "plan.toml"
    toml.write_text('system = "orca-max"\n')
    argv = ["plan", "--duration", "5", "--workers", "1", "--no-progress", "--no-error-band", "--model", "llama-2-7b",
            "--gpu", "a100-80gb", "--config", str(toml), "--json"]
    assert main(argv) == 0
    assert [a["system"] for a in json.loads(capsys.readouterr().out)["answers"]] == ["orca-max"]
    assert main([*argv, "--systems", "vllm"]) == 0
    assert [a["system"] for a in json.loads(capsys.readouterr().out)["answers"]] == ["vllm"]
