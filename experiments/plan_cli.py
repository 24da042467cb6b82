"""``pagesim plan``: capacity-planning what-ifs (logic in :mod:`experiments.plan`).

Modes (an optional first word; default ``max-rate``):

* ``max-rate``: the highest request rate meeting the SLO, per ``--systems``; the whole probed curve.
* ``resources --rate R``: the minimum KV memory for R; replicas x TP (and cost) for R; a what-if
  table (block size, max_num_seqs, reservation, chunked prefill, swap) of max rates.
* ``compare-gpus --gpus A,B``: per GPU: KV capacity, max rate under the SLO, $ per 1M output tokens.
* ``disaggregation --rate R --gpus N``: aggregated vllm-v1 replicas beside every prefill:decode
  split of N GPUs, and the fewest GPUs meeting the SLO each way (:mod:`experiments.plan_disagg`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pagesim.experiments import plan as P
from pagesim.experiments import plan_disagg as PD
from pagesim.experiments.probe import (DEFAULT_DURATION_S, WORKLOAD_OPTS, Runner, build_workload, describe_workload,
                                       early_stop_options, encode_workload)
from pagesim.experiments.run_cache import telling_cache_answers
from pagesim.experiments.search import DEFAULT_MAX_RATE, DEFAULT_MIN_RATE, DEFAULT_RTOL, DEFAULT_START_RATE
from pagesim.experiments.slo import DEFAULT_SLO_ATTAINMENT, KEEPUP_FRAC, KEEPUP_MIN_S, LITTLE_TOL, SLO
from pagesim.sim.args import (add_sim_args, check_settings_apply, defaults_line, given_settings, parse_goodput,
                              take_todays_defaults)
from pagesim.sim.cluster import ROUTERS
from pagesim.sim.cli import HelpFormatter, Parser, example
from pagesim.sim.config import SYSTEMS, SimConfig, load_toml
from pagesim.sim.cost.calibration import band_line, gpu_time_scales, run_error_band
from pagesim.sim.errors import ConfigError
from pagesim.sim.limits import check_drafter
from pagesim.sim.metrics import SummaryOptions
from pagesim.sim.specs import get_gpu, get_model, with_max_seq_len
from pagesim.sim.terminal import fill, table_lines
from pagesim.traces.args import _positive_float, add_workload_args, check_arrival_args

MODES = ("max-rate", "resources", "compare-gpus", "disaggregation")
DEFAULT_SYSTEMS = ["vllm"]  # --systems' default where --model or --gpu is given (sim.args.TODAYS_DEFAULTS)
DEFAULT_MAX_REPLICAS = 256  # 'plan resources --router': the most replicas searched unless --max-replicas says


def _csv_list(s: str) -> list[str]:
    items = [x.strip() for x in s.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {s!r}")
    return items


def _int_list(s: str) -> list[int]:
    try:
        out = [int(x) for x in _csv_list(s)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if any(v < 1 for v in out):
        raise argparse.ArgumentTypeError(f"values must be >= 1, got {s!r}")
    return out


def _pos(s: str) -> float:
    return _positive_float(s)


#: each mode's own help (``pagesim plan MODE --help``): what it answers, and an example
MODE_HELP = {
    "max-rate": ("The highest request rate meeting the SLO for each system of --systems (doubling from the start "
                 "rate, then bisecting to --rtol), with the band the cost model's measured error implies and "
                 "every probe's figures.",
                 "pagesim plan max-rate --workload sharegpt --duration 3600 --model opt-13b --gpu a100-40gb "
                 "--slo-ttft-p99 2 --slo-tpot-p99 0.1 --systems orca-max,orca-pow2,orca-oracle,vllm"),
    "resources": ("For a target --rate: the least KV memory meeting the SLO per system (searched up to what "
                  "the GPU holds beside the weights, or --kv-max-gib), the replicas x TP it takes and their "
                  "cost, and what-if variants (block size, chunked prefill, ...).",
                  "pagesim plan resources --rate 2 --workload sharegpt --duration 3600 --slo-ttft-p99 2 "
                  "--slo-tpot-p99 0.1 --tp-options 1,2 --what-if block_size=32,chunked_prefill --out out/plan-res "
                  "--report"),
    "compare-gpus": ("For each GPU of --gpus: its KV capacity, the highest rate meeting the SLO per system, "
                     "and $ per 1M output tokens at that rate.",
                     "pagesim plan compare-gpus --gpus a100-40gb,a100-80gb,h100-80gb,h200-141gb --model llama-2-13b "
                     "--duration 3600 --slo-ttft-p99 2 --slo-tpot-p99 0.1 --out out/plan-gpus"),
    "disaggregation": ("For a target --rate at --gpus N: N aggregated vllm-v1 replicas beside every "
                       "prefill:decode split P:D of the N GPUs, each run over the same workload (SLO "
                       "attainment, goodput and goodput per GPU, p99 TTFT and TPOT, which meets the SLO), "
                       "the choice, each design's goodput per GPU with the SLO's thresholds scaled x 0.5 "
                       "to x 2, and the fewest GPUs meeting the SLO each way (up to --max-gpus), each "
                       "with the cost model's error band.",
                       "pagesim plan disaggregation --workload sharegpt --num-requests 200 --rate 6 --gpus 4 "
                       "--model llama-2-7b --gpu a100-80gb --slo-ttft-p99 1 --slo-tpot-p99 0.05 --quick"),
}


class ModeHelp(argparse.Action):
    """``-h``: after a mode (``pagesim plan resources --help``) that mode's own options; else all."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        mode = getattr(namespace, "mode", None)
        (mode_parser(mode) if mode in MODE_HELP else parser).print_help()
        parser.exit()


