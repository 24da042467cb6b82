"""``pagesim simulate``: one simulation run, written to a folder and summarized on screen."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pagesim.sim.cli import HelpFormatter, example
from pagesim.sim.config import APPEND_RULES, PLACEMENTS, PREEMPTIONS, RESERVATIONS, SYSTEMS, SimConfig, load_toml
from pagesim.sim.calibration import describe_band, error_band
from pagesim.sim.errors import ConfigError

#: CLI flag -> SimConfig field, for the settings every simulation-running command shares
SIM_FLAGS = {
    "model": dict(help="model preset or path to a Hugging Face config.json (default opt-13b)"),
    "gpu": dict(help="GPU preset: a100-40gb, a100-80gb, h100-80gb, h200-141gb, l40s, a40 (default a100-40gb)"),
    "tensor_parallel": dict(flag="--tp", type=int, help="tensor-parallel degree (default 1)"),
    "kv_gib": dict(type=float, help="KV pool size in GiB (default: GPU memory x utilization - weights - activations)"),
    "gpu_memory_utilization": dict(type=float, help="fraction of GPU memory vLLM may use (default 0.9)"),
    "max_seq_len": dict(type=int, help="maximum request length (default: the model's)"),
    "manager": dict(choices=["static", "contiguous", "paged", "vattention"], help="override the system's memory manager"),
    "scheduler": dict(choices=["static", "orca", "vllm"], help="override the system's scheduler"),
    "block_size": dict(type=int, help="paged block size in tokens (default 16; token: 1)"),
    "reservation": dict(choices=RESERVATIONS, help="contiguous reservation policy"),
    "placement": dict(choices=PLACEMENTS, help="contiguous placement policy (default buddy)"),
    "predictor_error": dict(type=float, help="relative error of the 'predicted' reservation's length predictor"),
    "vattention_page_kib": dict(type=int, help="vAttention physical page size per layer in KiB (64 or 2048)"),
    "watermark": dict(type=float, help="paged: fraction of blocks kept free at admission (default 0.01)"),
    "prefix_caching": dict(action="store_true", default=None, help="paged: share prompt blocks by hash"),
    "append_rule": dict(choices=APPEND_RULES,
                        help="paged: what a decode step needs free; free-block-per-seq (default): vLLM v0's one "
                             "free block per running sequence (can_append_slots); exact: the blocks it takes"),
    "static_batch_size": dict(type=int, help="static batching: batch size B (default: as many max-length slots as fit)"),
    "max_num_seqs": dict(type=int, help="maximum running sequences (default 256)"),
    "max_num_batched_tokens": dict(type=int, help="prompt tokens per iteration (default max(max_seq_len, 2048))"),
    "preemption": dict(choices=PREEMPTIONS, help="vLLM preemption: recompute (default) or swap"),
    "swap_gib": dict(type=float, help="CPU swap space in GiB (default 4)"),
    "chunked_prefill": dict(action="store_true", default=None, help="Sarathi-Serve chunked prefill"),
    "chunk_budget": dict(type=int, help="chunked prefill: tokens per iteration (default 512)"),
    "waiting_served_ratio": dict(type=float, help="admit new prompts only when waiting/running reaches this"),
    "cost_model": dict(choices=["roofline", "calibrated"],
                       help="roofline (default) or calibrated: the roofline with constants fitted on measured "
                            "GPU timings (sim/data/calibration/<gpu>.toml: a100-80gb, h100-80gb, a40)"),
    "cost_scale": dict(type=float, help="multiply the cost model's GPU time (CPU overheads kept): a what-if, and "
                                        "how plan's error band reruns at 1 -/+ the measured p90 error (default 1)"),
    "profile": dict(help="profile CSV from 'pagesim gpu calibrate' or 'pagesim cost import' (table cost model "
                         "instead of roofline)"),
    "step_overhead_ms": dict(type=float, help="fixed per-iteration overhead in ms (default 3)"),
    "per_seq_overhead_ms": dict(type=float, help="per-sequence CPU overhead per iteration in ms (default 0.02; "
                                                 "~0.3 matches the vLLM paper's 2023 system)"),
}


def add_sim_args(p: argparse.ArgumentParser, *, system: bool = True) -> None:
    g = p.add_argument_group("system and hardware")
    if system:
        g.add_argument("--system", default=None, choices=list(SYSTEMS),
                       help="named combination of manager + scheduler (default vllm)")
    for name, spec in SIM_FLAGS.items():
        spec = dict(spec)
        flag = spec.pop("flag", "--" + name.replace("_", "-"))
        spec.setdefault("default", None)
        g.add_argument(flag, dest=name, **spec)
    g.add_argument("--config", metavar="FILE.toml", default=None,
                   help="TOML file with any of these settings (command-line flags win)")


def config_from_args(args: argparse.Namespace, **fixed) -> SimConfig:
    """Preset of --system, then the TOML file, then explicit flags, then ``fixed``."""
    settings: dict = {}
    if getattr(args, "config", None):
        settings.update(load_toml(args.config))
    for name in SIM_FLAGS:
        v = getattr(args, name, None)
        if v is not None:
            settings[name] = v
    for k in ("seed", "check", "max_len_policy"):
        if getattr(args, k, None) is not None:
            settings[k] = getattr(args, k)
    settings.update(fixed)
    system = settings.pop("system", None)
    system = getattr(args, "system", None) or system or "vllm"
    # workload settings may sit in the same TOML file; keep only the simulation's own
    from dataclasses import fields
    names = {f.name for f in fields(SimConfig)}
    return SimConfig.for_system(system, **{k: v for k, v in settings.items() if k in names})


def add_summary_args(p: argparse.ArgumentParser) -> None:
    """``vllm bench serve``'s options for what the summary reports (see :class:`SummaryOptions`)."""
    from pagesim.sim.metrics import LATENCY_METRICS
    m = p.add_argument_group("summary metrics (as vllm bench serve)")
    m.add_argument("--percentile-metrics", default=",".join(LATENCY_METRICS), metavar="LIST",
                   help="latency metrics that get percentiles (p<P>_<metric>_ms): any of "
                        + ",".join(LATENCY_METRICS) + "; mean, median and std are reported for all four")
    m.add_argument("--metric-percentiles", default="99", metavar="LIST",
                   help="which percentiles, e.g. 50,90,99 gives p50_ttft_ms, p90_ttft_ms, p99_ttft_ms")
    m.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="per-request SLOs in milliseconds, e.g. ttft:2000 tpot:100 e2el:20000; the summary "
                        "then has request_goodput: finished requests meeting all of them per second")


