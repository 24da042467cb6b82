"""The whole GPU programme in three offline phases, each one `device run` call of under 10 minutes.

    python3 benchmarks/gpu_programme.py prepare            # here, once: any wheel the device lacks, into .whl/
    python3 benchmarks/gpu_programme.py session --out "$OUT"  # on the GPU machine: phases 1 and 2, one call
    python3 benchmarks/gpu_programme.py 3 --out "$OUT"     # a later call or session: phase 3
    python3 benchmarks/gpu_programme.py all --dry-run --out /tmp/dry   # every step on the CPU (CI)

**The budget.** A task lent a GPU has 15 minutes of device time in all, the machine's start (a
minute or two) and every idle wait included. Phases 1 and 2 are that session's programme: their
deadlines add up to 9.5 minutes, so with the start they end inside 12 and leave a little for a
rerun. Phase 3 (the sanitizers, the decode paths, the 4-vs-32-layer check) is a later lent
session's, or runs with what phases 1-2 left (``3 --limit-s N``: the steps that do not fit are
skipped, each with a line saying so).

Nothing is fetched on the device: the project runs from the working tree (``PYTHONPATH``, no
``pip install -e``, whose build isolation needs the network), the trace is the built-in synthetic
ShareGPT workload (``../shared`` does not travel), and a package the device image lacks
that a step needs would come as a wheel in the git-ignored ``.whl/`` folder (``prepare`` downloads
them; name ``.whl`` in the call's ``carry``): none today, the simulator's clock being the core's
own loop (simpy only tells the same loop as a model, in the tests). plotly is not carried:
without it ``validate`` writes report.html as tables only. The validations run the simulator's
core interpreted (``PAGESIM_JIT=0``: the same functions in CPython, about half a millisecond of
host time a step for these sizes), so no call pays numba's compile of the core (100-150 s cold);
device timing queues each step's kernels behind a hold, so the host's scheduling is not in the
measured step. Phases (expected device time, see ``PHASES``)::

    1  kernels: environment report, every kernel instantiation compiled through NVRTC (fills
       CuPy's cache for the later steps), the kernel sweep (`pagesim gpu bench`: the tensor-core
       GQA kernel and the simple one beside it, copy bandwidth, SDPA; summarized against the
       targets), calibration of llama-2-7b (MHA) and llama-3-8b (GQA-8), the GPU tests (-m gpu)
    2  validation (4 of 32 layers run, time scaled x8), each run against its model's profile and
       the host term fitted on the run before it (``--host-from``, held out): one run that
       exercises copy-on-write (n = 2) and swapping (a 2 GiB pool), then both models; each run's
       steps priced again with every other run's host term (no GPU:
       benchmarks/validation_host_heldout.py), then the decode step beside the calibration's
       parts, kernel by kernel (benchmarks/gpu_decode_slope.py)
    3  later: compute-sanitizer memcheck and racecheck (Firecracker kernels only; a clear
       "skipped" line elsewhere), decode steps three ways (benchmarks/gpu_decode_paths.py: eager,
       fused kernels, fused + CUDA graphs, ratios against eager), the layer-scaling check: one
       trace with 4 and with all 32 layers run, then with 8 and 16 (the host's time by layer count)

Each phase writes its files under ``out/gpu_programme/<date>-<device>/phaseN/`` in the working
tree (git-ignored; it survives between calls while the machine stays warm, so phase 2 finds
phase 1's profiles; on a cold machine it calibrates quickly instead) and sends back two files,
``$OUT/<date>-<device>/summaryN.txt`` and ``$OUT/<date>-<device>/phaseN.tgz`` (the device returns
8 files, 2 folders deep): unpack the tarballs into ``benchmarks/results/<date>-<device>/``.

A phase never runs past its deadline (its worst time in ``PHASES``): each step gets the smaller of its own
timeout and the time left, and a step that does not fit is skipped with a line saying so.
``--dry-run`` runs every step on the CPU: the environment report, the kernel sources and their
instantiation list, the GPU tests collected (not run), the sanitizer skip line, the sweep's
points, profiles priced by the roofline at the calibration grid and checked by the table model,
every validation with ``--backend fake`` (fewer requests) and the layer-scaling comparison. Its
numbers say nothing about any GPU; it checks that every step's command line, file and summary
works (tests/benchmarks/test_gpu_programme.py).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # run as a script from anywhere
from _import_path import import_path  # noqa: E402

IMPORT_PATH = import_path()  # `import pagesim` from this working tree: the device installs nothing

#: the wheels a step needs that the device image lacks (KINDS.md: it has no simpy and no plotly,
#: neither of which a step needs; tqdm, numba, pandas, pyarrow are there)
WHEELS: tuple[str, ...] = ()
MODELS = ("llama-2-7b", "llama-3-8b")
#: what the programme's validations run (the dry run swaps in fewer requests, see _val)
VALIDATION = ("--workload", "sharegpt", "--rate", "4", "--system", "vllm", "--no-progress")
COW_SWAP = ("--n", "2", "--kv-gib", "2", "--max-seq-len", "2048", "--preemption", "swap", "--swap-gib", "4",
            "--num-requests", "40")
#: sizes of the validations. Device timing (the default) runs each step's kernels back to back, so a
#: trace second takes many more steps than the eager runner's host-bound ones, and each step's wall
#: time is its hold (2x the launch time) plus its kernels: on the H100 of 2026-11-23, 24 ShareGPT
#: requests were 1995 steps of 4 layers (~25 ms each; 34 s in all). Requests are counted and their
#: length capped (output truncated) so a run ends inside its 90 s (150 s at 32 layers).
MODEL_RUN = ("--num-requests", "32", "--max-seq-len", "1024", "--max-len-policy", "truncate")
LAYER_RUN = ("--num-requests", "16", "--max-seq-len", "512", "--max-len-policy", "truncate")
#: phase 3's layer runs: 4 and 32 layers, the check; 8 and 16 after them, how the graph replay's host
#: time grows with the layers (benchmarks/results/2026-11-27-h200/session2: 0.35 ms a step at 4
#: layers, 0.78 at 32). The deadline skips the last first.
LAYER_COUNTS = (4, 32, 8, 16)

#: expected device seconds per phase (typical, worst), from the H100 run of 2026-11-23
#: (benchmarks/results/2026-11-23-h100-80gb-hbm3: 48 NVRTC compiles 19.6 s, 193 GPU tests 91 s, the
#: 116-point sweep 35 s, a calibration 10-11 s, a device-timed validation of 24 requests at 4 layers
#: 34 s, 32 layers 101 s, racecheck 12 s) scaled to today's counts (76 instantiations, 261 GPU tests,
#: 132 points with the simple kernel timed beside the tensor one on GQA) and memcheck's 2-3 min from
#: ../shared/gpu-plan. The worst is also the phase's deadline: no step starts that could end past it.
#: Phases 1 + 2, the 15-minute session's programme: 9.5 min at worst, a machine's start on top.
#: On the H100 of 2026-11-26 (second session) phase 1 took 268 s with llama-2-7b's calibration cut
#: at its 45 s, phase 2 67-76 s and its decode slope about 40 s: phase 1 given 30 s of phase 2's.
#: On the H200 of 2026-11-28, its host slower, phase 1 needed about 350 s (its GPU tests stopped at
#: the deadline) and phase 2 took 128 s (at most 128 s in six sessions): 30 s more moved to phase 1.
PHASES = {1: (260, 360), 2: (150, 210), 3: (400, 560)}
#: the phases a 15-minute session runs (the module's docstring, "The budget")
SESSION_PHASES = (1, 2)


@dataclass
class Step:
    name: str
    argv: list[str]
    timeout_s: int
    env: dict = field(default_factory=dict)
    #: a validation priced with the host term fitted on this earlier one's steps (``--host-from``,
    #: held out) where that one wrote its validation.json; else with its profile's own
    host_from: Path | None = None


def step_argv(st: Step, log) -> list[str]:
    """The step's command line as it runs: a validation held out by host term (``host_from``) takes
    ``--host-from`` where that run wrote its validation.json, and says so in the log where not."""
    if st.host_from is None:
        return st.argv
    if (st.host_from / "validation.json").exists():
        return [*st.argv, "--host-from", str(st.host_from)]
    log(f"{st.name:28s} priced by its profile's host term: {st.host_from.name} wrote no validation.json")
    return st.argv


def shown(argv: list[str]) -> list[str]:
    """The command line as logged: an inline script's text replaced by a mark."""
    return [a if i != 2 or argv[1] != "-c" else "<inline script>" for i, a in enumerate(argv)]