def mode_parser(mode: str) -> argparse.ArgumentParser:
    """The parser ``pagesim plan MODE --help`` prints: the mode's question, its SLO, search, cost and
    output options (the workload and simulation options are plan's, listed by ``pagesim plan --help``)."""
    what, command = MODE_HELP[mode]
    p = Parser(prog=f"pagesim plan {mode}", formatter_class=HelpFormatter, epilog=example(command),
               description=what + " Every workload and simulation option of 'pagesim plan --help' applies too.")
    add_plan_args(p, mode)
    return p


def register(sub) -> None:
    p = sub.add_parser(
        "plan", help="capacity planning: max rate under an SLO, resources for a rate, cost, GPU comparison",
        formatter_class=HelpFormatter, add_help=False,
        description=(
            "Answer capacity questions with full simulations (probes) run through the sweep runner "
            "(parallel, cached on disk).\n\n"
            "  pagesim plan [max-rate] ...      highest rate meeting the SLO per --systems (+ the probed curve)\n"
            "  pagesim plan resources --rate R  min KV memory, replicas x TP and cost for R; what-if table\n"
            "  pagesim plan compare-gpus --gpus A,B,...  KV capacity, max rate and $/1M tokens per GPU\n"
            "  pagesim plan disaggregation --rate R --gpus N  aggregated or prefill:decode, how many\n\n"
            "A probe passes when every request finishes, the system keeps up (last finish - last arrival <= "
            "max(keepup-frac x span, keepup-min-s)) and the SLO holds (p99s over finished requests; with "
            "--slo-attainment F, the thresholds apply per request and that fraction of all requests must meet "
            "them; vLLM's --goodput ttft:MS tpot:MS e2el:MS sets such per-request thresholds in ms, with F "
            f"{DEFAULT_SLO_ATTAINMENT:g} unless given). Every probe reports slo_attainment (the fraction of "
            "requests meeting every threshold) and request_goodput (those requests per second, as vLLM's).\n"
            "Search: double from the start rate until a probe fails, then bisect to --rtol; the answer is the "
            "highest rate simulated that passed, never one above the system's offline saturation (the "
            "request throughput of the same requests all at once: past it the queue grows for as long as "
            "requests come). Built-in workloads are regenerated at each rate with the same "
            f"seed for --duration (default {DEFAULT_DURATION_S:g} s); a --trace is rate-scaled (--duration keeps "
            "its first DURATION seconds). Every probe also checks Little's law (warns above "
            f"{100 * LITTLE_TOL:g} %).\n"
            "Cost: $/1M output tokens = $/GPU-hour x tp x replicas / (output tok/s x 3600) x 1e6; preset prices "
            f"are illustrative ({', '.join(f'{g} ${v:.2f}' for g, v in P.GPU_HOURLY_USD.items())}).\n"
            "Exit code 2 (no traceback) when the model does not fit or no probed rate meets the SLO."),
        epilog=example(
            "pagesim plan --workload sharegpt --duration 3600 --model opt-13b --gpu a100-40gb --slo-ttft-p99 2 "
            "--slo-tpot-p99 0.1 --systems orca-max,orca-pow2,orca-oracle,vllm",
            MODE_HELP["resources"][1], MODE_HELP["compare-gpus"][1], MODE_HELP["disaggregation"][1]))
    p.add_argument("-h", "--help", action=ModeHelp, help="show this help; after a mode, that mode's own")
    p.add_argument("mode", nargs="?", choices=MODES, default=None,  # None: max-rate, named or not (run)
                   help="question to answer (default max-rate; pagesim plan MODE --help: its own options)")
    add_workload_args(p)
    add_sim_args(p, system=False)
    add_plan_args(p, None)
    p.set_defaults(func=run)


