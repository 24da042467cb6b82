"""The command-line settings every simulation-running command shares (``simulate``, ``plan``,
``validate``): the flags that fill a :class:`~sim.config.SimConfig`, and what the summary reports."""

from __future__ import annotations

import argparse

from pagesim.sim import systems
from pagesim.sim.config import (APPEND_RULES, KV_CACHE_DTYPES, MANAGERS, PLACEMENTS, PREEMPTIONS, RESERVATIONS,
                                SCHEDULE_POLICIES, SCHEDULERS, SCHEDULING_POLICIES, SPECULATIVE_METHODS, SYSTEMS,
                                SimConfig, load_toml)
from pagesim.sim.errors import ConfigError, warn
from pagesim.sim.limits import check_drafter
from pagesim.sim.metrics import LATENCY_METRICS, SummaryOptions
from pagesim.sim.specs import GPUS, MODELS

#: CLI flag -> SimConfig field, for the settings every simulation-running command shares
SIM_FLAGS = {
    "model": dict(help=f"model preset ({', '.join(MODELS)}) or path to a Hugging Face config.json "
                       "(default opt-13b; a bare simulate or plan: llama-3.1-8b)"),
    "gpu": dict(help=f"GPU preset ({', '.join(GPUS)}; default a100-40gb, a bare simulate or plan: h100-80gb)"),
    "tensor_parallel": dict(flag="--tp", type=int, help="tensor-parallel degree (default 1)"),
    "expert_parallel": dict(action="store_true", default=None,
                            help="a mixture of experts' routed experts split whole over the GPUs, as vLLM's "
                                 "--enable-expert-parallel: the TP group's, and with --replicas K the K replicas "
                                 "are one group's data-parallel ranks (vLLM's --data-parallel-size K)"),
    "kv_gib": dict(type=float, help="KV pool size in GiB (default: GPU memory x utilization - weights - activations)"),
    "gpu_memory_utilization": dict(type=float, help="fraction of GPU memory vLLM may use (default 0.9)"),
    "max_seq_len": dict(type=int, help="maximum request length (default: the model's)"),
    "kv_cache_dtype": dict(choices=KV_CACHE_DTYPES, help="as vLLM's: auto (default, the model's dtype) or fp8 "
                                                         "(fp8_e4m3, fp8_e5m2): one byte per cached element"),
    "manager": dict(choices=MANAGERS, help="override the system's memory manager"),
    "scheduler": dict(choices=SCHEDULERS, help="override the system's scheduler"),
    "block_size": dict(type=int, help="paged block size in tokens (default 16; token: 1)"),
    "reservation": dict(choices=RESERVATIONS, help="contiguous reservation policy"),
    "placement": dict(choices=PLACEMENTS, help="contiguous placement policy (default buddy)"),
    "predictor_error": dict(type=float, help="relative error of the 'predicted' reservation's length predictor"),
    "vattention_page_kib": dict(type=int, help="vAttention physical page size per layer in KiB (64 or 2048)"),
    "watermark": dict(type=float, help="paged: fraction of blocks kept free at admission (default 0.01)"),
    "prefix_caching": dict(action=argparse.BooleanOptionalAction, default=None,
                           help="paged: share prompt blocks by hash (vllm-v1: on unless --no-prefix-caching)"),
    "append_rule": dict(choices=APPEND_RULES,
                        help="paged: what a decode step needs free; free-block-per-seq (default): vLLM v0's one "
                             "free block per running sequence (can_append_slots); exact: the blocks it takes"),
    "static_batch_size": dict(type=int, help="static batching: batch size B (default: as many max-length slots as fit)"),
    "max_num_seqs": dict(type=int, help="maximum running sequences (default 256)"),
    "max_num_batched_tokens": dict(type=int, help="prompt tokens per iteration (default max(max_seq_len, 2048))"),
    "preemption": dict(choices=PREEMPTIONS, help="vLLM preemption: recompute (default) or swap"),
    "swap_gib": dict(type=float, help="CPU swap space in GiB (default 4): --preemption swap, and requests of "
                                      "several sequences (vllm and orca swap them whatever --preemption says)"),
    "chunked_prefill": dict(action="store_true", default=None,
                            help="chunked prefill (Sarathi-Serve), as vLLM 0.4.2 schedules it: the running requests by "
                                 "arrival, then swap-ins, then new prompts, in one --chunk-budget"),
    "chunk_budget": dict(type=int, help="chunked prefill: tokens per iteration (default 512)"),
    "waiting_served_ratio": dict(type=float, help="admit new prompts only when waiting/running reaches this"),
    "schedule_policy": dict(choices=SCHEDULE_POLICIES, help="sglang: waiting-queue order, fcfs (SGLang's default) or "
                                                        "lpm (longest cached prefix first while <= 128 wait)"),
    "scheduling_policy": dict(choices=SCHEDULING_POLICIES,
                              help="vllm-v1: the waiting order and a preemption's victim: " + "; ".join(
                                  f"{name} ({policy.words})" for name, policy in systems.SCHEDULING_POLICIES.items())),
    "async_scheduling": dict(action=argparse.BooleanOptionalAction, default=None,
                             help="vllm-v1: schedule step N+1 while step N runs, as vLLM does by default: a request "
                                  "arriving during a step waits one more (default on for vllm-v1)"),
    "client_timeout_s": dict(flag="--client-timeout", type=float, metavar="S",
                             help="vllm-v1: a client gives up on its request after S seconds, and vLLM aborts it "
                                  "(counted as rejected; default: clients wait forever)"),
    "num_speculative_tokens": dict(type=int, metavar="K",
                                   help="vllm-v1: speculative decoding, K drafts verified per decode step "
                                        "(default 0: off)"),
    "speculative_method": dict(choices=SPECULATIVE_METHODS,
                               help="vllm-v1 with K > 0: how drafts are proposed, as it prices the drafter and "
                                    "allocates its lookahead slots (default ngram)"),
    "spec_acceptance_rate": dict(type=float, metavar="A",
                                 help="vllm-v1 with K > 0: the chance each draft is accepted once those before "
                                      "it were (default 0.7)"),
    "spec_acceptance_rates": dict(metavar="A1,A2,...",
                                  help="vllm-v1 with K > 0: one acceptance rate per draft position instead"),
    "draft_model": dict(metavar="MODEL", help="vllm-v1 --speculative-method draft-model: the draft's model preset"),
    "kv_offload_gib": dict(type=float, metavar="N",
                           help="vllm-v1 with prefix caching: a CPU offload tier of N GiB of host memory for KV "
                                "blocks, as vLLM's --kv-offloading-size; sglang: HiCache's host tier of N GiB, "
                                "as its --hicache-size (default 0: none)"),
    "schedule_conservativeness": dict(type=float, help="sglang: scales its initial new_token_ratio 0.7 (default 1)"),
    "ignore_eos": dict(action=argparse.BooleanOptionalAction, default=None,
                       help="sglang: requests run to their trace output, as benchmark clients send them "
                            "(ignore_eos), so its prefill budget charges running requests' remaining outputs "
                            "whole; --no-ignore-eos: at its new_token_ratio, as for requests that may stop "
                            "at EOS earlier (default on)"),
    "cost_model": dict(choices=["roofline", "calibrated", "serving"],
                       help="roofline (the default, but for vllm-v1: serving); calibrated: the roofline with "
                            "constants fitted on measured "
                            "GPU timings per operation (sim/data/calibration/<gpu>.toml); serving: fitted end to "
                            "end on real vLLM serving runs (sim/data/serving/<gpu>.toml: h100-80gb)"),
    "cost_scale": dict(type=float, help="multiply the cost model's GPU time (CPU overheads kept): a what-if, and "
                                        "how plan's error band reruns at the scales of the measured error (default 1)"),
    "profile": dict(help="profile CSV from 'pagesim gpu calibrate' or 'pagesim cost import' (table cost model "
                         "instead of roofline)"),
    "step_overhead_ms": dict(type=float, help="fixed per-iteration overhead in ms (default 3)"),
    "per_seq_overhead_ms": dict(type=float, help="per-sequence CPU overhead per iteration in ms (default 0.02)"),
}