def parse_goodput(pairs: list[str] | None) -> tuple[tuple[str, float], ...]:
    """vLLM's ``--goodput KEY:MS ...`` as (metric, threshold in seconds) pairs."""
    out = []
    for pair in pairs or ():
        name, sep, value = pair.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = None
        if not sep or ms is None:
            raise ConfigError(f"--goodput takes KEY:MS pairs in milliseconds, as vllm bench serve "
                              f"(e.g. ttft:2000 tpot:100 e2el:20000), got '{pair}'")
        out.append((name, ms / 1e3))
    return tuple(out)


def summary_options_from_args(args: argparse.Namespace):
    from pagesim.sim.metrics import SummaryOptions

    metrics = tuple(m.strip() for m in args.percentile_metrics.split(",") if m.strip())
    try:
        percentiles = tuple(float(p) for p in args.metric_percentiles.split(",") if p.strip())
    except ValueError:
        raise ConfigError(f"--metric-percentiles takes comma-separated numbers in [0, 100] (e.g. 50,90,99), "
                          f"got '{args.metric_percentiles}'") from None
    return SummaryOptions(percentile_metrics=metrics, percentiles=percentiles, goodput_slo_s=parse_goodput(args.goodput))


def register(sub) -> None:
    p = sub.add_parser(
        "simulate", help="run one simulation and write summary.json, requests.csv, steps.csv",
        formatter_class=HelpFormatter,
        description="Replay a workload through one serving system and report throughput, latency and where "
                    "every KV slot went (token states, reservation, internal/external fragmentation).",
        epilog=example("pagesim simulate --workload sharegpt --rate 2 --duration 600 --system vllm --out out/vllm",
                       "pagesim simulate --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv "
                       "--model llama-2-13b --gpu a100-80gb --system orca-pow2 --max-len-policy drop --out out/azure --report"))
    from pagesim.traces.args import add_workload_args

    add_workload_args(p)
    add_sim_args(p)
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="DIR", default=None, help="folder for summary.json, requests.csv, steps.csv")
    o.add_argument("--requests-format", choices=["csv", "parquet"], default="csv")
    o.add_argument("--no-steps", action="store_true", help="keep only running sums, not one row per iteration")
    o.add_argument("--report", action="store_true", help="also write DIR/report.html")
    o.add_argument("--check", action="store_true", default=None,
                   help="assert invariants at every iteration: memory, manager and scheduler state, "
                        "recomputed from scratch (slow; no macro steps)")
    o.add_argument("--engine", choices=["auto", "core", "python"], default="auto",
                   help="auto: the core (sim/core/, compiled by numba) where it covers the configuration "
                        "(vLLM default: paged, recompute or swap, optionally chunked prefill; no prefix "
                        "caching or sampling width), else the Python engine; core: insist (exit 2 saying "
                        "why not); python: never. The same records either way")
    o.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    add_summary_args(p)
    o.add_argument("--progress", dest="progress", action=argparse.BooleanOptionalAction, default=True,
                   help="progress bar on runs longer than 2 s")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pagesim.sim.limits import check_synthetic_workload
    from pagesim.sim.run import resolve_budget, run_simulation
    from pagesim.traces.args import DEFAULT_DURATION_S, DEFAULT_RATE, workload_from_args

    cfg = config_from_args(args)
    summary_options = summary_options_from_args(args)
    if args.no_steps:
        cfg = cfg.replace(record_steps=False)
    model, _gpu, _budget = resolve_budget(cfg)
    if not args.trace:
        duration = args.duration if args.duration is not None or args.num_requests is not None else DEFAULT_DURATION_S
        check_synthetic_workload(args.rate if args.rate is not None else DEFAULT_RATE, duration, args.num_requests)
    trace, workload = workload_from_args(args, model.max_seq_len, cfg.max_len_policy)
    result = run_simulation(cfg, trace, progress=args.progress and not args.json, engine=args.engine,
                            summary_options=summary_options)
    result.summary["workload"] = workload
    result.summary.update(error_band(cfg.cost_model, result.summary["gpu"], cfg.profile))
    if args.out:
        from pagesim.sim.outdir import staged_folder

        with staged_folder(args.out) as staged:
            result.save(staged, args.requests_format)
            if args.report:
                from pagesim.reports.html import single_run_report

                single_run_report(result, staged / "report.html")
    if args.json:
        from pagesim.sim.run import _jsonable

        print(json.dumps(_jsonable({k: v for k, v in result.summary.items()})))
    else:
        print_summary(result.summary, sys.stdout, summary_options)
        if args.out:
            print(f"\nwrote {Path(args.out) / 'summary.json'}, requests.{args.requests_format}, steps.csv"
                  + (", report.html" if args.report else ""))
    return 0