def python() -> str:
    return sys.executable or "python3"


def cli(*args: str) -> list[str]:
    return [python(), "-m", "pagesim.sim.cli", *args]


def py(code: str) -> list[str]:
    return [python(), "-c", code]


# ---------------------------------------------------------------------- the environment
def ensure_wheels(log) -> str:
    """A site folder holding the carried wheels when the interpreter lacks them ('' when none needed)."""
    missing = [w.split("==")[0] for w in WHEELS if not _importable(w.split("==")[0])]
    if not missing:
        return ""
    whl = sorted((ROOT / ".whl").glob("*.whl"))
    if not whl:
        log(f"missing {', '.join(missing)} and no wheels in .whl/: run 'python3 benchmarks/gpu_programme.py "
            f"prepare' here and name .whl in the call's carry; the validation steps will fail")
        return ""
    site = Path("/tmp/pagesim_site")
    r = subprocess.run([python(), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, whl)],
                       capture_output=True, text=True)
    log(f"installed {len(whl)} carried wheel(s) into {site}: rc={r.returncode} {r.stderr.strip()[-300:]}")
    return str(site)


def _importable(mod: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(mod) is not None


def device_slug(dry: bool) -> tuple[str, str]:
    """(folder slug, the simulator's --gpu preset) of this machine's GPU."""
    if dry:
        return "cpu-dry-run", "h200"
    from pagesim.gpu.device import cuda_available, device_info, gpu_slug
    if not cuda_available():
        from pagesim.gpu.device import why_not
        raise SystemExit(f"gpu_programme: no CUDA device ({why_not()}); use --dry-run on a CPU")
    name = device_info("gpu_programme")["name"]
    low = name.lower()
    try:  # the device's own name where it is a preset's (B200, H20, L40S: what gpu calibrate writes)
        from pagesim.sim.specs import get_gpu
        preset = get_gpu(gpu_slug(name)).name
    except Exception:
        preset = "h200" if "h200" in low else "h100" if "h100" in low else "a100-80gb"
    return gpu_slug(name), preset


ENV_REPORT = r"""
import importlib, platform, subprocess, sys, shutil
print("python", sys.version.split()[0], platform.platform())
print("uname -r", platform.release(), "(firecracker)" if "fc" in platform.release() else "")
for m in ("numpy", "pandas", "numba", "pyarrow", "cupy", "torch", "simpy", "plotly", "tqdm", "pytest", "hypothesis"):
    try:
        mod = importlib.import_module(m)
        print(f"{m:12s} {getattr(mod, '__version__', '?')}")
    except Exception as e:
        print(f"{m:12s} missing ({type(e).__name__})")
try:
    import torch
    print("torch cuda", torch.version.cuda, "available", torch.cuda.is_available())
except Exception:
    pass
for tool in ("nvidia-smi", "nvcc", "compute-sanitizer"):
    print(f"{tool:18s} {shutil.which(tool) or 'not found'}")
if shutil.which("nvidia-smi"):
    print(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)
from pagesim.gpu.device import cuda_available, why_not
if cuda_available():
    from pagesim.gpu.device import device_info
    for k, v in device_info().items():
        print(f"{k:22s} {v}")
else:
    print("gpu info skipped:", why_not())
"""

COMPILE_ALL = r"""
import sys, time
from pagesim.gpu.kernels_src import all_instantiations, load_source
from pagesim.gpu._loader import BASE_OPTIONS
dry = sys.argv[1] == "dry"
n = 0
t0 = time.perf_counter()
for src, names in all_instantiations().items():
    load_source(src)
    for x in names:
        if not dry:
            from pagesim.gpu._loader import get_kernel
            t = time.perf_counter()
            get_kernel(src, x)
            print(f"{time.perf_counter() - t:6.2f} s  {x}")
        n += 1
print(("listed" if dry else "compiled"), n, "instantiations with", " ".join(BASE_OPTIONS),
      f"in {time.perf_counter() - t0:.1f} s")
"""

BENCH_DRY = r"""
import sys
from pagesim.gpu.bench import sweep, COLUMNS
pts = sweep(quick=False)
need = max(2.5 * p.kv_bytes for p in pts)
print(f"bench: {len(pts)} points, the largest needs {need / 2**30:.1f} GiB; columns: {','.join(COLUMNS)}")
open(sys.argv[1], "w").write(",".join(COLUMNS) + "\n")
"""

KERNEL_SUMMARY = r"""
import sys
from pagesim.gpu.bench import summarize
print("\n".join(summarize(sys.argv[1])))
"""

CALIBRATE_DRY = r"""
import sys
from pagesim.gpu.calibrate import fake_profile
fake_profile(sys.argv[1], sys.argv[2], sys.argv[3])
"""

SLOPE_DRY = r"""
import importlib.util, json, os, subprocess, sys
if importlib.util.find_spec("torch") is None:  # the runner's torch paths need torch, even on a CPU
    print("decode_slope skipped: no torch here")
    sys.exit(0)
# a two-layer model of 64 hidden units (a Hugging Face config.json): the script's torch paths on the CPU
config = os.path.join(sys.argv[1], "tiny", "config.json")
os.makedirs(os.path.dirname(config), exist_ok=True)
json.dump({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
           "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256,
           "max_position_embeddings": 512}, open(config, "w"))
sys.exit(subprocess.call([sys.executable, "benchmarks/gpu_decode_slope.py", "--device", "cpu", "--models", config,
                          "--batches", "1,2", "--layers", "1", "--context", "20", "--out", sys.argv[1]]))
"""

SUMMARIZE = r"""
import glob, json, sys, os
import pandas as pd
for f in sorted(glob.glob(os.path.join(sys.argv[1], "val_*", "validation.json"))):
    m = json.load(open(f))
    s = pd.read_csv(f.replace("validation.json", "steps.csv"))
    swapped = int((s["swap_in_tokens"] + s["swap_out_tokens"]).sum())
    print(f"{f.split(os.sep)[-2]:24s} steps={m['num_steps']:6d} step err ({m['step_error_model']}) "
          f"med/p90={m['median_step_error']:.3f}/{m['p90_step_error']:.3f} gpu-only med/p90="
          f"{m['median_gpu_step_error']:.3f}/{m['p90_gpu_step_error']:.3f} host share={m['measured_host_share']:.3f} "
          f"roofline med={m['roofline_median_step_error']:.3f} "
          f"tput err={m['throughput_error']:.3f} ttft err={m['ttft_error']:.3f} tpot err={m['tpot_error']:.3f} "
          f"copies={m['executor_copies']} swapped_tokens={swapped} kv_checks={m.get('kv_checked_blocks', 'n/a')} "
          f"timing={m.get('timing')} launch ms={m.get('median_launch_ms', float('nan')):.2f} "
          f"steps with gaps={m.get('steps_with_launch_gaps', 'n/a')}")
"""

LAYERS = r"""
import json, sys, os
import numpy as np, pandas as pd
rows = {}
for L in sorted(int(x) for x in sys.argv[2:]):  # the layer counts run (LAYER_COUNTS)
    d = os.path.join(sys.argv[1], f"val_layers{L}")
    if not os.path.exists(os.path.join(d, "validation.json")):  # a step the deadline skipped
        continue
    m = json.load(open(os.path.join(d, "validation.json")))
    s = pd.read_csv(os.path.join(d, "steps.csv"))
    dec = s[(s.num_prefill_seqs == 0) & (s.num_decode_seqs > 0)]
    per_seq = (dec.measured_s / dec.num_decode_seqs).median() if len(dec) else float("nan")
    # the host's part of a step and the GPU's, apart: a graph of more layers costs this VM's host more
    host = float(dec.measured_host_s.median()) if "measured_host_s" in dec and len(dec) else float("nan")
    gpu = float(dec.measured_gpu_s.median()) if "measured_gpu_s" in dec and len(dec) else float("nan")
    rows[L] = dict(layers_run=m.get("layers_run"), steps=len(s), busy_s=float(s.measured_s.sum()),
                   median_step_s=float(s.measured_s.median()), median_decode_s_per_seq=float(per_seq),
                   median_decode_host_s=host, median_decode_gpu_s=gpu,
                   output_throughput=m["real_output_throughput"])
    print(f"layers {L:2d}: " + " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in rows[L].items()))
res = {}
for L in rows:  # L layers run, time scaled x 32/L, against all 32 run
    if L == 32 or 32 not in rows:
        continue
    res[L] = {k: rows[L][k] / rows[32][k] - 1 for k in ("busy_s", "median_step_s", "median_decode_s_per_seq",
                                                      "output_throughput")}
    print(f"layer scaling ({L} layers x {32 // L} vs 32 layers), relative difference: "
          + " ".join(f"{k}={v:+.3f}" for k, v in res[L].items()))
json.dump({"runs": rows, "relative_difference": res.get(4, {}), "relative_difference_by_layers": res},
          open(os.path.join(sys.argv[1], "layer_scaling.json"), "w"), indent=2)
"""


def _val(name: str, model: str, preset: str, work: Path, dry: bool, *extra: str, profile: str | None = None,
         layers: int = 4, size: tuple[str, ...] = MODEL_RUN, seed: int = 0, timeout_s: int = 90,
         host_from: Path | None = None) -> Step:
    """A validation, its simulator interpreted (the module's docstring: no call compiles the core)."""
    if dry:  # the same options, fewer requests
        size = ("--num-requests", "16") + tuple(size[2:])
    if "--num-requests" in extra:
        size = ()
        if dry:  # copy-on-write and swap's 40 too: at 16 its copies, preemptions and swaps still run
            extra = list(extra)
            extra[extra.index("--num-requests") + 1] = "16"
    args = ["validate", *VALIDATION, "--seed", str(seed), *size, "--model", model, "--gpu", preset, "--layers", str(layers),
            "--out", str(work / name)]
    if not extra:
        args += ["--kv-gib", "40" if not dry else "4"]
    args += list(extra)
    if profile:
        args += ["--profile", profile]
    if dry:
        args += ["--backend", "fake"]
    return Step(name, cli(*args), timeout_s, env={"PAGESIM_JIT": "0"}, host_from=host_from)


def _gpu_tests(dry: bool) -> Step:
    if dry:  # the GPU tests must collect (no simpy/plotly needed); running them needs the device
        return Step("gpu_tests", [python(), "-m", "pytest", "tests/gpu", "-m", "gpu", "--collect-only", "-q",
                                  "-p", "no:cacheprovider"], 120)
    # four workers: one after another the 261 tests outran 150 s on the H100 of 2026-11-26 (260 done),
    # with four they took 122 s there (benchmarks/results/2026-11-26-h100-80gb-hbm3); the H200 of
    # 2026-11-28, its host slower, stopped at the phase's deadline (133 s, 82 % done): the slowest
    # tests are listed (--durations), to see where that time goes
    return Step("gpu_tests", [python(), "-m", "pytest", "tests/gpu", "-m", "gpu", "-q", "-ra", "-n", "4",
                              "--durations", "25", "-p", "no:cacheprovider"], 180)


def _sanitizers(dry: bool) -> list[Step]:
    sanitizer = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer", "/usr/local/cuda/compute-sanitizer/compute-sanitizer")
         if os.path.exists(p)), None)
    if not dry and sanitizer and "fc" in platform.release():
        base = [python(), "-m", "pytest", "tests/gpu/test_kernels_gpu.py", "tests/gpu/test_fused_ops_emulated.py",
                "-m", "gpu", "-q", "-x", "-p", "no:cacheprovider"]
        # the head-dim and split-K grids run both attention kernels since the tensor-core one: their
        # bf16 halves (the same addresses as fp16) stay out so memcheck keeps its size; racecheck
        # takes the tensor kernel (cp.async stages, the warps' combine) and the simple one's MHA
        # (its GQA paths had 0 hazards on 2026-11-23 and are unchanged)
        return [Step("memcheck", [sanitizer, "--tool", "memcheck", "--error-exitcode", "9", "--print-limit", "20",
                                  *base, "-k", "not torch and not sdpa and not bench and not (split_k and bfloat16)"
                                               " and not (head_dims and bfloat16)"], 170),
                Step("racecheck", [sanitizer, "--tool", "racecheck", "--error-exitcode", "9", *base, "-k",
                                   "head_dims and float16 and (tensor or mha) or v1_and_v2 or copy_blocks"
                                   " or reshape_and_cache or fused_kernels"], 80)]
    why = ("dry run" if dry else "compute-sanitizer not found" if not sanitizer
           else f"kernel {platform.release()} is not Firecracker (gVisor refuses the device)")
    return [Step("sanitizer", py(f"print('compute-sanitizer memcheck/racecheck skipped: {why}')"), 10)]