def flag_of(setting: str) -> str:
    """The command-line flag that gives ``setting``."""
    return SIM_FLAGS.get(setting, {}).get("flag", "--" + setting.replace("_", "-"))


def check_settings_apply(configs: list[SimConfig], flags: set[str], from_file: set[str], file: str | None) -> None:
    """Refuse a flag in ``flags`` that does nothing for any of ``configs`` (one per system a
    command runs: ``plan`` compares several, and a setting for some of them is fine), in one line
    naming it and where it applies; warn about such a setting in ``from_file`` (the --config
    file ``file``)."""
    for name in systems.placed_settings():  # where each applies: the registry's (sim/systems.py)
        if name not in flags | from_file or any(systems.applies(c, name) or getattr(c, name) is False
                                                for c in configs):
            continue  # (False: a feature turned off applies anywhere)
        ran = ", ".join(f"'{c.system}' (manager {c.manager}, scheduler {c.scheduler})" for c in configs)
        what = f"{flag_of(name)[2:]} does nothing for system {ran}: it applies to {systems.where_it_applies(name)}"
        if name in flags:
            raise ConfigError(f"--{what}; drop it")
        warn(f"{file}: {what}; ignored")


def add_sim_args(p: argparse.ArgumentParser, *, system: bool = True) -> None:
    g = p.add_argument_group("system and hardware")
    if system:
        g.add_argument("--system", default=None, choices=list(SYSTEMS), metavar="SYSTEM",
                       help="named combination of manager + scheduler: " + ", ".join(SYSTEMS)
                       + " (default vllm; a bare simulate: vllm-v1 on llama-3.1-8b and h100-80gb)")
    for name, spec in SIM_FLAGS.items():
        spec = dict(spec)
        flag = spec.pop("flag", flag_of(name))
        spec.setdefault("default", None)
        g.add_argument(flag, dest=name, **spec)
    g.add_argument("--page-size", dest="page_size", type=int, default=None,
                   help="sglang: the radix cache's page size in tokens (default 1; the same setting as --block-size)")
    g.add_argument("--config", metavar="FILE.toml", default=None,
                   help="TOML file with any of these settings (command-line flags win)")