def add_plan_args(p: argparse.ArgumentParser, mode: str | None) -> None:
    """plan's own options on ``p``: SLO, search, cost and output; ``mode``: only that mode's cost
    options (None: every mode's)."""
    def only(*modes: str) -> bool:
        return mode is None or mode in modes

    g = p.add_argument_group("SLO (seconds)")
    g.add_argument("--slo-ttft-p99", type=_pos, metavar="S", help="p99 time to first token")
    g.add_argument("--slo-tpot-p99", type=_pos, metavar="S", help="p99 time per output token (after the first)")
    g.add_argument("--slo-e2el-p99", type=_pos, metavar="S", help="p99 end-to-end latency")
    g.add_argument("--slo-normalized-latency", type=_pos, metavar="S",
                   help="mean end-to-end latency per output token (the vLLM paper's metric)")
    g.add_argument("--slo-attainment", type=_pos, metavar="F",
                   help="the thresholds apply per request and at least this fraction of requests must meet all "
                        "of them (instead of the p99/mean checks)")
    g.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="vllm bench serve's per-request SLOs in milliseconds (ttft:2000 tpot:100 e2el:20000), "
                        f"met by --slo-attainment of the requests (default {DEFAULT_SLO_ATTAINMENT:g}, DistServe's)")
    s = p.add_argument_group("search")
    s.add_argument("--systems", type=_csv_list, default=DEFAULT_SYSTEMS, metavar="A,B",
                   help="systems to plan for: static, orca-max, orca-pow2, orca-oracle, vllm, token, vattention "
                        "(a bare plan, without --systems, --model or --gpu: vllm-v1 on llama-3.1-8b, h100-80gb)")
    if mode != "disaggregation":  # its designs all run at --rate (given: refused, run_disaggregation)
        s.add_argument("--start-rate", type=_pos, default=None,
                       help=f"first probed rate in req/s (default: --rate if given, else {DEFAULT_START_RATE:g}); "
                            "in 'resources' --rate is the target rate instead")
        s.add_argument("--min-rate", type=_pos, default=DEFAULT_MIN_RATE,
                       help="lowest rate probed; failing there means no rate meets the SLO")
        s.add_argument("--max-rate", type=_pos, default=DEFAULT_MAX_RATE, help="highest rate probed")
        s.add_argument("--rtol", type=_pos, default=DEFAULT_RTOL,
                       help="stop bisecting when (fail - pass) <= rtol x pass")
    s.add_argument("--keepup-frac", type=_pos, default=KEEPUP_FRAC,
                   help="kept up: drain (last finish - last arrival) <= max(this x arrival span, --keepup-min-s)")
    s.add_argument("--keepup-min-s", type=_pos, default=KEEPUP_MIN_S, help="floor of the drain allowance (s)")
    c = p.add_argument_group("cost, resources, GPUs")
    c.add_argument("--dollars-per-gpu-hour", type=_pos, default=None,
                   help="price of one GPU-hour (default: illustrative preset of --gpu)")
    if only("compare-gpus", "disaggregation"):
        c.add_argument("--gpus", type=_csv_list, default=None, metavar="A,B",
                       help="compare-gpus: GPU presets (default a100-40gb,a100-80gb,h100-80gb,h200-141gb); "
                            "disaggregation: the GPU count N the designs share")
    if only("disaggregation"):
        c.add_argument("--max-gpus", type=int, default=None, metavar="M",
                       help="disaggregation: most GPUs searched for the fewest meeting the SLO (default 2 N)")
        c.add_argument("--kv-link", default="ib-ndr", metavar="NAME",
                       help="disaggregation: what carries the KV to each decode replica (ib-ndr, ib-hdr, "
                            "roce-400, roce-200, roce-100, nvlink, pcie: sim/specs/links.py)")
        c.add_argument("--quick", action="store_true",
                       help="disaggregation: splits with the prefill pool at about 1/4, 1/2 and 3/4 of N only, "
                            "and no error band on the fewest GPUs")
    if only("resources", "disaggregation"):
        c.add_argument("--router", default=None, metavar="NAME",
                       help="resources: search the replicas behind this router (a cluster run at the whole rate: "
                            "round-robin, least-outstanding-requests, least-kv-usage, prefix-affinity) instead of "
                            "rate / k; the rate/k estimate is kept beside it. disaggregation: each pool's router "
                            "(default round-robin; not prefix-affinity)")
    if only("resources"):
        c.add_argument("--tp-options", type=_int_list, default=P.DEFAULT_TP_OPTIONS, metavar="1,2,4",
                       help="resources: tensor-parallel degrees to try for replicas x TP (default 1,2,4,8; "
                            "with --profile, those it was measured at)")
        c.add_argument("--what-if", default=None, metavar="LIST",
                       help="resources: variants (all, the default; none; or a list of: "
                            + ", ".join(n for n, _o in P.WHAT_IFS) + ")")
        c.add_argument("--kv-max-gib", type=_pos, default=512.0, help="resources: largest KV pool searched (GiB)")
        c.add_argument("--max-replicas", type=int, default=None,
                       help=f"resources with --router: most replicas tried (default {DEFAULT_MAX_REPLICAS})")
    e = p.add_argument_group("execution and output")
    e.add_argument("--executor", choices=["local", "ray"], default="local", help="where probes run")
    e.add_argument("--workers", type=int, default=None, help="parallel probes (default: CPU count)")
    e.add_argument("--address", default=None, help="Ray cluster address (with --executor ray)")
    e.add_argument("--cache-dir", default=None, help="run cache (default $PAGESIM_CACHE_DIR or ~/.cache/pagesim/runs)")
    e.add_argument("--no-cache", action="store_true", help="recompute every probe (and refresh the cache)")
    e.add_argument("--early-stop", action=argparse.BooleanOptionalAction, default=True,
                   help="end a probe as soon as it certainly fails (a rejection, or enough requests over a "
                        "p99 threshold / missing the --slo-attainment target); its metrics are then partial")
    if only("max-rate", "compare-gpus", "disaggregation"):
        e.add_argument("--error-band", action=argparse.BooleanOptionalAction, default=True,
                       help="max-rate, compare-gpus (each GPU by its own), disaggregation: search again with "
                            "the GPU time scaled by the cost "
                            "model's measured error in the answer's regime (serving: the real runs' spread of "
                            "sim / real - 1 for its GPU, model kind and engine, sim/data/serving/regimes.toml; "
                            "the others: x (1 +- p90) of the timings on the GPU, sim/data/calibration) and "
                            "report the rates between; nothing where the GPU is uncalibrated")
    e.add_argument("--steady-check", action=argparse.BooleanOptionalAction, default=True,
                   help=f"probe each answer's neighbours (rate / (1 + rtol) and rate x (1 + rtol)) on a "
                        f"{P.STEADY_FACTOR:g}x longer workload (a --trace replayed {P.STEADY_FACTOR:g} times in a "
                        "row) and warn when the answer moves by more than --rtol "
                        "(the workload is too short for a steady answer)")
    e.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bar on stderr")
    e.add_argument("--out", metavar="DIR", default=None, help="write plan.json and CSV tables here")
    e.add_argument("--report", action="store_true", help="also write DIR/report.html (needs --out)")
    e.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def _sim_settings(args: argparse.Namespace) -> tuple[dict[str, Any], set[str], set[str]]:
    """The explicitly set SimConfig settings (TOML file, then flags; presets fill the rest), and
    the names given as flags and only in the file (``sim.args.given_settings``)."""
    from dataclasses import fields

    names = {f.name for f in fields(SimConfig)}
    given, flags, from_file = given_settings(args)
    settings = {k: v for k, v in given.items() if k in names}
    if getattr(args, "max_len_policy", None) is not None:
        settings["max_len_policy"] = args.max_len_policy
    settings.pop("system", None)
    settings.pop("seed", None)
    return settings, flags, from_file


