"""``pagesim simulate``: one simulation run, written to a folder and summarized on screen.

It lives here, at the top of the layers, because it joins them: a trace (``traces``), the
simulator (``sim``) and, with ``--report``, the report renderer (``reports``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pagesim.sim.args import (add_sim_args, add_summary_args, config_from_args, defaults_line, summary_options_from_args,
                             take_todays_defaults)
from pagesim.sim.cli import HelpFormatter, example
from pagesim.sim.cost.calibration import describe_band, run_error_band
from pagesim.sim.errors import ConfigError
from pagesim.sim.metrics import overload_words, percentile_word
from pagesim.sim.outdir import staged_folder
from pagesim.sim.terminal import fill, key_value_lines
from pagesim.traces.args import (DEFAULT_DURATION_S, DEFAULT_RATE, _positive_float, add_workload_args,
                                 workload_from_args)


def register(sub) -> None:
    p = sub.add_parser(
        "simulate", help="run one simulation and write summary.json, requests.csv, steps.csv",
        formatter_class=HelpFormatter,
        description="Replay a workload through one serving system and report throughput, latency and where "
                    "every KV slot went (token states, reservation, internal/external fragmentation).",
        epilog=example("pagesim simulate --workload sharegpt --rate 2 --duration 600 --system vllm --out out/vllm",
                       "pagesim simulate --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv "
                       "--model llama-2-13b --gpu a100-80gb --system orca-pow2 --max-len-policy drop --out out/azure --report",
                       "pagesim simulate --workload sharegpt --rate 20 --duration 600 --system vllm --prefix-caching "
                       "--replicas 8 --router prefix-affinity --out out/cluster",
                       "pagesim simulate --workload sharegpt --rate 8 --num-requests 200 --model llama-2-13b "
                       "--replica-gpus h100-80gb:1,a100-80gb:2 --router least-outstanding-requests"))

    add_workload_args(p)
    add_sim_args(p)
    c = p.add_argument_group("cluster (sim/core/events/cluster.py)")
    c.add_argument("--replicas", type=int, default=None, metavar="K",
                   help="K replicas of the system, each its own KV pool, scheduler and cost model, behind a router "
                        "(default 1: a single engine)")
    c.add_argument("--replica-gpus", default=None, metavar="GPU:COUNT,...",
                   help="each replica its own GPU, e.g. h100-80gb:2,a100-80gb:6 (replicas 0-1 on H100s, 2-7 on "
                        "A100s): each GPU's KV pool, cost model and vLLM v1 batch defaults; the same model and "
                        "settings everywhere. Replaces --gpu; the counts make --replicas (if given, it must agree)")
    c.add_argument("--router", default=None, metavar="NAME",
                   help="how arrivals are spread over the replicas: round-robin (default), least-outstanding-requests, "
                        "least-kv-usage, prefix-affinity (needs --prefix-caching)")
    c.add_argument("--router-slack", type=float, default=None, metavar="S",
                   help="prefix-affinity's load bound: a replica holding the prefix is passed over when its "
                        "outstanding requests exceed (1 + S) x the mean (default 0.5)")
    d = p.add_argument_group("disaggregated prefill and decode (sim/core/events/disagg.py)")
    d.add_argument("--prefill-replicas", type=int, default=None, metavar="P",
                   help="P prefill replicas and --decode-replicas D decode replicas (vllm-v1): each request is "
                        "prefilled on one, its KV moved over --kv-link, and decoded on the other")
    d.add_argument("--decode-replicas", type=int, default=None, metavar="D", help="D decode replicas")
    d.add_argument("--prefill-gpu", default=None, metavar="GPU", help="the prefill replicas' GPU (default --gpu)")
    d.add_argument("--decode-gpu", default=None, metavar="GPU", help="the decode replicas' GPU (default --gpu)")
    d.add_argument("--prefill-tp", type=int, default=None, metavar="N",
                   help="the prefill replicas' tensor parallelism (default --tp)")
    d.add_argument("--decode-tp", type=int, default=None, metavar="N",
                   help="the decode replicas' tensor parallelism (default --tp)")
    d.add_argument("--kv-link", default=None, metavar="NAME",
                   help="what carries the KV to each decode replica: ib-ndr (default), ib-hdr, roce-400, "
                        "roce-200, roce-100, nvlink, pcie (sim/specs/links.py)")
    d.add_argument("--kv-link-gbps", type=_positive_float, default=None, metavar="GBPS",
                   help="the link's rate per GPU in Gb/s instead of the preset's (a measured one)")
    d.add_argument("--first-token", default=None, choices=["decode", "prefill"],
                   help="whose token the client sees first: decode (default; vLLM's proxy) or "
                        "prefill (DistServe's: the prefill side streams it, sim/disagg.py)")
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="DIR", default=None, help="folder for summary.json, requests.csv, steps.csv")
    o.add_argument("--requests-format", choices=["csv", "parquet"], default="csv")
    o.add_argument("--no-steps", action="store_true", help="keep only running sums, not one row per iteration")
    o.add_argument("--report", action="store_true", help="also write DIR/report.html")
    o.add_argument("--check", action="store_true", default=None,
                   help="after every iteration, recompute the core's state from scratch and assert its "
                        "invariants (slow)")
    o.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    add_summary_args(p)
    o.add_argument("--progress", dest="progress", action=argparse.BooleanOptionalAction, default=True,
                   help="progress bar on runs longer than 2 s")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # here, not at the top: the core and the model presets (numba, about 0.6 s) that ``simulate --help`` need not load
    from pagesim.sim.cluster import DEFAULT_SLACK, check_cluster, run_cluster
    from pagesim.sim.limits import check_replicas
    from pagesim.sim.run_memory import check_synthetic_workload
    from pagesim.sim.requests import RequestTable
    from pagesim.sim.run import jsonable, prepare, resolve_budget, run_prepared

    if args.report and not args.out:  # the report is a file in DIR
        raise ConfigError("--report needs --out DIR (the report is DIR/report.html)")
    fixed = {"record_steps": False} if args.no_steps else {}
    summary_options = summary_options_from_args(args)
    gpus_named = any(getattr(args, f) is not None for f in ("replica_gpus", "prefill_gpu", "decode_gpu"))
    args.defaults_taken = take_todays_defaults(args, skip=("gpu",) if gpus_named else ())
    if disaggregated(args):
        return run_disaggregated_from_args(args, fixed, summary_options)
    cfg = config_from_args(args, **fixed)
    replicas = 1 if args.replicas is None else args.replicas
    if args.replica_gpus is not None:
        replicas = replica_groups_from_args(args, fixed)
        cfg = replicas[0][0]
    clustered = replicas != 1 or args.router is not None or args.router_slack is not None
    if clustered:
        router = args.router or "round-robin"
        slack = DEFAULT_SLACK if args.router_slack is None else args.router_slack
        groups = check_cluster(replicas, router, slack, cfg)
        check_replicas([(c, *_model_and_capacity(c), count) for c, count in groups],
                       "--replica-gpus" if args.replica_gpus is not None else "--replicas")
        if args.report:
            raise ConfigError("--report draws one engine; it is not available with --replicas or --router")
    model, _gpu, _budget = resolve_budget(groups[0][0] if clustered else cfg)  # a rank of an EP group
    if not args.trace:
        duration = args.duration if args.duration is not None or args.num_requests is not None else DEFAULT_DURATION_S
        check_synthetic_workload(args.rate if args.rate is not None else DEFAULT_RATE, duration, args.num_requests,
                                 cfg=cfg)
    trace, workload = workload_from_args(args, model.max_seq_len, cfg.max_len_policy)
    say_defaults(args, [c for c, _ in groups] if clustered else [cfg])
    if clustered:
        result = run_cluster(cfg, trace, replicas, router, slack, summary_options=summary_options)
        for s in result.replica_summaries:  # each replica's cost model is its GPU's
            s.update(run_error_band(cfg, s["gpu"]))
    else:
        table = RequestTable(trace)
        del trace  # (its columns are the request table's now, before the core's are made: run_prepared)
        result = run_prepared(cfg, prepare(cfg, table), progress=args.progress and not args.json,
                              summary_options=summary_options)
    result.summary["workload"] = workload
    if clustered and len(set(result.summary["gpu_per_replica"])) > 1:  # each replica's summary has its GPU's
        result.summary.update(cost_model=cfg.cost_model, cost_error="per GPU: see replicas.json")
    else:
        result.summary.update(run_error_band(cfg, result.summary["gpu"]))
    if args.out:
        with staged_folder(args.out) as staged:
            result.save(staged, args.requests_format)
            if args.report:
                from pagesim.experiments.report_pages import single_run_report  # plotly, for --report only

                single_run_report(result, staged / "report.html")
    if args.json:
        print(json.dumps(jsonable({k: v for k, v in result.summary.items()})))
    else:
        print_summary(result.summary, sys.stdout, summary_options)
        if args.out:
            print("\n" + fill(f"wrote {Path(args.out) / 'summary.json'}, requests.{args.requests_format}, steps.csv"
                              + (", replicas.json" if clustered else "") + (", report.html" if args.report else "")))
    return 0


def _model_and_capacity(cfg) -> tuple:
    """``cfg``'s model and KV pool tokens (its budget, checked)."""
    from pagesim.sim.run import resolve_budget

    model, _gpu, budget = resolve_budget(cfg)
    return model, budget.capacity_tokens


