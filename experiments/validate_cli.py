"""``pagesim validate``: how far the simulator is from a real run, in either of two ways.

- ``--against PATH`` (no GPU): a real serving run (an inference-perf run folder, an
  LLMServingSim vLLM run folder, or a ``vllm bench serve --save-result --save-detailed`` JSON,
  an older ``benchmark_serving.py --save-result`` one too) replayed on the simulator with the
  run's own engine settings and workload; prints measured vs simulated TTFT, TPOT, ITL, E2E and
  requests per second, per stage and overall, with sim / real - 1 (``experiments/real_validate.py``).
- Without it: a trace run on the GPU for real through the simulator's own scheduler and block
  tables, and simulated beside it (``gpu/validate_cli.py``; needs CUDA, or ``--backend fake``).

It lives at the top of the layers because ``--against`` joins a trace reader (``traces``), the
simulator (``sim``) and a run's comparison."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pagesim.gpu import validate_cli as gpu_validate
from pagesim.sim.args import SIM_FLAGS, take_page_size
from pagesim.sim.cli import HelpFormatter, example
from pagesim.sim.cost.calibration import band_line, run_error_band
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import jsonable
from pagesim.sim.terminal import fill


def register(sub) -> None:
    p = sub.add_parser(
        "validate", help="compare the simulator with a real serving run (--against), or run a trace on the GPU",
        formatter_class=HelpFormatter, description=__doc__.split("\n\n", 1)[1].split("\n\nIt lives")[0],
        epilog=example(
            "pagesim validate --against real_runs_h100 --run llama-2-7b-tp1-general",
            "pagesim validate --against published_throughput",
            "pagesim validate --against training/default_args/20260217-231439-llama-2-7b-tp1-general --gpu h100-80gb",
            "pagesim validate --against bench.json --gpu h100-80gb --tp 1 --max-num-seqs 256",
            *gpu_validate.EXAMPLES))
    workload, gpu_run = gpu_validate.add_arguments(p)
    r = p.add_argument_group("a real run (--against)")
    r.add_argument("--against", metavar="PATH",
                   help="an inference-perf run folder (results/config.yaml, results/*_lifecycle_metrics.json, "
                        "exp-config.yaml), an LLMServingSim vLLM run folder (meta.json, requests.jsonl), a vllm "
                        "bench serve --save-detailed JSON, or a fact table of runs (CSV; the shipped ones by name: "
                        "real_runs_h100, 16 vLLM runs on H100; llmservingsim_runs, LLMServingSim's vLLM runs on "
                        "RTX GPUs, their requests beside them; published_throughput, vLLM's and SGLang's published "
                        "offline throughput on ShareGPT): replay and compare")
    r.add_argument("--run", metavar="TEXT", help="of a fact table, only the runs whose name holds TEXT")
    p.set_defaults(func=run, _refused_with_against=(workload, gpu_run))


def refused_flags(args: argparse.Namespace) -> list[str]:
    """The workload and GPU-run flags ``args`` sets away from their defaults: ``--against`` takes
    its workload from the run and runs no GPU, so each would be ignored (``--seed`` is kept: it
    draws the replay's arrivals and prompt order)."""
    return [action.option_strings[0] for group in args._refused_with_against for action in group._group_actions
            if action.dest != "seed" and getattr(args, action.dest, None) != action.default]


def run(args: argparse.Namespace) -> int:
    if not args.against:
        return gpu_validate.run(args)
    from pagesim.experiments.real_validate import error_lines, parallel_layout, replay_config, validate_run
    from pagesim.sim.specs import get_model
    from pagesim.traces.real_runs import read_real_runs

    refused = refused_flags(args)
    if refused:
        raise ConfigError(f"--against replays the run's own workload on the simulator: drop {', '.join(refused)}")
    runs = read_real_runs(shipped_table(args.against))
    if args.run:
        runs = [r for r in runs if args.run in r.name]
        if not runs:
            raise ConfigError(f"--run {args.run}: no run of {args.against} has it in its name")
    take_page_size(args)
    settings = {name: getattr(args, name, None) for name in SIM_FLAGS}
    settings["system"] = args.system
    if args.check:
        settings["check"] = True
    gpu = settings.pop("gpu")
    if len(runs) > 1:
        return run_many(args, runs, gpu, settings)
    real = runs[0]
    cfg = replay_config(real, gpu, settings)
    v = validate_run(real, cfg, seed=args.seed, progress=args.progress and not args.json)
    report = {"run": real.source, "format": real.fmt, "config": cfg.to_dict(), "unfinished": v.unfinished,
              "rejected": v.rejected, "errors": v.errors().to_dict(orient="records")}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "validation.json").write_text(json.dumps(jsonable(report), indent=2) + "\n")
        v.result.save(out / "sim")
    if args.json:
        print(json.dumps(jsonable(report)))
        return 0
    stages = f", {real.num_stages} stages" if real.num_stages > 1 else ""
    if "count" in real.measured["overall"] or "num_prompts" not in real.workload:
        counted = f"{int(real.measured['overall'].get('count', 0)):,} requests measured"
    else:  # a published summary states what was sent, not a count (traces.sharegpt_sample)
        counted = f"{int(real.workload['num_prompts']):,} prompts sent"
    print(fill(f"{real.name} ({real.fmt}{stages}, {counted})", first="real run   ", rest=" " * 11))
    print(fill(f"{cfg.system} on {cfg.gpu}, {parallel_layout(real, cfg)}, {cfg.model}", first="replayed   ",
               rest=" " * 11))
    max_len = (f"{cfg.max_seq_len}" if cfg.max_seq_len is not None
               else f"{get_model(cfg.model).max_seq_len} (the model's)")
    print(f"           max_num_seqs {cfg.max_num_seqs}, max_num_batched_tokens {cfg.max_num_batched_tokens}, "
          f"max_model_len {max_len}")
    table = f"{Path(args.out) / 'sim' / 'requests.csv'}" if args.out else "--out DIR keeps the request table"
    if v.rejected:
        print(fill(f"rejected   {v.rejected:,} requests, each with its reason (a client's timeout: --client-timeout; "
                   f"{table})", rest=" " * 11))
    if v.unfinished:
        print(fill(f"unfinished {v.unfinished:,} requests the simulation did not finish ({table})", rest=" " * 11))
    print()
    for line in error_lines(v):
        print(line)
    print("\nerror = sim / real - 1 of each statistic; ITL = a scope's token gaps pooled")
    print(run_band_line(cfg))
    if args.out:
        print(fill(f"wrote {Path(args.out) / 'validation.json'} and the simulation's files in {Path(args.out) / 'sim'}"))
    return 0