def setup_from_args(args: argparse.Namespace):
    file_system = load_toml(args.config).get("system") if getattr(args, "config", None) else None
    if file_system is not None and args.systems is DEFAULT_SYSTEMS:  # (the file's system; a flag wins)
        args.systems = [str(file_system)]
    if args.mode == "disaggregation":
        if args.systems is not DEFAULT_SYSTEMS and args.systems != [PD.SYSTEM]:
            raise ConfigError(f"--systems: 'plan disaggregation' plans {PD.SYSTEM} only (its KV connector), "
                              f"got {','.join(args.systems)}")
        args.systems = [PD.SYSTEM]
    bad = [s for s in args.systems if s not in SYSTEMS]
    if bad:
        raise ConfigError(f"unknown system(s) {', '.join(bad)}; valid systems: {', '.join(SYSTEMS)}")
    if getattr(args, "rate_scale", None):
        raise ConfigError("--rate-scale has no meaning in plan (the search sets the rate); use --start-rate")
    if args.report and not args.out:
        raise ConfigError("--report needs --out DIR")
    check_arrival_args(args)
    sim, flags, from_file = _sim_settings(args)
    configs = [SimConfig.for_system(s, seed=args.seed, **sim) for s in args.systems]  # every setting checked early
    check_settings_apply(configs, flags, from_file, getattr(args, "config", None))
    for cfg in configs:
        check_drafter(cfg)
    opts = {k: getattr(args, k, None) for k in WORKLOAD_OPTS}
    opts["max_len_policy"] = sim.get("max_len_policy")  # probes build their workload with the config's policy
    if not opts.get("trace") and opts.get("duration") is None and opts.get("num_requests") is None:
        opts["duration"] = DEFAULT_DURATION_S
    start = args.start_rate or (args.rate if args.mode != "resources" else None) or DEFAULT_START_RATE
    if args.min_rate > args.max_rate:
        raise ConfigError(f"--min-rate {args.min_rate} is above --max-rate {args.max_rate}")
    if not args.rtol < 1:
        raise ConfigError(f"--rtol must be < 1, got {args.rtol}")
    slo = slo_from_args(args)
    setup = P.PlanSetup(sim=sim, workload=encode_workload(opts), seed=args.seed, start_rate=start,
                        min_rate=args.min_rate, max_rate=args.max_rate, rtol=args.rtol,
                        duration_s=opts.get("duration") if not opts.get("trace") else None,
                        early_stop=early_stop_options(slo) if args.early_stop else None,
                        steady_check=args.steady_check)
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    runner = Runner(slo=slo, executor=args.executor, workers=args.workers, cache_dir=args.cache_dir,
                      address=args.address, use_cache=not args.no_cache,
                      progress=bool(args.progress) and not args.json and sys.stderr.isatty(),
                      keepup_frac=args.keepup_frac, keepup_min_s=args.keepup_min_s)
    return setup, slo, runner, opts


def slo_from_args(args: argparse.Namespace):
    """The SLO of --slo-* (seconds) and vLLM's --goodput KEY:MS thresholds, one source per metric."""
    if args.goodput and len(args.goodput) == 1 and args.goodput[0].replace(".", "", 1).isdigit():
        raise ConfigError(f"--goodput takes vLLM's KEY:MS thresholds (e.g. ttft:2000 tpot:100); the fraction of "
                          f"requests meeting the SLO is --slo-attainment {args.goodput[0]}")
    goodput = SummaryOptions(goodput_slo_s=parse_goodput(args.goodput)).goodput_slo_s  # validated as simulate's
    thresholds = {"ttft": args.slo_ttft_p99, "tpot": args.slo_tpot_p99, "e2el": args.slo_e2el_p99}
    for metric, seconds in goodput:
        if thresholds[metric] is not None:
            raise ConfigError(f"both --goodput {metric}:MS and --slo-{metric}-p99 set the {metric.upper()} "
                              "threshold: give one")
        thresholds[metric] = seconds
    attainment = args.slo_attainment
    if attainment is None and goodput:
        attainment = DEFAULT_SLO_ATTAINMENT
    return SLO(thresholds["ttft"], thresholds["tpot"], thresholds["e2el"], args.slo_normalized_latency, attainment)


def what_if_from_args(args: argparse.Namespace) -> list[str] | None:
    """'plan resources --what-if': the variants named (None: all; [] for none), each known; the
    flag and --max-replicas refused in one line where the mode or --router would ignore them."""
    if args.mode != "resources":
        for flag, value in (("--what-if", args.what_if), ("--max-replicas", args.max_replicas)):
            if value is not None:
                raise ConfigError(f"{flag} is for 'plan resources'; 'plan {args.mode}' has no use for it")
    if args.max_replicas is not None:
        if args.max_replicas < 1:
            raise ConfigError(f"--max-replicas must be >= 1, got {args.max_replicas}")
        if args.router is None:
            raise ConfigError("--max-replicas bounds the replicas searched behind --router; give --router NAME")
    if args.what_if in (None, "all"):
        return None
    if args.what_if == "none":
        return []
    names = [n.strip() for n in args.what_if.split(",") if n.strip()]
    P.check_what_if_names(names or [args.what_if])
    return names


def run(args: argparse.Namespace) -> int:
    with telling_cache_answers(recompute=args.no_cache):
        return plan(args)