#: the flags of a disaggregated run alone
DISAGG_FLAGS = ("prefill_replicas", "decode_replicas", "prefill_gpu", "decode_gpu", "prefill_tp", "decode_tp",
                "kv_link", "kv_link_gbps", "first_token")


def disaggregated(args: argparse.Namespace) -> bool:
    """A disaggregated run was asked for; its flags without one refused in one line."""
    given = [f for f in DISAGG_FLAGS if getattr(args, f) is not None]
    if not given:
        return False
    if args.prefill_replicas is None or args.decode_replicas is None:
        flag = "--" + given[0].replace("_", "-")
        raise ConfigError(f"{flag} is for a disaggregated run: give both --prefill-replicas and --decode-replicas")
    for flag, value in (("--replicas", args.replicas), ("--replica-gpus", args.replica_gpus),
                        ("--router-slack", args.router_slack), ("--report", args.report or None)):
        if value is not None:
            raise ConfigError(f"{flag} is not available with --prefill-replicas/--decode-replicas "
                              "(each pool's replicas and GPU are given by the --prefill-*/--decode-* flags)")
    return True


def run_disaggregated_from_args(args: argparse.Namespace, fixed: dict, summary_options) -> int:
    """``simulate --prefill-replicas P --decode-replicas D``: the two pools' configurations
    (--gpu/--tp unless --prefill-*/--decode-* say otherwise), run and reported."""
    from pagesim.sim.disagg import check_disagg, run_disaggregated
    from pagesim.sim.limits import check_replicas

    pools = []
    for side in ("prefill", "decode"):
        pool = dict(fixed)
        gpu, tp = getattr(args, f"{side}_gpu"), getattr(args, f"{side}_tp")
        if gpu is not None:
            pool["gpu"] = gpu
        if tp is not None:
            pool["tensor_parallel"] = tp
        pools.append(config_from_args(args, **pool))
    prefill_cfg, decode_cfg = pools
    router, link = args.router or "round-robin", args.kv_link or "ib-ndr"
    first_token = args.first_token or "decode"
    check_disagg(prefill_cfg, decode_cfg, args.prefill_replicas, args.decode_replicas, router, link,
                 first_token)
    check_replicas([(prefill_cfg, *_model_and_capacity(prefill_cfg), args.prefill_replicas),
                    (decode_cfg, *_model_and_capacity(decode_cfg), args.decode_replicas)],
                   "--prefill-replicas + --decode-replicas")
    trace, workload = workload_from_args(args, min(resolve_model(prefill_cfg), resolve_model(decode_cfg)),
                                         prefill_cfg.max_len_policy)
    say_defaults(args, [prefill_cfg, decode_cfg])
    result = run_disaggregated(prefill_cfg, decode_cfg, trace, args.prefill_replicas, args.decode_replicas,
                               router, link, args.kv_link_gbps, summary_options, first_token)
    for s in result.replica_summaries:  # each replica's cost model is its GPU's
        s.update(run_error_band(prefill_cfg, s["gpu"]))
    result.summary["workload"] = workload
    if prefill_cfg.gpu == decode_cfg.gpu:
        result.summary.update(run_error_band(prefill_cfg, result.summary["prefill_gpu"]))
    else:
        result.summary.update(cost_model=prefill_cfg.cost_model, cost_error="per GPU: see replicas.json")
    if args.out:
        with staged_folder(args.out) as staged:
            result.save(staged, args.requests_format)
    if args.json:
        from pagesim.sim.run import jsonable

        print(json.dumps(jsonable(result.summary)))
    else:
        print_summary(result.summary, sys.stdout, summary_options)
        if args.out:
            print("\n" + fill(f"wrote {Path(args.out) / 'summary.json'}, requests.{args.requests_format}, "
                              "steps.csv, replicas.json"))
    return 0


