"""`pagesim gpu`: GPU kernel benchmarks, calibration and device info (needs CUDA + CuPy).

Subcommands import CuPy lazily, so ``pagesim --help`` works anywhere; without CuPy or a CUDA
device each raises :class:`sim.errors.NeedsGPUError` (one line, exit code 2).
"""

from __future__ import annotations

from pagesim.gpu import bench, calibrate
from pagesim.gpu.device import device_info, torch_cuda_available
from pagesim.sim.cli import HelpFormatter, example


def _bench(args) -> int:
    bench.run(quick=args.quick, out=args.out, reps=args.reps, mem_budget_gib=args.mem_budget_gib)
    return 0


def _calibrate(args) -> int:
    calibrate.run(args.model, args.out, quick=args.quick, tp=args.tp, dtype=args.dtype, gpu_name=args.gpu_name,
                  reps=args.reps, mem_budget_gib=args.mem_budget_gib)
    return 0


def _info(args) -> int:
    info = device_info("pagesim gpu info")
    for k, v in info.items():
        print(f"{k:22s} {v}")
    print(f"{'torch_cuda':22s} {torch_cuda_available()}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("gpu", help="GPU kernel benchmarks and calibration (needs CUDA)", formatter_class=HelpFormatter,
                       description=__doc__.split("\n\n")[0],
                       epilog=example("pagesim gpu info", "pagesim gpu bench --quick",
                                      "pagesim gpu calibrate --model llama-2-7b --out profile.csv --quick"))
    gsub = p.add_subparsers(dest="gpu_command", metavar="GPU_COMMAND")
    p.set_defaults(func=lambda args: p.print_help() or 2)

    b = gsub.add_parser("bench", help="benchmark the PagedAttention kernel against copy bandwidth and SDPA",
                        formatter_class=HelpFormatter,
                        description="Sweep batch x context x block size x MHA/GQA x fp16/bf16 (head_dim 128); "
                                    "write a CSV of kernel time, achieved KV GB/s, fraction of device-copy "
                                    "bandwidth, the contiguous-KV time and torch SDPA time.",
                        epilog=example("pagesim gpu bench --quick",
                                       "pagesim gpu bench --out benchmarks/results/gpu_kernel.csv"))
    b.add_argument("--quick", action="store_true", help="a few points (under a minute)")
    b.add_argument("--out", default=None,
                   help="CSV path (default: benchmarks/results/gpu_kernel_<date>_<gpu>.csv)")
    b.add_argument("--reps", type=int, default=None, help="timed repeats per point (default 10 quick, 30 full)")
    b.add_argument("--mem-budget-gib", type=float, default=None,
                   help="skip points needing more device memory (default: 70%% of free memory)")
    b.set_defaults(func=_bench)

    c = gsub.add_parser("calibrate", help="time a model's linear layers and attention; write a profile CSV",
                        formatter_class=HelpFormatter,
                        description="Write the profile CSV (component,num_tokens,batch,context,time_us,model,gpu,"
                                    "dtype,tp) read by the simulator's table cost model; see gpu/calibrate.py.",
                        epilog=example("pagesim gpu calibrate --model llama-2-7b --out profile.csv",
                                       "pagesim gpu calibrate --model llama-3-8b --out p.csv --quick --dtype bfloat16"))
    c.add_argument("--model", required=True, help="model preset (e.g. llama-2-7b) or a config.json path")
    c.add_argument("--out", required=True, help="profile CSV to write")
    c.add_argument("--quick", action="store_true", help="a small grid (about a minute)")
    c.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (shapes per GPU)")
    c.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    c.add_argument("--gpu-name", default=None, help="gpu column value (default: from the device name)")
    c.add_argument("--reps", type=int, default=None, help="timed repeats per point")
    c.add_argument("--mem-budget-gib", type=float, default=None, help="skip decode points needing more memory")
    c.set_defaults(func=_calibrate)

    i = gsub.add_parser("info", help="show the CUDA device, CuPy and torch versions",
                        formatter_class=HelpFormatter, epilog=example("pagesim gpu info"))
    i.set_defaults(func=_info)