def plan(args: argparse.Namespace) -> int:
    """One plan (``run``): its mode's search, then its tables or JSON."""
    args.mode = args.mode or "max-rate"  # the default only here: --help tells a named mode from none
    taken = take_todays_defaults(args, system_given=args.systems is not DEFAULT_SYSTEMS,
                                 skip=("gpu",) if args.mode == "compare-gpus" else ())
    if taken:
        args.systems = [taken["system"]]
    what = what_if_from_args(args)
    setup, slo, runner, opts = setup_from_args(args)
    # fail early, in this process, on a workload that cannot be built (bad trace, too-long requests)
    model = with_max_seq_len(get_model(setup.sim.get("model") or "opt-13b"), setup.sim.get("max_seq_len"))
    build_workload(setup.workload, args.rate or setup.start_rate, setup.seed, model.max_seq_len)
    cfg = SimConfig.for_system(args.systems[0], **setup.sim)
    if taken:  # the first line, once the settings are checked: what runs unasked, and how to change it
        from pagesim.sim.run import config_cost_model

        if args.mode != "compare-gpus":  # (there cfg's GPU is none of those compared)
            config_cost_model(cfg)  # (a profile that cannot be read: its one line, alone)
        print(defaults_line(taken, "--systems"), file=sys.stderr if args.json else sys.stdout, flush=True)
    # the ranks of an expert-parallel group price each other's tokens: its replicas are sized by
    # cluster runs of the whole group (--router), not by one rank at rate / k (disaggregation:
    # sim.disagg.check_disagg refuses it)
    if cfg.expert_parallel and args.mode == "resources" and args.router is None:
        raise ConfigError("--expert-parallel: plan resources sizes an expert-parallel group by running it whole "
                          "(its ranks share the experts and each other's tokens): give --router, e.g. "
                          "least-outstanding-requests, vLLM's data-parallel front end")
    gpus = (args.gpus if args.mode == "compare-gpus" else None) or ["a100-40gb", "a100-80gb", "h100-80gb",
                                                                     "h200-141gb"]
    named: dict[str, str] = {}  # each GPU by its preset's name (an alias as typed would be a GPU with no fitted run)
    for g in gpus:  # an alias and its preset are one GPU: compared twice, it would be two rows of one
        preset = get_gpu(g).name
        if preset in named:
            raise ConfigError(f"--gpus: {named[preset]} and {g} are the same GPU ({preset})")
        named[preset] = g
    base = get_gpu(cfg.gpu).name
    # each GPU's band from its own settings (vLLM v1's batch limit, for one, depends on the GPU);
    # compare-gpus brackets each GPU's answer by that GPU's own band (add_gpu_error_bands)
    if args.mode == "compare-gpus":
        bands = {preset: run_error_band(SimConfig.for_system(args.systems[0], **{**setup.sim, "gpu": preset}), preset)
                 for preset in named}
    else:
        bands = {base: run_error_band(cfg, base)}
    banded = args.error_band and args.mode != "compare-gpus"
    scales = gpu_time_scales(bands[base]["cost_error"]) if banded else None
    if args.mode == "max-rate":
        result = P.max_rate(setup, args.systems, runner, dollars_per_gpu_hour=args.dollars_per_gpu_hour)
        feasible = any(v is not None for v in result["max_rate_rps"].values())
        if scales is not None:
            add_error_band(result, setup, runner, scales, args.dollars_per_gpu_hour)
    elif args.mode == "disaggregation":
        result = run_disaggregation(args, setup, runner, scales)
        feasible = any(r.get("gpus") is not None for r in result["fewest"]) or result["choice"] is not None
    elif args.mode == "compare-gpus":
        result = P.compare_gpus(setup, gpus, args.systems, runner, dollars_per_gpu_hour=args.dollars_per_gpu_hour)
        feasible = any(r.get("max_rate_rps") is not None for r in result["gpus"])
        if args.error_band:
            add_gpu_error_bands(result, setup, runner, bands, args.dollars_per_gpu_hour)
    else:
        if args.rate is None:
            raise ConfigError("'plan resources' needs the target rate: --rate R (req/s)")
        if args.router is not None and args.router not in ROUTERS:
            raise ConfigError(f"--router: unknown router {args.router!r}; valid: {', '.join(ROUTERS)}")
        if setup.sim.get("profile"):  # a measured profile prices the degrees it was measured at alone
            args.tp_options = profile_degrees(setup.sim["profile"], args.tp_options)
        if args.router is not None:  # what a cluster of these replicas refuses, once, before any probe
            from pagesim.sim.cluster import check_cluster

            for s in args.systems:  # (two replicas: what one alone is never refused; --max-replicas 1 is one)
                check_cluster(min(2, args.max_replicas or 2), args.router, 0.0, SimConfig.for_system(s, **setup.sim))
        result = P.resources(setup, args.rate, args.systems, runner, tp_options=args.tp_options, what_if=what,
                             kv_max_gib=args.kv_max_gib, dollars_per_gpu_hour=args.dollars_per_gpu_hour,
                             router=args.router, max_replicas=args.max_replicas or DEFAULT_MAX_REPLICAS)
        feasible = (any(r.get("min_kv_gib") is not None for r in result["kv"])
                    or result["cheapest"] is not None)
    result["slo"] = {k: v for k, v in vars(slo).items()} | {"description": slo.describe()}
    result["cost_model"] = bands
    result["workload"] = {"spec": setup.workload, "description": describe_workload(setup.workload), **{k: v for k, v in opts.items() if v not in (None, False)}}
    result["config"] = {"systems": args.systems, **setup.sim, "seed": setup.seed}
    result["search"] = {"start_rate": setup.start_rate, "min_rate": setup.min_rate, "max_rate": setup.max_rate,
                        "rtol": setup.rtol, "keepup_frac": runner.keepup_frac, "keepup_min_s": runner.keepup_min_s,
                        "littles_law_tolerance": LITTLE_TOL}
    result = P.jsonable(result)
    if args.out:
        write_outputs(result, Path(args.out), report=args.report)
    if args.json:
        print(json.dumps(result, default=str, allow_nan=False))
    else:
        print_result(result, sys.stdout)
        if args.out:
            report = ", report.html" if args.report else ""
            print("\n" + fill(f"wrote {Path(args.out) / 'plan.json'} and CSV tables{report}"))
    for w in result.get("warnings", []):
        print(fill(w, first="pagesim plan: warning: "), file=sys.stderr)
    if not feasible:
        msgs = list(result.get("infeasible", {}).values()) or ["no probed setting meets the SLO"]
        if args.json:  # the tables already said it
            for m in msgs:
                print(fill(m, first="pagesim plan: "), file=sys.stderr)
        return 2
    return 0