def say_defaults(args: argparse.Namespace, cfgs: list) -> None:
    """The first line of the output, once the run's settings and workload are checked and the cost
    model of each of ``cfgs`` built (a profile that cannot be read: its error line alone): the
    defaults a bare command took (``sim.args.TODAYS_DEFAULTS``) and how to change them."""
    if args.defaults_taken:
        from pagesim.sim.run import config_cost_model

        for cfg in cfgs:
            config_cost_model(cfg)
        print(defaults_line(args.defaults_taken), file=sys.stderr if args.json else sys.stdout, flush=True)


def resolve_model(cfg) -> int:
    """The longest sequence ``cfg``'s model takes (a pool's budget checked on the way)."""
    from pagesim.sim.run import resolve_budget

    return resolve_budget(cfg)[0].max_seq_len


def replica_groups_from_args(args: argparse.Namespace, fixed: dict) -> list:
    """``--replica-gpus``: one configuration per GPU (the same flags, that GPU: its own vLLM v1
    batch defaults follow), with its count; refused in one line where it contradicts a flag."""
    from pagesim.sim.cluster import parse_replica_gpus

    if args.gpu is not None:
        raise ConfigError("give --gpu or --replica-gpus, not both (--replica-gpus names every replica's GPU)")
    gpus = parse_replica_gpus(args.replica_gpus)
    total = sum(count for _, count in gpus)
    if args.replicas is not None and args.replicas != total:
        raise ConfigError(f"--replica-gpus {args.replica_gpus} makes {total} replicas, but --replicas is "
                          f"{args.replicas}; leave --replicas out or make them agree")
    return [(config_from_args(args, **fixed, gpu=gpu), count) for gpu, count in gpus]


