"""`pagesim trace`: inspect (``stats``), synthesize (``synth``) and convert (``convert``) request traces."""

from __future__ import annotations

import json

from pagesim.sim.cli import HelpFormatter, example
from pagesim.traces.args import (DEFAULT_DURATION_S, DEFAULT_RATE, _positive_float, _positive_int, add_arrival_args,
                                 add_trace_file_args)
from pagesim.traces.loaders import load_trace, write_trace
from pagesim.traces.names import WORKLOADS
from pagesim.traces.stats import format_stats, trace_stats
from pagesim.traces.synth import make_workload

SHARED = "../shared/traces"


def _load(path: str, args):
    """A trace file, or ``builtin:NAME`` (10,000 requests of a built-in workload at 2 req/s)."""
    if path.startswith("builtin:"):
        return make_workload(path.split(":", 1)[1], 2.0, num_requests=10_000, seed=getattr(args, "seed", 0))
    return load_trace(path, format=args.format, columns=args.columns, time_unit=args.time_unit,
                      hash_block_tokens=args.hash_block_tokens,
                      spread_timestamps=getattr(args, "spread_timestamps", False), seed=getattr(args, "seed", 0))


def _add_input_args(p) -> None:
    p.add_argument("path", metavar="PATH", help="trace file (or builtin:sharegpt / builtin:alpaca)")
    add_trace_file_args(p)
    p.add_argument("--spread-timestamps", action="store_true",
                   help="spread requests sharing a quantized timestamp uniformly within the step (Mooncake)")
    p.add_argument("--seed", type=int, default=0, help="seed for --spread-timestamps")


def cmd_stats(args) -> int:
    df = _load(args.path, args)
    st = trace_stats(df)
    if args.json:
        print(json.dumps(dict(path=args.path, **st)))
    else:
        print(format_stats(st, title=args.path))
    return 0


def cmd_synth(args) -> int:
    duration = args.duration
    if duration is None and args.num_requests is None:
        duration = DEFAULT_DURATION_S
    df = make_workload(args.workload, args.rate if args.rate is not None else DEFAULT_RATE, duration_s=duration,
                       num_requests=args.num_requests, seed=args.seed, arrival=args.arrival, cv=args.cv,
                       n=args.n or 1, beam_width=args.beam_width or 1,
                       prompt_dist=args.prompt_dist, output_dist=args.output_dist)
    out = write_trace(df, args.out)
    print(f"wrote {len(df):,} requests ({args.workload}) to {out}")
    return 0


def cmd_convert(args) -> int:
    df = _load(args.path, args)
    out = write_trace(df, args.out)
    rep = df.attrs.get("load_report", {})
    dropped = sum(rep.get("rows_dropped", {}).values())
    print(f"wrote {len(df):,} requests to {out} (read {rep.get('rows_read', len(df)):,}, dropped {dropped}, "
          f"out of order {rep.get('rows_resorted', 0)})")
    return 0


def register(sub) -> None:
    p = sub.add_parser("trace", help="Inspect, synthesize and convert request traces", formatter_class=HelpFormatter,
                       description="Inspect (stats), synthesize (synth) and convert (convert) request traces. "
                                   "Formats: azure, mooncake, burstgpt, lengths, canonical, generic "
                                   "(see traces/loaders.py).",
                       epilog=example(f"pagesim trace stats {SHARED}/AzureLLMInferenceTrace_conv.csv",
                                      "pagesim trace synth --workload sharegpt --rate 2 --duration 3600 -o sharegpt.csv"))
    p.set_defaults(func=lambda args: p.print_help() or 2)
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")

    s = tsub.add_parser("stats", help="Rows, duration, rate, token percentiles and burstiness of a trace",
                        formatter_class=HelpFormatter,
                        description="Print a trace's rows, duration, mean rate ((rows-1)/span), inter-arrival CV "
                                    "and mean/p50/p90/p99/max prompt and output tokens.",
                        epilog=example(f"pagesim trace stats {SHARED}/AzureLLMInferenceTrace_conv.csv --json",
                                       "pagesim trace stats builtin:sharegpt"))
    _add_input_args(s)
    s.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    s.set_defaults(func=cmd_stats)

    y = tsub.add_parser("synth", help="Write a synthetic workload (ShareGPT/Alpaca-like or custom) as a trace",
                        formatter_class=HelpFormatter,
                        description="Generate a seeded synthetic workload. Built-in workloads reproduce the vLLM "
                                    "paper's ShareGPT (161.31/337.99 tokens) and Alpaca (19.31/58.45) means. "
                                    "--prompt-dist/--output-dist replace either side; with --workload custom "
                                    "both are required. Distribution specs: constant:V, uniform:low=A,high=B, "
                                    "lognormal:mean=M,sigma=S, exponential:mean=M, empirical:TRACE_FILE.",
                        epilog=example("pagesim trace synth --workload sharegpt --rate 2 --duration 3600 --seed 0 "
                                       "-o sharegpt.csv",
                                       "pagesim trace synth --workload custom --prompt-dist lognormal:mean=500,sigma=1 "
                                       "--output-dist exponential:mean=200 --arrival gamma --cv 3 --num-requests 1000 "
                                       "-o bursty.parquet",
                                       "pagesim trace synth --workload sharegpt --rate 2 --duration 600 --burstiness 0.25 "
                                       "-o vllm_bursty.csv"))
    y.add_argument("--workload", choices=WORKLOADS, default="sharegpt", help="length statistics")
    y.add_argument("--rate", type=_positive_float, default=None, help=f"requests/s (unset: {DEFAULT_RATE})")
    y.add_argument("--duration", type=_positive_float, default=None, metavar="SECONDS",
                   help=f"seconds of arrivals (unset: {DEFAULT_DURATION_S:g} unless --num-requests)")
    y.add_argument("--num-requests", type=_positive_int, default=None, metavar="N", help="number of requests")
    add_arrival_args(y)
    y.add_argument("--prompt-dist", metavar="SPEC", help="prompt length distribution (e.g. lognormal:mean=500,sigma=1)")
    y.add_argument("--output-dist", metavar="SPEC", help="output length distribution (e.g. exponential:mean=200)")
    y.add_argument("--n", type=_positive_int, default=None, help="parallel samples per request (unset: 1)")
    y.add_argument("--beam-width", type=_positive_int, default=None, help="beam width (unset: 1)")
    y.add_argument("--seed", type=int, default=0, help="random seed (same seed: identical output)")
    y.add_argument("-o", "--out", required=True, metavar="FILE", help="output: .csv, .parquet or .jsonl")
    y.set_defaults(func=cmd_synth)

    c = tsub.add_parser("convert", help="Convert any supported trace to canonical CSV / Parquet / JSONL",
                        formatter_class=HelpFormatter,
                        description="Read a trace (any format) and write the canonical columns request_id, arrival_s, "
                                    "prompt_tokens, output_tokens[, n, beam_width, prefix_hashes]; the output format "
                                    "follows the extension (.parquet, .jsonl, else CSV with prefix_hashes as "
                                    "space-separated ints).",
                        epilog=example(f"pagesim trace convert {SHARED}/mooncake_conversation_trace.jsonl "
                                       "--spread-timestamps -o mooncake.parquet"))
    _add_input_args(c)
    c.add_argument("-o", "--out", required=True, metavar="FILE", help="output: .csv, .parquet or .jsonl")
    c.set_defaults(func=cmd_convert)