def run_disaggregation(args: argparse.Namespace, setup, runner: Runner, scales: list[float] | None) -> dict:
    """'plan disaggregation': its options checked (one line each), then :func:`PD.disaggregation`."""
    from pagesim.sim.disagg import DISAGG_ROUTERS, check_disagg
    from pagesim.sim.specs.links import LINKS

    if args.rate is None:
        raise ConfigError("'plan disaggregation' needs the target rate: --rate R (req/s)")
    if args.gpus is None or len(args.gpus) != 1 or not args.gpus[0].isdigit() or int(args.gpus[0]) < 2:
        raise ConfigError("'plan disaggregation' needs the GPU count: --gpus N, a whole number >= 2 "
                          f"(got {','.join(args.gpus) if args.gpus else 'none'})")
    unused = [flag for flag, given in (("--start-rate", args.start_rate is not None),
                                       ("--min-rate", args.min_rate != DEFAULT_MIN_RATE),
                                       ("--max-rate", args.max_rate != DEFAULT_MAX_RATE),
                                       ("--rtol", args.rtol != DEFAULT_RTOL)) if given]
    if unused:
        raise ConfigError(f"{unused[0]} has no meaning in 'plan disaggregation': every design runs at --rate")
    router = args.router or "round-robin"
    if router not in DISAGG_ROUTERS:
        raise ConfigError(f"--router {router!r} is not offered with disaggregation; valid: {', '.join(DISAGG_ROUTERS)}")
    if args.kv_link not in LINKS:
        raise ConfigError(f"--kv-link: unknown link {args.kv_link!r} (choose from {', '.join(LINKS)})")
    if args.max_gpus is not None and args.max_gpus < 2:
        raise ConfigError(f"--max-gpus must be a whole number >= 2, got {args.max_gpus}")
    cfg = SimConfig.for_system(PD.SYSTEM, seed=setup.seed, **setup.sim)
    check_disagg(cfg, cfg, 1, 1, router, args.kv_link)  # what a disaggregated run cannot take
    return PD.disaggregation(setup, args.rate, int(args.gpus[0]), runner, max_gpus=args.max_gpus, router=router,
                             kv_link=args.kv_link, quick=args.quick, scales=scales)


def profile_degrees(path: str, tp_options: list[int]) -> list[int]:
    """The tensor-parallel degrees 'plan resources' tries with the measured profile ``path``: the
    default's that it was measured at (all it was measured at, if none), or ``--tp-options`` as
    given, refused in one line if it names a degree the profile was not measured at."""
    from pagesim.sim.cost.profile_format import read_profile

    measured = sorted(set(int(x) for x in read_profile(path)["tp"]))
    if tp_options is P.DEFAULT_TP_OPTIONS:
        return [tp for tp in P.DEFAULT_TP_OPTIONS if tp in measured] or measured
    unmeasured = [tp for tp in tp_options if tp not in measured]
    if unmeasured:
        raise ConfigError(f"--tp-options: the profile {path} was measured at TP {', '.join(map(str, measured))}, not "
                          f"{', '.join(map(str, unmeasured))} (drop those, or measure them)")
    return tp_options


def add_error_band(result: dict, setup, runner, scales: list[float], dollars_per_gpu_hour: float | None = None) -> None:
    """Each answer's max rate again with the GPU time x ``scales[0]`` (``max_rate_low_rps``) and
    x ``scales[1]`` (``max_rate_high_rps``): the band the cost model's measured error implies
    (``sim.cost.calibration.gpu_time_scales``). Only systems with an answer are searched again."""
    answered = [row["system"] for row in result["answers"] if row.get("max_rate_rps") is not None]
    rates = band_rates(setup, answered, runner, scales, dollars_per_gpu_hour)
    for row in result["answers"]:
        if row["system"] in rates:
            keep_band_around(result, row, row["system"], rates[row["system"]], setup.rtol)
    result["error_band"] = {"gpu_time_scales": list(scales)}


def add_gpu_error_bands(result: dict, setup, runner, bands: dict, dollars_per_gpu_hour: float | None = None) -> None:
    """compare-gpus: each GPU's answers again with the GPU time scaled by that GPU's own band's
    scales (``max_rate_low_rps``, ``max_rate_high_rps``), as :func:`add_error_band` brackets
    max-rate's one GPU; a GPU whose band has no measured error keeps its answers alone, and only
    the systems with an answer on a GPU are searched again there."""
    scales_by_gpu = {}
    for gpu, band in bands.items():
        scales = gpu_time_scales(band["cost_error"])
        rows = [row for row in result["gpus"] if row.get("gpu") == gpu and row.get("max_rate_rps") is not None]
        if scales is None or not rows:
            continue
        scales_by_gpu[gpu] = list(scales)
        rates = band_rates(setup, [row["system"] for row in rows], runner, scales, dollars_per_gpu_hour, gpu=gpu)
        for row in rows:
            keep_band_around(result, row, f"{gpu}/{row['system']}", rates[row["system"]], setup.rtol)
    if scales_by_gpu:
        result["error_band"] = {"gpu_time_scales": scales_by_gpu}