#: the latency rows of the printed summary: (metric, label)
LATENCY_ROWS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))


def workload_rows(workload: dict) -> list[tuple[str, str]]:
    """What happened to the trace's requests before the run, said where the summary is read:
    rows a loader dropped (a failed request in BurstGPT), requests the max-length policy dropped
    or clipped, each with the setting that would keep them."""
    rows = []
    for why, count in workload.get("load_report", {}).get("rows_dropped", {}).items():
        rows.append(("dropped by the loader", f"{count:,} rows: {why}"))
    cut = workload.get("max_len", {})
    if cut.get("affected"):
        total = workload.get("rows", 0) + cut["dropped"]
        done = "dropped" if cut["dropped"] else "clipped"
        keep = ("a model with a longer context runs them, or --max-len-policy truncate or clip-prompt keeps "
                "them shortened" if cut["dropped"] else "a model with a longer context runs them whole")
        rows.append((f"{done} as too long", f"{cut['affected']:,} of {total:,} requests over {cut['max_seq_len']:,} "
                                           f"tokens (--max-len-policy {cut['policy']}): {keep}"))
    return rows


def print_summary(s: dict, f, options) -> None:
    """The summary as a table; ``options`` (:class:`SummaryOptions`) name the percentiles it holds."""
    mem = [("token states", "mem_token_states"), ("reservation", "mem_reservation"),
           ("internal frag", "mem_internal_frag"), ("allocator slack", "mem_allocator_slack"),
           ("external frag", "mem_external_frag"), ("free (idle)", "mem_free_idle")]
    if "spec_acceptance_rate" in s:  # today's engines' own categories, where the run has them
        mem.append(("speculative slack", "mem_speculative_slack"))
    if "mem_in_transfer" in s:
        mem.append(("in transfer", "mem_in_transfer"))
    rows = [("system", s.get("system")), ("completed / rejected", f"{s['completed']} / {s['rejected']}"),
            *workload_rows(s.get("workload", {})), ("duration (sim)", f"{s['duration_s']:.1f} s"),
        ("tokens in / out", f"{s['total_input_tokens']} / {s['total_output_tokens']}"),
        ("request throughput", f"{s['request_throughput']:.3f} req/s"),
    ]
    if "request_goodput" in s:
        rows.append(("request goodput", f"{s['request_goodput']:.3f} req/s"))
    rows.append(("output throughput", f"{s['output_throughput']:.1f} tok/s"))
    if overload_words(s):  # before the latencies it qualifies (sim.metrics.overload_summary)
        rows.append(("overloaded", overload_words(s)))
    for metric, label in LATENCY_ROWS:
        words = [f"p{percentile_word(p)}" for p in options.percentiles] if metric in options.percentile_metrics else []
        names = ["mean", "std"] + words
        values = [s[f"mean_{metric}_ms"], s[f"std_{metric}_ms"]] + [s[f"{w}_{metric}_ms"] for w in words]
        rows.append((f"{label} {' / '.join(names)}", " / ".join(f"{v:.1f}" for v in values) + " ms"))
    rows += [
        ("normalized latency", f"{s['normalized_latency_s_per_token']:.4f} s/token"),
        ("peak concurrent requests", s["max_concurrent_requests"]),
        ("avg batch size", f"{s['avg_batch_size']:.2f}"), ("preemptions", s["num_preemptions"]),
        ("KV capacity", capacity_words(s)),
    ]
    for level in s.get("by_priority", []):  # the trace's priority levels (sim.metrics.priority_classes)
        rows.append((f"priority {level['priority']}: TTFT / E2EL",
                     f"mean {level['mean_ttft_ms']:.1f} / {level['mean_e2el_ms']:.1f} ms, p99 {level['p99_ttft_ms']:.1f} / "
                     f"{level['p99_e2el_ms']:.1f} ms; {level['completed']} of {level['requests']} done, "
                     f"{level['preemptions']} preemptions"))
    if "prefix_cache_hit_rate" in s:
        rows.append(("prefix cache hit rate", f"{100 * s['prefix_cache_hit_rate']:.1f} %"))
    if "host_prefix_hit_rate" in s:  # the CPU offload tier (sim/core/kv/host_tier.py)
        rows.append(("host tier hit rate", f"{100 * s['host_prefix_hit_rate']:.1f} % past the GPU's"))
        rows.append(("host loaded / stored", f"{s['host_loaded_gib']:.2f} / {s['host_stored_gib']:.2f} GiB; "
                                             f"{s['host_blocks_used']} of {s['host_blocks']} blocks in use"))
    if "spec_acceptance_rate" in s:  # speculative decoding (sim/core/sched/speculative.py)
        rows.append(("drafts accepted / per step", f"{100 * s['spec_acceptance_rate']:.1f} % / "
                                                   f"{s['spec_accepted_per_step']:.2f} "
                                                   f"({s['spec_tokens_per_step']:.2f} tokens per step)"))
    rows += [(f"KV {name}", f"{100 * s[key]:.1f} %") for name, key in mem]
    for kind, split in s.get("kv_groups", {}).items():  # vllm-v1's KV cache groups (sim/run.py group_split)
        if isinstance(split, dict) and split["groups"]:
            rows.append((f"KV {kind} groups", f"{split['groups']}: token states {100 * split['token_states']:.1f} %, "
                         f"reservation {100 * split['reservation']:.1f} %, "
                         f"internal frag {100 * split['internal_frag']:.1f} %"))
    if "cost_model" in s:
        rows.append(("cost model", describe_band(s, s["gpu"])))
    if "replicas" in s:  # a cluster (sim/cluster.py)
        rows += [("replicas / router", f"{s['replicas']} / {s['router']}"),
                 ("GPUs (KV tokens) per replica", " ".join(f"{g} ({kv})" for g, kv in zip(
                     s["gpu_per_replica"], s.get("vllm_kv_cache_size_tokens_per_replica",
                                                 s["kv_capacity_tokens_per_replica"])))),
                 ("routed per replica", " ".join(map(str, s["routed_per_replica"]))),
                 ("routed / busy, max over mean", f"{s['routed_max_over_mean']:.3f} / {s['busy_max_over_mean']:.3f}")]
    if s.get("disaggregated"):  # sim/disagg.py
        rows += disaggregated_rows(s)
    rows.append(("wall time", f"{s['wall_time_s']:.2f} s ({s['engine']} engine)"))
    print("\n".join(key_value_lines(rows)), file=f)  # a long value (the cost model's band) wraps under itself