def _calibrate(model: str, preset: str, out: str, dry: bool, quick: bool = False) -> Step:
    name = f"calibrate_{'quick_' if quick else ''}{model}"
    if dry:
        return Step(name, py(CALIBRATE_DRY) + [model, preset, out], 30)
    # quick: 7-16 s on 2026-11-26 (second session); the full grid, timed behind holds: llama-3-8b
    # 33 s, llama-2-7b past 45 s (cut), over 60 s where CuPy's cache was cold
    argv = cli("gpu", "calibrate", "--model", model, *(["--quick"] if quick else []), "--out", out)
    return Step(name, argv, 45 if quick else 70)


def steps_for(phase: int, work: Path, dry: bool, preset: str, prev: Path) -> list[Step]:
    """Phase ``phase``'s steps, most wanted first (a phase cut short loses its last ones); ``prev``
    is phase 1's folder, where phase 2 finds the profiles on a warm machine."""
    mode = "dry" if dry else "gpu"
    if phase == 1:
        steps = [Step("env", py(ENV_REPORT), 30), Step("compile_all", py(COMPILE_ALL) + [mode], 60)]
        if dry:
            steps.append(Step("bench", py(BENCH_DRY) + [str(work / "gpu_kernel.csv")], 60))
        else:
            steps.append(Step("bench", cli("gpu", "bench", "--out", str(work / "gpu_kernel.csv")), 90))
        # MHA / GQA x kernel against the targets, in summary1.txt (a step named summary shows 12 lines)
        steps.append(Step("summary", py(KERNEL_SUMMARY) + [str(work / "gpu_kernel.csv")], 20))
        steps += [_calibrate(m, preset, str(work / f"profile_{m}.csv"), dry) for m in MODELS]
        return steps + [_gpu_tests(dry)]
    if phase == 2:
        steps, runs, profiles = [], [], {}
        for m in MODELS:
            prof = profiles[m] = prev / f"profile_{m}.csv"
            if not prof.exists():  # a cold machine: phase 1's folder is gone
                prof = profiles[m] = work / f"profile_{m}_quick.csv"
                steps.append(_calibrate(m, preset, str(prof), dry, quick=True))
        # each run priced by its model's table and the host term fitted on the run before it, held out
        # (the runner's host time, not the profile's one-kernel floor): copy-on-write and swap first
        # (llama-2-7b), then llama-3-8b (GQA: the tensor-core kernel) by its term, llama-2-7b by that one's
        order = [("val_cow_swap", "llama-2-7b", COW_SWAP), *((f"val_{m}", m, ()) for m in MODELS[::-1])]
        for i, (name, m, extra) in enumerate(order):
            held_out = work / order[i - 1][0] if i else None
            steps.append(_val(name, m, preset, work, dry, *extra, profile=str(profiles[m]), host_from=held_out))
            runs += ["--run", str(work / name), str(profiles[m])]
        slope = (py(SLOPE_DRY) + [str(work / "decode_slope")] if dry else
                 [python(), "benchmarks/gpu_decode_slope.py", "--batches", "1,2,4,8,16,32",
                  "--out", str(work / "decode_slope")])
        # each model's whole steps priced with the host term fitted on the other's run (no GPU:
        # the committed files and the simulator, interpreted)
        heldout = Step("host_heldout", [python(), "benchmarks/validation_host_heldout.py", *runs], 30,
                       env={"PAGESIM_JIT": "0"})
        return steps + [Step("summary", py(SUMMARIZE) + [str(work)], 20), heldout, Step("decode_slope", slope, 90)]
    if phase == 3:
        paths = [python(), "benchmarks/gpu_decode_paths.py", "--out", str(work / "decode_paths.txt")]
        steps = _sanitizers(dry) + [Step("decode_paths", paths + (["--dry-run"] if dry else []), 90)]
        steps += [_val(f"val_layers{L}", "llama-2-7b", preset, work, dry, layers=L, size=LAYER_RUN, seed=1,
                       timeout_s=60 if L < 32 else 150) for L in LAYER_COUNTS]
        return steps + [Step("layer_scaling", py(LAYERS) + [str(work), *map(str, LAYER_COUNTS)], 20),
                        Step("summary", py(SUMMARIZE) + [str(work)], 20)]
    raise ValueError(phase)