def band_rates(setup, systems, runner, scales, dollars_per_gpu_hour, gpu: str | None = None) -> dict:
    """Per system, the max rates (slow, fast) the search finds with the GPU time x each scale."""
    from dataclasses import replace

    if not systems:
        return {}
    found = [P.max_rate(replace(setup, sim={**setup.sim, "cost_scale": scale, **({"gpu": gpu} if gpu else {})}),
                        systems, runner, dollars_per_gpu_hour=dollars_per_gpu_hour)["max_rate_rps"]
             for scale in scales]
    return {s: (found[0][s], found[1][s]) for s in systems}


def keep_band_around(result: dict, row: dict, name: str, rates: tuple, rtol: float) -> None:
    """``row``'s band sides, each kept on its side of its answer: the slower GPU time's search at
    or under it, the faster's at or over it. A side that lands on the other side is clamped to the
    answer: silently within the searches' tolerance ``rtol`` (their grids differ), else with a
    warning (a short workload's saturation check is noisy: ``plan.cap_at_saturation``)."""
    answer = row["max_rate_rps"]
    slow, fast = rates
    for key, side, value, beyond in (("max_rate_low_rps", "slow", slow, lambda v: v > answer),
                                     ("max_rate_high_rps", "fast", fast, lambda v: v < answer)):
        if value is not None and beyond(value):
            if not answer / (1 + rtol) <= value <= answer * (1 + rtol):
                result.setdefault("warnings", []).append(
                    f"{name}: the band's {side} side found {value:g} req/s, on the other side of the answer "
                    f"{answer:g}: kept at the answer (the workload is likely too short for a steady answer: "
                    "a longer --duration)")
            value = answer
        row[key] = value


def write_outputs(result: dict, out: Path, report: bool = False) -> None:
    import pandas as pd
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(result, indent=2, default=str, allow_nan=False) + "\n")
    pd.DataFrame(result["points"]).to_csv(out / "points.csv", index=False)
    for key, name in (("answers", "max_rate.csv"), ("gpus", "gpus.csv"), ("kv", "kv.csv"),
                      ("replicas", "replicas.csv"), ("what_if", "what_if.csv"), ("designs", "designs.csv"),
                      ("fewest", "fewest_gpus.csv"), ("slo_scales", "slo_scales.csv")):
        if result.get(key):
            pd.DataFrame(result[key]).to_csv(out / name, index=False)
    if report:
        from pagesim.reports.plan_report import plan_report  # plotly, for --report only
        plan_report(result, out / "report.html")


def _fmt(v: Any, spec: str = ".3g") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else format(v, spec)
    return str(v)


#: columns of sentences: listed under their table, beside their row's keys (sim.terminal)
TEXT_COLUMNS = ("note", "fail_reason")


def _table(rows: list[dict], cols: list[tuple[str, str]], f, keys: int = 1) -> None:
    """``rows`` as a table within the terminal's 100 columns, the first ``keys`` columns naming
    each row (:func:`sim.terminal.table_lines`)."""
    if not rows:
        return
    cells = [[_fmt(r.get(k)) for k, _h in cols] for r in rows]
    text = tuple(i for i, (k, _h) in enumerate(cols) if k in TEXT_COLUMNS)
    print("\n".join(table_lines([h for _k, h in cols], cells, keys=keys, text=text)), file=f)


POINT_COLS = [("search", "search"), ("rate", "rate"), ("passed", "pass"), ("p99_ttft_s", "p99 TTFT s"),
              ("p99_tpot_s", "p99 TPOT s"), ("slo_attainment", "SLO attain."), ("request_throughput", "req/s"),
              ("request_goodput", "good req/s"), ("output_throughput", "tok/s"), ("littles_law_error", "Little err"), ("fail_reason", "why not")]