def capacity_words(s: dict) -> str:
    """The KV capacity row: with vLLM v1's KV cache groups, the tokens vLLM logs at start (a
    token takes a block in every group: sim.specs.kv_groups.vllm_kv_cache_size) and beside them
    the pool's slots, a token of one group's layers each (``kv_capacity_tokens``)."""
    dtype = f" ({s['kv_cache_dtype']} KV cache)" if s.get("kv_cache_dtype", "auto") != "auto" else ""
    if "vllm_kv_cache_size_tokens" not in s:
        return f"{s['kv_capacity_tokens']} tokens{dtype}"
    head = (f"{s['vllm_kv_cache_size_tokens']:,} tokens as vLLM logs it ({s['vllm_max_concurrency']:.2f} "
            f"max_seq_len requests){dtype}; ")
    if "kv_groups" not in s:  # a cluster: the replicas' sums
        return head + f"the pools: {s['kv_capacity_tokens']:,} slots, each a token of one group's layers"
    split = s["kv_groups"]
    groups = sum(kind["groups"] for kind in split.values() if isinstance(kind, dict))
    return head + (f"the pool: {s['kv_capacity_tokens']:,} slots, each a token of one group's "
                   f"{split['layers_per_group']} layers, shared by {groups} groups")


def disaggregated_rows(s: dict) -> list[tuple[str, str]]:
    """A disaggregated run's own rows: each pool, the link and transfers, the TTFT's phases."""
    rows = []
    for side in ("prefill", "decode"):
        rows.append((f"{side} pool", f"{s[side + '_replicas']} x {s[side + '_gpu']} TP {s[side + '_tensor_parallel']}: "
                                     f"busy {100 * s[side + '_utilization']:.1f} %, KV used "
                                     f"{100 * s[side + '_kv_used']:.1f} % (in transfer "
                                     f"{100 * s[side + '_kv_in_transfer']:.1f} %), mean queue "
                                     f"{s['mean_' + side + '_queue_ms']:.1f} ms"))
    rows.append(("KV link / transfers", f"{s['kv_link']} {s['kv_link_gbytes_per_s']:g} GB/s per GPU: "
                                         f"{s['transfers']} of mean {s['mean_transfer_bytes'] / 1e6:.1f} MB, "
                                         f"{s['mean_transfer_ms']:.2f} ms"))
    phases = ("prefill_queue", "prefill", "decode_admit_wait", "transfer_wait", "transfer", "decode_first_step")
    rows.append(("mean TTFT in phases", " + ".join(f"{s[f'mean_ttft_{p}_ms']:.1f}" for p in phases) + " ms ("
                 + ", ".join(p.replace("_", " ") for p in phases) + ")"))
    if "request_goodput_per_gpu" in s:
        rows.append(("goodput per GPU", f"{s['request_goodput_per_gpu']:.3f} req/s over {s['gpus']} GPUs"))
    return rows
