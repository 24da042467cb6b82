"""`pagesim trace`: inspect (``stats``), synthesize (``synth``) and convert (``convert``) request traces."""

from __future__ import annotations

import json
import logging

import numpy as np

from pagesim.sim.cli import HelpFormatter, example
from pagesim.sim.errors import ConfigError
from pagesim.sim.terminal import fill
from pagesim.traces.args import (DEFAULT_DURATION_S, DEFAULT_RATE, _positive_float, _positive_int, add_arrival_args,
                                 add_trace_file_args, check_arrival_args, seed_int)
from pagesim.traces.names import WORKLOADS

LOG = logging.getLogger(__name__)  # a line per phase of the long commands (beam-search)

SHARED = "../shared/traces"


# the readers, generators and statistics are imported where a command runs: ``pagesim --help``
# and shell completion build this parser, and pandas alone takes a quarter of a second


def _load(path: str, args):
    """A trace file, or ``builtin:NAME`` (10,000 requests of a built-in workload at 2 req/s)."""
    from pagesim.traces.loaders import load_trace
    from pagesim.traces.synth import make_workload

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
    p.add_argument("--seed", type=seed_int, default=0, help="seed for --spread-timestamps")


def cmd_stats(args) -> int:
    from pagesim.traces.stats import format_stats, trace_stats

    df = _load(args.path, args)
    st = trace_stats(df)
    if args.json:
        print(json.dumps(dict(path=args.path, **st)))
    else:
        print(format_stats(st, title=args.path))
    return 0


def cmd_synth(args) -> int:
    from pagesim.traces.loaders import write_trace
    from pagesim.traces.synth import make_workload

    check_arrival_args(args)
    duration = args.duration
    if duration is None and args.num_requests is None:
        duration = DEFAULT_DURATION_S
    from pagesim.sim.run_memory import check_synthetic_workload

    rate = args.rate if args.rate is not None else DEFAULT_RATE
    check_synthetic_workload(rate, duration, args.num_requests)  # (the table must fit in memory, as simulate's)
    df = make_workload(args.workload, args.rate if args.rate is not None else DEFAULT_RATE, duration_s=duration,
                       num_requests=args.num_requests, seed=args.seed, arrival=args.arrival, cv=args.cv,
                       n=args.n or 1, beam_width=args.beam_width or 1,
                       prompt_dist=args.prompt_dist, output_dist=args.output_dist)
    out = write_trace(df, args.out)
    print(fill(f"wrote {len(df):,} requests ({args.workload}) to {out}"))
    return 0


def cmd_convert(args) -> int:
    from pagesim.traces.loaders import write_trace

    df = _load(args.path, args)
    out = write_trace(df, args.out)
    rep = df.attrs.get("load_report", {})
    dropped = sum(rep.get("rows_dropped", {}).values())
    print(fill(f"wrote {len(df):,} requests to {out} (read {rep.get('rows_read', len(df)):,}, dropped {dropped}, "
               f"out of order {rep.get('rows_resorted', 0)})"))
    return 0