def print_result(r: dict, f) -> None:
    print(f"SLO: {r['slo']['description']}", file=f)
    print(f"workload: {describe_workload(r['workload']['spec'])}, rate-scaled per probe", file=f)
    for gpu, band in r.get("cost_model", {}).items():
        print(band_line(band, gpu), file=f)
    if r["mode"] == "max-rate":
        print("\nmax rate under the SLO", file=f)
        band = [("max_rate_low_rps", "band low"), ("max_rate_high_rps", "band high")] if r.get("error_band") else []
        _table(r["answers"], [("system", "system"), ("max_rate_rps", "max req/s"), *band,
                              ("saturation_rps", "offline req/s"), ("p99_ttft_s", "p99 TTFT s"),
                              ("p99_tpot_s", "p99 TPOT s"), ("slo_attainment", "SLO attain."),
                              ("request_goodput", "good req/s"), ("output_throughput", "out tok/s"),
                              ("kv_capacity_tokens", "KV tokens"),
                              ("dollars_per_1m_output_tokens", "$/1M tok"), ("probes", "probes"),
                              ("steady", "steady")], f)
        if r.get("error_band"):
            b = r["error_band"]
            print(f"band: max req/s with the GPU time x {b['gpu_time_scales'][0]:.3f} (low) and "
                  f"x {b['gpu_time_scales'][1]:.3f} (high), the cost model's measured error", file=f)
        c = r["cost"]
        print(f"(cost at {c['gpu']} ${c['dollars_per_gpu_hour']:.2f}/GPU-hour x TP {c['tensor_parallel']}"
              + (", illustrative price" if c["illustrative_prices"] else "") + ")", file=f)
    elif r["mode"] == "disaggregation":
        print_disaggregation(r, f)
        return
    elif r["mode"] == "compare-gpus":
        print("\nGPUs side by side", file=f)
        band = [("max_rate_low_rps", "band low"), ("max_rate_high_rps", "band high")] if r.get("error_band") else []
        _table(r["gpus"], [("gpu", "gpu"), ("system", "system"), ("kv_capacity_tokens", "KV tokens"),
                           ("kv_gib", "KV GiB"), ("max_rate_rps", "max req/s"), *band,
                           ("output_throughput", "out tok/s"),
                           ("dollars_per_gpu_hour", "$/GPU-h"), ("dollars_per_1m_output_tokens", "$/1M tok"),
                           ("steady", "steady"), ("note", "note")], f, keys=2)
        for gpu, (slow, fast) in (r.get("error_band") or {}).get("gpu_time_scales", {}).items():
            print(fill(f"band on {gpu}: max req/s with the GPU time x {slow:.3f} (low) and x {fast:.3f} (high), "
                       "its cost model's measured error"), file=f)
    else:
        print(f"\nminimum KV memory at {r['rate']:g} req/s", file=f)
        _table(r["kv"], [("system", "system"), ("min_kv_gib", "KV GiB"), ("min_kv_tokens", "KV tokens"),
                         ("probes", "probes"), ("steady", "steady"), ("note", "note")], f)
        print(f"\nreplicas x TP for {r['rate']:g} req/s", file=f)
        routed = [("router", "router"), ("replicas_rate_over_k", "rate/k replicas"),
                  ("rate_over_k_off_by", "rate/k off by")] if any("router" in x for x in r["replicas"]) else []
        _table(r["replicas"], [("system", "system"), ("tensor_parallel", "TP"),
                               ("max_rate_per_replica_rps", "max req/s/replica"), ("replicas", "replicas"),
                               *routed,
                               ("gpus", "GPUs"), ("verified", "verified"), ("dollars_per_hour", "$/h"),
                               ("dollars_per_1m_output_tokens", "$/1M tok"), ("steady", "steady"),
                               ("note", "note")], f, keys=2)
        if r.get("cheapest"):
            ch = r["cheapest"]
            print(f"cheapest: {ch['system']} TP {ch['tensor_parallel']} x {ch['replicas']} replicas "
                  f"= {ch['gpus']} GPUs, ${ch['dollars_per_hour']:.2f}/h", file=f)
        if r.get("what_if"):
            print("\nwhat-if: max rate per variant", file=f)
            _table(r["what_if"], [("system", "system"), ("variant", "variant"), ("max_rate_rps", "max req/s"),
                                  ("vs_baseline", "x baseline"), ("meets_target", f"meets {r['rate']:g}"),
                                  ("steady", "steady")], f, keys=2)
    print("\nprobed points", file=f)
    cols = list(POINT_COLS)
    if any(p.get("kv_gib") is not None for p in r["points"]):
        cols.insert(2, ("kv_gib", "KV GiB"))
    _table(sorted(r["points"], key=lambda p: (p["search"], p["x"])), cols, f, keys=2)
    for name, msg in r.get("infeasible", {}).items():
        print("\n" + fill(msg), file=f)


def print_slo_scales(rows: list[dict], gpus: int, f) -> None:
    """Goodput per GPU of each design (a row) with every SLO threshold x s (a column each)."""
    scales = list(dict.fromkeys(row["slo_scale"] for row in rows))
    table: dict[str, dict] = {}
    for row in rows:
        table.setdefault(row["design"], {"design": row["design"]})[f"x{row['slo_scale']:g}"] = \
            row["goodput_per_gpu"]
    print(f"\ngoodput per GPU at {gpus} GPUs with every SLO threshold x s (the same runs)", file=f)
    _table(list(table.values()), [("design", "design")] + [(f"x{s:g}", f"s = {s:g}") for s in scales], f)


def print_disaggregation(r: dict, f) -> None:
    """'plan disaggregation': the designs at N GPUs, the choice, the fewest GPUs each way, the
    band and the number of runs."""
    band = r.get("error_band")
    meets = [("meets_slow", "slow"), ("meets_fast", "fast")] if band else []
    print(f"\nat {r['gpu_count']} GPUs, {r['rate']:g} req/s (P:D = prefill:decode replicas, KV over "
          f"{r['kv_link']}, {r['router']} per pool)", file=f)
    _table(r["designs"], [("design", "design"), ("passed", "meets"), *meets, ("slo_attainment", "SLO attain."),
                          ("request_goodput", "good req/s"), ("goodput_per_gpu", "good/GPU"),
                          ("p99_ttft_s", "p99 TTFT s"), ("p99_tpot_s", "p99 TPOT s"),
                          ("fail_reason", "why not")], f)
    choice = r["choice"]
    print(fill(f"choice at {r['gpu_count']} GPUs: " + (f"{choice} (the most goodput meeting the SLO)" if choice
                                                  else "none: no design meets the SLO")), file=f)
    if r.get("slo_scales"):
        print_slo_scales(r["slo_scales"], r["gpu_count"], f)
    print("\nfewest GPUs meeting the SLO", file=f)
    gpus_band = [("gpus_slow", "slow"), ("gpus_fast", "fast")] if band and "fewest_slow" in band else []
    _table(r["fewest"], [("way", "way"), ("gpus", "GPUs"), *gpus_band, ("design", "design"),
                         ("slo_attainment", "SLO attain."), ("goodput_per_gpu", "good/GPU"),
                         ("p99_ttft_s", "p99 TTFT s"), ("p99_tpot_s", "p99 TPOT s"), ("note", "note")], f)
    if band:
        scales = band["gpu_time_scales"]
        print(fill(f"band: slow / fast = the same with the GPU time x {scales[0]:.3f} / x {scales[1]:.3f}, the "
                   f"cost model's measured error; the choice slow / fast: {band['choice_slow'] or 'none'} / "
                   f"{band['choice_fast'] or 'none'}"), file=f)
    print(f"\n{r['num_simulated']} runs" + (" (--quick)" if r["quick"] else ""), file=f)