# ---------------------------------------------------------------------- running a phase
def run_phase(phase: int, out: Path, dry: bool, work_root: Path | None = None, limit_s: float | None = None) -> int:
    t_start = time.monotonic()
    limit_s = PHASES[phase][1] - 10 if limit_s is None else limit_s  # 10 s for the tarball
    day = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    slug, preset = device_slug(dry)
    tag = f"{day}-{slug}"
    base = (work_root or ROOT / "out" / "gpu_programme") / tag
    work = base / f"phase{phase}"
    logs = work / "log"
    logs.mkdir(parents=True, exist_ok=True)
    dest = out / tag
    dest.mkdir(parents=True, exist_ok=True)
    summary = dest / f"summary{phase}.txt"
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)
        summary.write_text("\n".join(lines) + "\n")

    log(f"pagesim GPU programme phase {phase} ({'dry run, CPU' if dry else preset}) {tag}; "
        f"expected {PHASES[phase][0] // 60}-{PHASES[phase][1] // 60} min")
    site = ensure_wheels(log)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, IMPORT_PATH, str(ROOT), os.environ.get("PYTHONPATH", ""))
                                        if p)
    worst = 0
    for st in steps_for(phase, work, dry, preset, base / "phase1"):
        left = limit_s - (time.monotonic() - t_start)
        timeout = min(st.timeout_s, left - 10)
        if timeout < min(st.timeout_s, 15):
            log(f"{st.name:28s} skipped: {left:.0f} s left of the phase's {limit_s:.0f} s")
            worst = max(worst, 5)
            continue
        t0 = time.monotonic()
        argv = step_argv(st, log)
        with open(logs / f"{st.name}.txt", "w") as f:
            f.write("$ " + shlex.join(shown(argv)) + "\n")
            f.flush()
            try:
                rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env={**env, **st.env},
                                    timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        text = (logs / f"{st.name}.txt").read_text(errors="replace").rstrip().splitlines()
        log(f"{st.name:28s} rc={rc:<3d} {time.monotonic() - t0:6.1f} s" + (" (timed out)" if rc == 124 else ""))
        for ln in text[-(12 if st.name == "summary" else 3):]:
            log("    " + ln[:240])
        worst = max(worst, 1 if rc else 0)
    log(f"phase {phase} done in {time.monotonic() - t_start:.0f} s; files in {work}")
    with tarfile.open(dest / f"phase{phase}.tgz", "w:gz") as tar:
        tar.add(work, arcname=f"phase{phase}")
    return worst