#: the latency rows of the printed summary: (metric, label)
LATENCY_ROWS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))


def print_summary(s: dict, f, options) -> None:
    """The summary as a table; ``options`` (:class:`SummaryOptions`) name the percentiles it holds."""
    from pagesim.sim.metrics import percentile_word
    mem = [("token states", "mem_token_states"), ("reservation", "mem_reservation"),
           ("internal frag", "mem_internal_frag"), ("allocator slack", "mem_allocator_slack"),
           ("external frag", "mem_external_frag"), ("free (idle)", "mem_free_idle")]
    rows = [
        ("system", s.get("system")), ("completed / rejected", f"{s['completed']} / {s['rejected']}"),
        ("duration (sim)", f"{s['duration_s']:.1f} s"),
        ("tokens in / out", f"{s['total_input_tokens']} / {s['total_output_tokens']}"),
        ("request throughput", f"{s['request_throughput']:.3f} req/s"),
    ]
    if "request_goodput" in s:
        rows.append(("request goodput", f"{s['request_goodput']:.3f} req/s"))
    rows.append(("output throughput", f"{s['output_throughput']:.1f} tok/s"))
    for metric, label in LATENCY_ROWS:
        words = [f"p{percentile_word(p)}" for p in options.percentiles] if metric in options.percentile_metrics else []
        names = ["mean", "std"] + words
        values = [s[f"mean_{metric}_ms"], s[f"std_{metric}_ms"]] + [s[f"{w}_{metric}_ms"] for w in words]
        rows.append((f"{label} {' / '.join(names)}", " / ".join(f"{v:.1f}" for v in values) + " ms"))
    rows += [
        ("normalized latency", f"{s['normalized_latency_s_per_token']:.4f} s/token"),
        ("peak concurrent requests", s["max_concurrent_requests"]),
        ("avg batch size", f"{s['avg_batch_size']:.2f}"), ("preemptions", s["num_preemptions"]),
        ("KV capacity", f"{s['kv_capacity_tokens']} tokens"),
    ]
    if "prefix_cache_hit_rate" in s:
        rows.append(("prefix cache hit rate", f"{100 * s['prefix_cache_hit_rate']:.1f} %"))
    rows += [(f"KV {name}", f"{100 * s[key]:.1f} %") for name, key in mem]
    if "cost_model" in s:
        rows.append(("cost model", describe_band(s, s["gpu"])))
    rows.append(("wall time", f"{s['wall_time_s']:.2f} s ({s.get('engine', 'python')} engine)"))
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}", file=f)
