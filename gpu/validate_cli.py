"""`pagesim validate`: run a trace on the GPU for real and measure how far the simulator is off.

The real run uses the simulator's own scheduler and paged manager with the GPU executor
(gpu/executor.py, gpu/model_runner.py); the same trace is then simulated with the roofline
model (and the table model with --profile). Writes DIR/steps.csv, DIR/validation.json,
DIR/report.html and each run's records under DIR/real, DIR/sim_roofline, DIR/sim_table.

Measured step time = host preparation + device time (synchronized); idle gaps between arrivals
are jumped, not slept, so a run takes about the trace's busy time. ``--layers N`` runs N layers
and scales their time by num_layers/N (less memory and time for big models).

Needs CUDA with CuPy and torch; without them the command stops at once with one line (exit 2).
``--backend fake`` is a dry run on the CPU: the whole pipeline (scheduler, manager, executor,
slot mappings, copy-on-write, swaps, report) with a fake device whose step time is a formula,
for checking the pipeline without a GPU (its step time is the roofline price with a
deterministic +-10 % wobble); its numbers say nothing about any GPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pagesim.gpu.device import cuda_available, torch_cuda_available, why_not
from pagesim.gpu.fake_backend import FakeBackend
from pagesim.gpu.graphs import capture_sizes, sizes_to_capture
from pagesim.gpu.layer_ops import OPS
from pagesim.gpu.model_runner import DENSE_WARM_TOKENS, TIMINGS, TorchCupyBackend
from pagesim.gpu.paged_attention import default_kernel
from pagesim.gpu.validate import cpu_term, host_term_from, validate
from pagesim.gpu.validate_report import measured_word
from pagesim.sim.args import add_sim_args, config_from_args
from pagesim.sim.cost.models import make_cost_model, swap_block_tokens
from pagesim.sim.errors import ConfigError, NeedsGPUError
from pagesim.sim.run import jsonable, resolve_budget
from pagesim.sim.terminal import fill, key_value_lines
from pagesim.traces.args import add_workload_args, workload_from_args


def _require_gpu() -> None:
    if not cuda_available():
        raise NeedsGPUError(f"pagesim validate needs a CUDA GPU with CuPy: {why_not()} "
                            "(use --backend fake for a CPU dry run)")
    if not torch_cuda_available():
        raise NeedsGPUError("pagesim validate needs torch with CUDA (torch.cuda.is_available() is False)")


def make_backend(args, cfg=None):
    if args.backend == "fake":
        time_fn = host_fn = None
        if cfg is not None:  # the roofline price with a deterministic +-10 % wobble
            import math

            model, gpu, _ = resolve_budget(cfg)
            roof = make_cost_model(model, gpu, cfg.tensor_parallel, None, cfg.step_overhead_ms,
                                   cfg.per_seq_overhead_ms, swap_block_tokens=swap_block_tokens(cfg),
                                   kernel_block_tokens=cfg.kernel_block_tokens)

            def time_fn(plan):  # the device share: the price less its host term
                return (roof.step_time(plan.batch) - cpu_term(roof, plan.batch.num_seqs)) * (1.0 + 0.1 * math.sin(plan.step))

            def host_fn(plan):  # the host share: the price's host term (same wobble: the sum is unchanged)
                return cpu_term(roof, plan.batch.num_seqs) * (1.0 + 0.1 * math.sin(plan.step))
        sizes = sizes_to_capture(capture_sizes(cfg.max_num_seqs), cfg.max_num_seqs) \
            if cfg is not None and args.cuda_graphs else None
        return FakeBackend(time_fn, verify=True, check_writers=not bool(getattr(args, "prefix_caching", False)),
                           record=False, host_fn=host_fn, device_name="cpu (fake backend, dry run)",
                           graph_sizes=sizes, graph_max_context=cfg.max_seq_len if cfg is not None else None)
    import torch

    return TorchCupyBackend(dtype=args.dtype, num_layers_run=args.layers, timing=args.timing, ops=args.ops,
                            cuda_graphs=args.cuda_graphs and args.ops == "fused",
                            max_num_seqs=cfg.max_num_seqs if cfg is not None else 256,
                            graph_max_context=cfg.max_seq_len if cfg is not None else None,
                            dense_warm_tokens=DENSE_WARM_TOKENS,  # every step size to 1,024: warm_up_token_counts
                            device_name=torch.cuda.get_device_name())


def run(args: argparse.Namespace) -> int:
    if not args.out:
        raise ConfigError("pagesim validate runs a trace on the GPU into --out DIR (or replays a real run: "
                          "--against PATH)")
    try:  # the decode-attention kernel the runner's plans default to (PAGESIM_ATTENTION_KERNEL)
        default_kernel()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.backend != "fake":
        _require_gpu()  # before any heavy work

    cfg = config_from_args(args)
    if cfg.expert_parallel:
        raise ConfigError("--expert-parallel is not run on the GPU (its kernel runs one GPU's attention)")
    host_from = None
    if args.host_from:
        if args.step_overhead_ms is not None or args.per_seq_overhead_ms is not None:
            raise ConfigError("--host-from sets the host term: drop --step-overhead-ms / --per-seq-overhead-ms")
        host_from = host_term_from(args.host_from)
    if cfg.manager != "paged":
        raise ConfigError(f"pagesim validate runs paged systems only (--system vllm or token), "
                          f"got '{cfg.system}' (manager {cfg.manager})")
    model, _gpu, _budget = resolve_budget(cfg)
    trace, workload = workload_from_args(args, model.max_seq_len, cfg.max_len_policy)
    backend = make_backend(args, cfg)  # (the fake's host time: the run's own settings', not --host-from's)
    if host_from is not None:
        cfg = cfg.replace(step_overhead_ms=host_from["intercept_ms"], per_seq_overhead_ms=host_from["per_seq_ms"])
    res = validate(cfg, trace, backend, cfg.profile, workload=workload,
                   progress=args.progress and not args.json, check_kv=args.check_kv)
    if host_from is not None:
        res.metrics["host_from"] = host_from
    out = res.save(args.out)
    m = res.metrics
    if args.json:
        print(json.dumps(jsonable(m), default=str))
        return 0
    fake = m["backend"] == "fake"
    measured = measured_word(m)
    rows = [("model / gpu", f"{m['model']} on {m['gpu_name']}"
                            + ("" if m["backend"] in m["gpu_name"] else f" ({m['backend']})")),
            ("steps", m["num_steps"]),
            (f"step error ({m['step_error_model']}) median / p90",
             f"{100 * m['median_step_error']:.1f} % / {100 * m['p90_step_error']:.1f} %"),
            (f"GPU-only step error ({m['step_error_model']}) median / p90",
             f"{100 * m['median_gpu_step_error']:.1f} % / {100 * m['p90_gpu_step_error']:.1f} %"
             f" (host share of the measured time {100 * m.get('measured_host_share', float('nan')):.1f} %)"),
            ("roofline step error median / p90",
             f"{100 * m['roofline_median_step_error']:.1f} % / {100 * m['roofline_p90_step_error']:.1f} %"),
            (f"output throughput {measured} / sim",
             f"{m['real_output_throughput']:.1f} / {m['sim_output_throughput']:.1f} tok/s"
             f" ({100 * m['throughput_error']:.1f} %)"),
            (f"mean TTFT {measured} / sim", f"{m['real_mean_ttft_ms']:.1f} / {m['sim_mean_ttft_ms']:.1f} ms"
                                     f" ({100 * m['ttft_error']:.1f} %)"),
            ("K/V after copies and swaps", f"{m['kv_check']} ({m['kv_checked_blocks']} blocks compared)"
             if m["kv_checked_blocks"] else "nothing to compare: no copy-on-write or swap in this run"),
            (f"mean TPOT {measured} / sim", f"{m['real_mean_tpot_ms']:.2f} / {m['sim_mean_tpot_ms']:.2f} ms"
                                     f" ({100 * m['tpot_error']:.1f} %)")]
    if "steps_with_launch_gaps" in m:  # device timing: how many steps the hold did not cover
        rows.append(("timing", f"{m.get('timing')}: kernels back to back; launching them took "
                               f"{m['median_launch_ms']:.2f} ms a step (median, not in the step time); "
                               f"{m['steps_with_launch_gaps']} steps with gaps"))
    if "median_host_ms" in m:  # each step's host time apart from its device time
        rows.append(("step time, host / device (median)",
                     f"{m['median_host_ms']:.3f} / {m['median_gpu_ms']:.3f} ms; "
                     f"{m['steps_replayed_from_graphs']} of {m['num_steps']} steps replayed from CUDA graphs"))
    if host_from is not None:
        rows.append(("host term (held out)", f"{host_from['intercept_ms']:.3f} ms + {host_from['per_seq_ms']:.4f} "
                                             f"ms/seq, fitted on {host_from['run']}"))
    if "host_fit" in m:  # the measured host time as the cost model's own term, for the next run
        f = m["host_fit"]
        rows.append(("host term fitted on this run",
                     f"{f['intercept_ms']:.3f} ms + {f['per_seq_ms']:.4f} ms/seq: step error with it "
                     f"{100 * m['median_step_error_host_fitted_in_sample']:.1f} % / "
                     f"{100 * m['p90_step_error_host_fitted_in_sample']:.1f} % (in-sample; price another trace "
                     f"with --step-overhead-ms {f['intercept_ms']:.3f} --per-seq-overhead-ms "
                     f"{f['per_seq_ms']:.4f})"))
    print("\n".join(key_value_lines(rows)))
    if fake:
        print(fill("(fake backend: the steps ran on the CPU's stand-in for a GPU; a dry run of the pipeline, "
                   "not a measurement)", rest=" "))
    print("\n" + fill(f"wrote {Path(out) / 'validation.json'}, steps.csv, step_errors.csv, report.html"))
    return 0


#: the command line's examples of a GPU run (``experiments/validate_cli.py`` registers the command)
EXAMPLES = ("pagesim gpu calibrate --model llama-2-7b --out prof.csv",
            "pagesim validate --workload sharegpt --rate 2 --duration 120 --model llama-2-7b --gpu h200 "
            "--system vllm --kv-gib 40 --profile prof.csv --out out/val",
            "pagesim validate --workload sharegpt --rate 2 --num-requests 50 --model llama-2-7b --gpu h200 "
            "--backend fake --out out/dry")


def add_arguments(p: argparse.ArgumentParser) -> tuple[argparse._ArgumentGroup, argparse._ArgumentGroup]:
    """A GPU run's settings on ``p``; returns the workload's and the GPU run's argument groups
    (``--against`` refuses what it would ignore)."""
    workload = add_workload_args(p)
    add_sim_args(p)
    g = p.add_argument_group("GPU run")
    g.add_argument("--layers", type=int, default=None, metavar="N",
                   help="run N of the model's layers and scale their time by num_layers/N (default: all)")
    g.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16", help="weights, activations and KV dtype")
    g.add_argument("--timing", choices=list(TIMINGS), default="device",
                   help="device (default): each step's kernels queued behind a hold kernel and timed back to "
                        "back, as a serving engine's CUDA graphs run them; eager: as this Python runner "
                        "launches them, launch gaps included")
    g.add_argument("--ops", choices=list(OPS), default="fused",
                   help="fused (default): RMSNorm with the residual add, rotary with the KV-cache write and "
                        "SiLU-and-mul as one kernel each, as engines run them; eager: torch ops one by one "
                        "(the reference)")
    g.add_argument("--cuda-graphs", dest="cuda_graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="replay decode steps from CUDA graphs captured at vLLM's padded batch sizes (1, 2, 4, "
                        "multiples of 8, then of 16 up to min(2 x max-num-seqs, 512)); a batch above the largest, "
                        "and every step with a prefill, runs eagerly. Needs --ops fused")
    g.add_argument("--host-from", dest="host_from", metavar="DIR",
                   help="price each step's host time with the term fitted on another validation's steps "
                        "(DIR/validation.json's host_fit: ms a step + ms a sequence), held out from this run "
                        "(sets --step-overhead-ms and --per-seq-overhead-ms)")
    g.add_argument("--backend", choices=["gpu", "fake"], default="gpu",
                   help="gpu: real kernels (torch + CuPy); fake: CPU dry run of the pipeline for testing "
                        "(step time = roofline price x (1 +- 10 %%), says nothing about a GPU)")
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="DIR", help="folder for steps.csv, validation.json, report.html (a GPU run: "
                                               "required)")
    o.add_argument("--check", action="store_true", default=None, help="assert engine invariants every step")
    g.add_argument("--check-kv", dest="check_kv", action=argparse.BooleanOptionalAction, default=True,
                   help="after each copy-on-write and swap, read the destination blocks back and compare them "
                        "with their sources before the step (outside the timed region)")
    o.add_argument("--json", action="store_true", help="print validation.json's numbers as one JSON object")
    o.add_argument("--progress", dest="progress", action=argparse.BooleanOptionalAction, default=True,
                   help="progress bar")
    return workload, g