def prepare(dest: Path = ROOT / ".whl") -> int:
    """Download the wheels the device image lacks (pure Python) into the git-ignored .whl/."""
    if not WHEELS:
        print("nothing to fetch: the device image has every package a step needs")
        return 0
    dest.mkdir(exist_ok=True)
    cmd = [python(), "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "--platform", "manylinux_2_17_x86_64", "-d", str(dest), *WHEELS]
    print("$ " + shlex.join(cmd))
    return subprocess.run(cmd).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("phase", choices=["prepare", *map(str, PHASES), "session", "all", "plan"],
                    help="prepare: wheels into .whl/ (here); 1-3: one device call each; session: 1 and 2 in one "
                         "call (a 15-minute session's programme); all: 1-3 in turn; plan: each phase's steps "
                         "and expected time")
    ap.add_argument("--dry-run", action="store_true", help="every step on the CPU (fake backend); no GPU needed")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "out" / "gpu_programme_out"),
                    help="where summaryN.txt and phaseN.tgz go (default: $OUT)")
    ap.add_argument("--work", default=str(ROOT / "out" / "gpu_programme"),
                    help="working folder (git-ignored; kept between calls while the machine stays warm)")
    ap.add_argument("--limit-s", type=float, default=None,
                    help="a phase's deadline in seconds (default: its worst expected time, PHASES)")
    a = ap.parse_args(argv)
    if a.phase == "prepare":
        return prepare()
    if a.phase == "plan":
        for p in PHASES:
            lo, hi = PHASES[p]
            print(f"phase {p}: {lo / 60:.1f}-{hi / 60:.1f} min")
            for st in steps_for(p, Path("out/gpu_programme/<date>-<device>") / f"phase{p}", a.dry_run, "h200",
                                Path("out/gpu_programme/<date>-<device>/phase1")):
                print(f"  {st.name:26s} <= {st.timeout_s:4d} s  {shlex.join(shown(st.argv))}")
        session = [PHASES[p] for p in SESSION_PHASES]
        print(f"phases {', '.join(map(str, SESSION_PHASES))}: {sum(lo for lo, _ in session) / 60:.1f}-"
              f"{sum(hi for _, hi in session) / 60:.1f} min of device time plus the machine's start (a session "
              "lent a GPU has 15 min); phase 3 another session's")
        return 0
    phases = list(PHASES) if a.phase == "all" else list(SESSION_PHASES) if a.phase == "session" else [int(a.phase)]
    rc = 0
    for p in phases:
        rc = max(rc, run_phase(p, Path(a.out), a.dry_run, Path(a.work), a.limit_s))
    return rc


if __name__ == "__main__":
    sys.exit(main())