def cmd_beam_search(args) -> int:
    from pagesim.traces import beam_search as bs
    from pagesim.traces.synth import paper_lengths

    if args.corpus:
        try:
            text = open(args.corpus, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--corpus {args.corpus}: cannot read it as UTF-8 text ({e.__class__.__name__})")
    else:
        text = bs.builtin_corpus()
    tokens = bs.tokenize(text)
    if len(tokens) < 1000:
        raise ConfigError(f"--corpus {args.corpus}: {len(tokens)} tokens; a trigram model needs at least 1000")
    model = bs.TrigramModel(tokens)
    if max(args.width) > len(model.vocab):  # a step keeps the width best continuations of the vocabulary
        raise ConfigError(f"--width {max(args.width)}: the corpus has {len(model.vocab):,} token types; a beam "
                          "search keeps at most that many beams")
    rng = np.random.default_rng(args.seed)
    prompt, output = paper_lengths(args.workload, args.num_requests, rng)
    output = np.minimum(output, args.max_output)
    requests = bs.draw_requests(model, model.ids(tokens), prompt, output, rng)
    print(fill(f"beam search over a Kneser-Ney trigram model ({len(tokens):,} tokens, {len(model.vocab):,} types), "
               f"{args.num_requests} {args.workload} requests (seed {args.seed}); lags in steps, shares of beams"))
    studies = []
    for w in args.width:  # a minute or two each at the default size: a line per width
        LOG.info("beam search at width %d over %d requests", w, len(requests))
        studies.append(bs.study(model, requests, w, args.block_size))
    bins = " ".join(f"{lo}-{hi if hi < 10 ** 9 else ''}" for lo, hi in bs.STEP_BINS)
    for st in studies:
        q = " / ".join(f"{x:.2f}" for x in st.shared_prefix_quantiles)
        print(fill(f"width {st.width}: death rate {st.death_rate:.3f} per beam-step; by "
                   f"step ({bins}): {' '.join(f'{x:.2f}' for x in st.death_rate_by_step)}"))
        print(fill(f"shared generated prefix (all beams) / generated: mean {st.shared_prefix_fraction:.2f}, "
                   f"p10 / p50 / p90 {q}; distinct ancestors at lag {', '.join(map(str, bs.LAGS))}: "
                   f"{' '.join(f'{x:.2f}' for x in st.lineages_by_lag)}; block saving {100 * st.block_saving:.1f}%",
                   first="  ", rest="    "))
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
    y.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed: identical output)")
    y.add_argument("-o", "--out", required=True, metavar="FILE", help="output: .csv, .parquet or .jsonl")
    y.set_defaults(func=cmd_synth)

    c = tsub.add_parser("convert", help="Convert any supported trace to canonical CSV / Parquet / JSONL",
                        formatter_class=HelpFormatter,
                        description="Read a trace (any format) and write the canonical columns request_id, arrival_s, "
                                    "prompt_tokens, output_tokens[, n, beam_width, priority, prefix_hashes]; the output format "
                                    "follows the extension (.parquet, .jsonl, else CSV with prefix_hashes as "
                                    "space-separated ints).",
                        epilog=example(f"pagesim trace convert {SHARED}/mooncake_conversation_trace.jsonl "
                                       "--spread-timestamps -o mooncake.parquet"))
    _add_input_args(c)
    c.add_argument("-o", "--out", required=True, metavar="FILE", help="output: .csv, .parquet or .jsonl")
    c.set_defaults(func=cmd_convert)

    b = tsub.add_parser("beam-search", help="Run a real beam search (trigram model, CPU): its deaths, sharing, block saving",
                        formatter_class=HelpFormatter,
                        description="Beam search over an interpolated Kneser-Ney trigram model trained on the "
                                    "Python docs CPython ships (pydoc_data.topics; or --corpus), from prompts cut "
                                    "from the corpus with the workload's lengths: the search whose records the "
                                    "simulator's beams follow (sim/beam_lineage.py). Prints per width the share of "
                                    "beams that die per step, how much the beams share, and their KV block saving "
                                    "under copy-on-write forks (traces/beam_search.py).",
                        epilog=example("pagesim trace beam-search --width 2 4 6 --num-requests 60",
                                       "pagesim trace beam-search --workload sharegpt --width 4 --num-requests 20"))
    b.add_argument("--workload", choices=("alpaca", "sharegpt"), default="alpaca", help="prompt and output lengths")
    b.add_argument("--width", type=_positive_int, nargs="+", default=[2, 4, 6], help="beam widths")
    b.add_argument("--num-requests", type=_positive_int, default=60, metavar="N", help="beam searches per width")
    b.add_argument("--max-output", type=_positive_int, default=2048, metavar="TOKENS", help="cap on output lengths")
    b.add_argument("--block-size", type=_positive_int, default=16, metavar="TOKENS", help="KV block size")
    b.add_argument("--corpus", metavar="FILE", default=None, help="UTF-8 text to train on (default: pydoc_data)")
    b.add_argument("--seed", type=seed_int, default=0, help="random seed (prompts and lengths)")
    b.set_defaults(func=cmd_beam_search)