def take_page_size(args: argparse.Namespace) -> None:
    """``--page-size`` is ``--block-size``'s other name (SGLang's word): its value becomes
    ``args.block_size``; both given and different, refused in one line. Every reader of
    :data:`SIM_FLAGS` from ``args`` calls it first."""
    page_size = getattr(args, "page_size", None)
    if page_size is not None:
        if getattr(args, "block_size", None) not in (None, page_size):
            raise ConfigError(f"--page-size {page_size} and --block-size {args.block_size} are one setting: give one")
        args.block_size = page_size


def given_settings(args: argparse.Namespace) -> tuple[dict, set[str], set[str]]:
    """The settings given: the --config file's, then the flags given (they win); with the names
    given as flags and those only the file gave (``check_settings_apply`` treats them apart)."""
    settings: dict = load_toml(args.config) if getattr(args, "config", None) else {}
    take_page_size(args)
    flags = {name for name in SIM_FLAGS if getattr(args, name, None) is not None}
    from_file = set(settings) - flags
    settings.update({name: getattr(args, name) for name in flags})
    if settings.get("spec_acceptance_rate") is not None and settings.get("spec_acceptance_rates") is not None:
        where = lambda name: "--" + name.replace("_", "-") if name in flags else f"{name} of --config"  # noqa: E731
        raise ConfigError(f"{where('spec_acceptance_rates')} replaces {where('spec_acceptance_rate')} (one rate per "
                          "draft position instead of one for all): give one")
    return settings, flags, from_file