def shipped_table(against: str) -> str:
    """``against``, or the shipped fact table it names (``real_runs_h100``: experiments/data/)
    where no such file exists."""
    shipped = Path(__file__).resolve().parent / "data" / f"{against}.csv"
    return str(shipped) if not Path(against).exists() and "/" not in against and shipped.exists() else against


def run_band_line(cfg) -> str:
    """The cost model that ran and its measured error band, wrapped to 100 columns."""
    return band_line(run_error_band(cfg), cfg.gpu)


def run_many(args: argparse.Namespace, runs, gpu: str | None, settings: dict) -> int:
    """Every run of a fact table replayed: a row per run (its whole-run means), and the medians.
    A run whose settings the replay refuses (32-bit weights; a cost model that does not price its
    expert parallelism) is left out in one line on stderr; where every run is refused, the first
    refusal is the error."""
    import pandas as pd

    from pagesim.experiments.real_validate import replay_config, runs_table_lines, validate_run

    frames, configs, refused, replayed = [], [], [], []
    for real in runs:
        try:
            cfg = replay_config(real, gpu, settings)
            v = validate_run(real, cfg, seed=args.seed)
        except ConfigError as e:
            refused.append(e)
            print(fill(f"{real.name}: {e}", first="pagesim validate: left out: "), file=sys.stderr)
            continue
        frames.append(v.errors().assign(run=real.name))
        configs.append(cfg)
        replayed.append(real)
    if not frames:
        raise refused[0]
    runs = replayed
    errors = pd.concat(frames, ignore_index=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        errors.to_csv(out / "errors.csv", index=False)
    if args.json:
        print(json.dumps({"runs": [r.name for r in runs], "errors": errors.to_dict(orient="records")}))
        return 0
    systems = ", ".join(dict.fromkeys(c.system for c in configs))  # in the table's order, each once
    print(fill(f"{len(runs)} real runs of {args.against}, replayed on {systems}: sim / real - 1 "
               "of each run's means", rest="") + "\n")
    for line in runs_table_lines(errors):
        print(line)
    for line in sorted({run_band_line(c) for c in configs}):
        print(line)
    if args.out:
        print(f"wrote {Path(args.out) / 'errors.csv'}")
    return 0