#: what a bare ``simulate`` or ``plan`` runs (none of --system, --model, --gpu given, by flag or
#: by the --config file): vLLM v1 on a current model and GPU, what a planner asks about today.
#: Naming any of them (or a manager or scheduler) keeps the others at SimConfig's own defaults, the vLLM paper's (OPT-13B on an
#: A100-40GB under vLLM 0.4.2, ``reproduce``'s too), as every command line written before had them.
TODAYS_DEFAULTS = {"system": "vllm-v1", "model": "llama-3.1-8b", "gpu": "h100-80gb"}


def take_todays_defaults(args: argparse.Namespace, *, system_given: bool | None = None,
                         skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Where ``args`` name none of :data:`TODAYS_DEFAULTS` (``system_given``: whether a flag named
    the system, where the command's flag is not ``--system``; a manager or a scheduler named names
    what runs too) and neither does the --config file, set them on ``args`` (but ``skip``: settings
    another flag gives); returns those taken."""
    file = load_toml(args.config) if getattr(args, "config", None) else {}
    if system_given is None:
        system_given = getattr(args, "system", None) is not None
    what_runs = {*TODAYS_DEFAULTS, "manager", "scheduler"}
    if (system_given or any(getattr(args, name, None) is not None for name in what_runs - {"system"})
            or what_runs & set(file)):
        return {}
    taken = {name: value for name, value in TODAYS_DEFAULTS.items() if name not in skip}
    for name, value in taken.items():
        if name != "system" or hasattr(args, "system"):
            setattr(args, name, value)
    return taken


def defaults_line(taken: dict[str, str], system_flag: str = "--system") -> str:
    """The line a command prints first when it took :data:`TODAYS_DEFAULTS`: ``defaults:
    vllm-v1, llama-3.1-8b on h100-80gb (--system/--model/--gpu to change)``."""
    what = ", ".join(taken[name] for name in ("system", "model") if name in taken)
    what += f" on {taken['gpu']}" if "gpu" in taken else ""
    flags = "/".join(system_flag if name == "system" else f"--{name}" for name in taken)
    return f"defaults: {what} ({flags} to change)"


def config_from_args(args: argparse.Namespace, **fixed) -> SimConfig:
    """Preset of --system, then the TOML file, then explicit flags, then ``fixed``."""
    settings, flags, from_file = given_settings(args)
    for k in ("seed", "check", "max_len_policy"):
        if getattr(args, k, None) is not None:
            settings[k] = getattr(args, k)
    settings.update(fixed)
    system = settings.pop("system", None)
    system = getattr(args, "system", None) or system or "vllm"
    # workload settings may sit in the same TOML file; keep only the simulation's own
    from dataclasses import fields
    names = {f.name for f in fields(SimConfig)}
    cfg = SimConfig.for_system(system, **{k: v for k, v in settings.items() if k in names})
    if "prefix_caching" in flags and not cfg.prefix_caching and cfg.capabilities.radix_cache:
        # no flag of pagesim's turns SGLang's tree off: a --no- that would change nothing is refused
        raise ConfigError(f"--no-prefix-caching: {system} caches prefixes in its radix tree, always (SGLang's "
                          "--disable-radix-cache is not modelled); drop it")
    check_settings_apply([cfg], flags - set(fixed), from_file - set(fixed), getattr(args, "config", None))
    check_drafter(cfg)
    if cfg.preemption == "swap" and cfg.swap_gib == 0 and "preemption" in flags | from_file:
        warn("--preemption swap, --swap-gib 0: no swap space, every preemption recomputes")
    return cfg


def add_summary_args(p: argparse.ArgumentParser) -> None:
    """``vllm bench serve``'s options for what the summary reports (see :class:`SummaryOptions`)."""
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
    metrics = tuple(m.strip() for m in args.percentile_metrics.split(",") if m.strip())
    try:
        percentiles = tuple(float(p) for p in args.metric_percentiles.split(",") if p.strip())
    except ValueError:
        raise ConfigError(f"--metric-percentiles takes comma-separated numbers in [0, 100] (e.g. 50,90,99), "
                          f"got '{args.metric_percentiles}'") from None
    return SummaryOptions(percentile_metrics=metrics, percentiles=percentiles, goodput_slo_s=parse_goodput(args.goodput))
