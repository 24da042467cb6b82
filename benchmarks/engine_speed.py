"""Simulation speed: wall seconds and simulated requests per second, on one core.

1. Replay the Azure LLM inference 2023 conv trace (19,366 requests, ../shared/traces/) through
   ``--system vllm`` on OPT-13B / A100-80GB (target: engine under 0.1 s). The default engine
   takes the core (``sim/core/``, compiled by numba); the baselines measured in the same run
   are the Python engine (macro steps), the Python engine step by step, and Python without the
   decode lane. The core's records are compared with the Python run's (identical request and
   step tables expected). The same trace under the other cost models (a measured profile,
   the calibrated roofline, scaled), core against Python. Also: the whole ``pagesim simulate``
   process against a bare ``python -c "import numpy, pandas"`` (target: within 2x), and numba's
   compile time, cold (an empty cache) and warm (loaded from the cache), each in a fresh process.
   The same trace through ``orca-max``, ``orca-pow2``, ``orca-oracle``, ``static`` (also with
   ``--cost-model calibrated``) and ``orca-max --reservation predicted`` on the core (target:
   engine under 0.3 s each), the Python engine in the same run as the baseline, and the records
   compared.
2. Linear growth: synthetic ShareGPT traces of growing size up to 1,000,000 requests
   (target: under 10 s, peak memory under 1 GB with ``record_steps=False``), on the core, with the
   Python engine as the baseline up to 100,000 requests; ``--synthetic-system`` picks the system
   (``vllm``; ``orca-oracle`` for the Orca target). The peak RSS printed is the process's so far.
3. Macro steps where they pay off (Python engine): a low-rate synthetic trace, with and
   without them.
4. Prefix caching (``--prefix-caching``): the Mooncake conversation trace (12,031 requests,
   512-token block hashes, ../shared/traces/) on Llama-3.1-8B / A100-80GB (target: engine
   under 1 s), and 100,000 synthetic ShareGPT requests given Mooncake-like hashes (shared
   conversation prefixes), each on the core with the Python engine as the baseline in the
   same run and the records compared.
5. Beam search: Fig. 15's beam runs (``pagesim reproduce fig15``) on the core, the Python engine
   as the baseline in the same run, and the records compared.

The process pins itself to one CPU first (Linux), so "one core" is literal.
Run: ``python benchmarks/engine_speed.py [--max-requests 1000000] [--skip-azure]
[--synthetic-system orca-oracle] [--only-prefix-caching | --only-beam-search]``.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

from pagesim.sim.config import SimConfig  # noqa: E402
from pagesim.sim.run import run_simulation  # noqa: E402

AZURE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
MEASURED = ROOT.parent / "shared" / "measured"


def timed(cfg, trace, *, no_lane: bool = False, macro_steps: bool = True, engine: str = "auto", result=False):
    if no_lane:
        import pagesim.sim.memory.paged as paged

        paged.PagedManager.decode_lane = False
    try:
        t0 = time.perf_counter()
        res = run_simulation(cfg, trace, macro_steps=macro_steps, engine=engine)
        wall = time.perf_counter() - t0
    finally:
        if no_lane:
            paged.PagedManager.decode_lane = True
    return (wall, res.summary, res) if result else (wall, res.summary)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def seconds(cmd, env=None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def whole_process(trace) -> None:
    """The whole command against a bare interpreter with numpy and pandas, in the same run;
    then numba's compile, cold and warm, in fresh processes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "azure_le_2048.csv"
        trace.to_csv(path, index=False)
        bare = min(seconds([sys.executable, "-c", "import numpy, pandas"]) for _ in range(3))
        cmd = [sys.executable, "-m", "pagesim.sim.cli", "simulate", "--trace", str(path), "--system", "vllm",
               "--model", "opt-13b", "--gpu", "a100-80gb", "--no-progress", "--out", str(Path(tmp) / "out")]
        whole = min(seconds(cmd) for _ in range(3))
        print(f"  whole `pagesim simulate` process (load, run, write outputs): {whole:.2f} s; bare "
              f"`import numpy, pandas` {bare:.2f} s: x{whole / bare:.1f} (target x2)")
        small = [sys.executable, "-c", "from pagesim.sim.run import run_simulation; from pagesim.sim.config import SimConfig; "
                 "from pagesim.traces.synth import make_workload; run_simulation(SimConfig(), "
                 "make_workload('sharegpt', rate=2, num_requests=20))"]
        env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(tmp) / "numba"), PYTHONPATH=import_path())
        cold = seconds(small, env)
        warm = seconds(small, env)
        print(f"  numba: a 20-request run in a fresh process, empty cache {cold:.1f} s (the one-time "
              f"compile), cached {warm:.2f} s")


def with_prefix_hashes(trace, hash_block_tokens: int = 64, conversations: int = 200, seed: int = 0):
    """Mooncake-like hashes for a synthetic trace: each request continues one of
    ``conversations`` (Zipf-like popularity) for a random share of its prompt's hash blocks,
    the rest are its own."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = len(trace)
    blocks = -(-trace["prompt_tokens"].to_numpy() // hash_block_tokens)
    conv = np.minimum(rng.zipf(1.5, n), conversations) - 1
    shared = (rng.random(n) * (blocks + 1)).astype(np.int64)
    hashes = []
    for i in range(n):
        own = 1_000_000_000 + i * 10_000
        hashes.append(tuple(int(conv[i]) * 10_000 + j if j < shared[i] else own + j for j in range(blocks[i])))
    trace = trace.copy()
    trace["prefix_hashes"] = hashes
    trace.attrs["hash_block_tokens"] = hash_block_tokens
    return trace


def prefix_caching() -> None:
    """Section 4: prefix caching on the core and, as the baseline, the Python engine."""
    from pagesim.traces.synth import make_workload

    runs = []
    if MOONCAKE.exists():
        from pagesim.traces import load_trace

        runs.append(("mooncake conversation", load_trace(MOONCAKE),
                     SimConfig.for_system("vllm", model="llama-3.1-8b", gpu="a100-80gb", prefix_caching=True,
                                          max_len_policy="drop")))
    else:
        print(f"mooncake trace not found at {MOONCAKE}: skipped")
    trace = with_prefix_hashes(make_workload("sharegpt", rate=20.0, num_requests=100_000, seed=0))
    runs.append(("sharegpt 100,000 requests at 20 req/s with shared prefixes", trace,
                 SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", prefix_caching=True,
                                      record_steps=False)))
    for name, trace, cfg in runs:
        timed(cfg, trace.iloc[:20], engine="core")  # numba's cache loaded
        # CPU seconds too: on a shared machine wall time measures the neighbours
        cpu0 = time.process_time()
        wall, s, rc = timed(cfg, trace, engine="core", result=True)
        cpu1 = time.process_time()
        py, _, rp = timed(cfg, trace, engine="python", result=True)
        cpu2 = time.process_time()
        same = rc.requests.equals(rp.requests) and rc.steps.equals(rp.steps)
        print(f"{name}, --prefix-caching, {cfg.model} {cfg.gpu}: core {wall:.2f} s wall, {cpu1 - cpu0:.2f} s CPU "
              f"(engine {s['wall_time_s']:.2f} s wall), {s['num_steps']:,} steps, hit rate "
              f"{s['prefix_cache_hit_rate']:.3f}, {s['mgr_evictions']:,} evictions; Python engine {py:.2f} s wall, "
              f"{cpu2 - cpu1:.2f} s CPU (x{(cpu2 - cpu1) / (cpu1 - cpu0):.1f} in CPU); "
              f"records {'identical' if same else 'DIFFERENT'}")


def cost_models(trace) -> None:
    """The same trace priced by the other cost models, on the core and on the Python engine:
    a measured profile (the table model: Llama-2-7B's A100 timings, imported by ``pagesim cost
    import`` from ../shared/measured), the calibrated roofline, and the calibrated roofline with
    its GPU time scaled (``plan``'s error band). Engine seconds (the run itself, as
    ``summary['wall_time_s']``), the core against the Python engine in the same run."""
    runs = [("--cost-model calibrated", dict(cost_model="calibrated")),
            ("--cost-model calibrated --cost-scale 1.07", dict(cost_model="calibrated", cost_scale=1.07))]
    with tempfile.TemporaryDirectory() as tmp:
        if MEASURED.exists():
            profile = Path(tmp) / "llama-2-7b.csv"
            subprocess.run([sys.executable, "-m", "pagesim.sim.cli", "cost", "import", "--measured", str(MEASURED),
                            "--model", "llama-2-7b", "--gpu", "a100-80gb", "--out", str(profile)],
                           check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            runs.insert(0, ("--profile (llama-2-7b measured on a100-80gb)", dict(profile=str(profile))))
        else:
            print(f"  measured timings not found at {MEASURED}: --profile skipped")
        for label, kw in runs:
            cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", max_len_policy="error", **kw)
            timed(cfg, trace.iloc[:20], engine="core")  # the model's first call (numba's cache) aside
            timed(cfg, trace.iloc[:20], engine="python")
            _, sc, rc = timed(cfg, trace, engine="core", result=True)
            _, sp, rp = timed(cfg, trace, engine="python", result=True)
            same = rc.requests.equals(rp.requests) and rc.steps.equals(rp.steps)
            c, p = sc["wall_time_s"], sp["wall_time_s"]
            print(f"  same trace, {label}: engine on the core {c:.3f} s, Python engine {p:.2f} s (x{p / c:.0f}), "
                  f"{sc['num_steps']} steps, records {'identical' if same else 'DIFFERENT'}")


def beam_search() -> None:
    """Section 5: Fig. 15's beam-search runs (``pagesim reproduce fig15``: Alpaca and ShareGPT,
    beam width 2, 4, 6, with sharing) on the core, the Python engine as the baseline in the same
    run, engine seconds (``summary['wall_time_s']``) and the records compared."""
    from pagesim.experiments.sweep import expand_grid, load_experiment
    from pagesim.traces.synth import make_workload

    specs = [sp for sp in expand_grid(load_experiment("fig15")) if sp.beam_width > 1 and not sp.unshare]
    total_core = total_python = 0.0
    for sp in specs:
        trace, cfg = make_workload(sp.workload, **sp.workload_kwargs()), sp.sim_config()
        timed(cfg, trace.iloc[:20], engine="core")  # numba's cache loaded
        _, sc, rc = timed(cfg, trace, engine="core", result=True)
        _, sp_, rp = timed(cfg, trace, engine="python", result=True)
        same = rc.requests.equals(rp.requests) and rc.steps.equals(rp.steps)
        c, p = sc["wall_time_s"], sp_["wall_time_s"]
        total_core, total_python = total_core + c, total_python + p
        print(f"fig15 {sp.workload} beam_width {sp.beam_width} ({len(trace)} requests, {sc['num_steps']:,} steps): "
              f"engine on the core {c:.3f} s, Python engine {p:.2f} s (x{p / c:.0f}), "
              f"records {'identical' if same else 'DIFFERENT'}")
    print(f"fig15's beam runs: engine on the core {total_core:.2f} s, Python engine {total_python:.2f} s "
          f"(x{total_python / total_core:.0f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-requests", type=int, default=1_000_000)
    ap.add_argument("--skip-azure", action="store_true")
    ap.add_argument("--only-prefix-caching", action="store_true", help="section 4 only")
    ap.add_argument("--only-whole-process", action="store_true",
                    help="the whole `pagesim simulate` process on the Azure conv trace against a bare start")
    ap.add_argument("--only-beam-search", action="store_true", help="section 5 only")
    ap.add_argument("--synthetic-system", default="vllm", help="system of the growth runs (vllm, orca-oracle, ...)")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        print(f"pinned to CPU {min(os.sched_getaffinity(0))}")
    if args.only_prefix_caching:
        prefix_caching()
        return
    if args.only_whole_process:
        from pagesim.traces import load_trace
        from pagesim.traces.transform import apply_max_len_policy

        whole_process(apply_max_len_policy(load_trace(AZURE), 2048, "drop")[0])
        return
    if args.only_beam_search:
        beam_search()
        return

    if not args.skip_azure and AZURE.exists():
        from pagesim.traces import load_trace

        trace = load_trace(AZURE)
        cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", max_len_policy="error")
        from pagesim.traces.transform import apply_max_len_policy

        trace, _ = apply_max_len_policy(trace, 2048, "drop")
        t0 = time.perf_counter()  # numba loads the compiled core from its cache at the first call
        timed(cfg, trace.iloc[:20], engine="core")
        print(f"loading the compiled core (first call in this process): {time.perf_counter() - t0:.2f} s")
        wall, s, rc = timed(cfg, trace, engine="core", result=True)
        py, _, rp = timed(cfg, trace, engine="python", result=True)
        step, _ = timed(cfg, trace, macro_steps=False)
        base, _ = timed(cfg, trace, no_lane=True, engine="python")
        same = rc.requests.equals(rp.requests) and rc.steps.equals(rp.steps)
        print(f"azure conv ({len(trace)} requests <= 2048 tokens) vllm opt-13b a100-80gb, core: "
              f"{wall:.3f} s wall ({wall / len(trace) * 1e6:.1f} us/request), engine {s['wall_time_s']:.3f} s, "
              f"{s['num_steps']} steps, {len(trace) / wall:,.0f} simulated req/s")
        print(f"  baselines, same run: Python engine {py:.2f} s (x{py / wall:.1f}); Python step by step "
              f"{step:.2f} s (x{step / wall:.1f}); Python without the decode lane {base:.2f} s (x{base / wall:.1f})")
        print(f"  core vs Python records: request and step tables {'identical' if same else 'DIFFERENT'}")
        ch = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", max_len_policy="error",
                                  chunked_prefill=True, chunk_budget=512)
        cw, cs = timed(ch, trace, engine="core")
        cp, _ = timed(ch, trace, engine="python")
        print(f"  same trace, chunked prefill (budget 512): core {cw:.3f} s, Python engine {cp:.2f} s "
              f"(x{cp / cw:.1f}), {cs['num_steps']} steps")
        cost_models(trace)
        for system, kw in (("orca-max", {}), ("orca-pow2", {}), ("orca-oracle", {}), ("static", {}),
                           ("static", dict(cost_model="calibrated")), ("orca-max", dict(reservation="predicted"))):
            c = SimConfig.for_system(system, model="opt-13b", gpu="a100-80gb", max_len_policy="error", **kw)
            w, s2, r2 = timed(c, trace, engine="core", result=True)
            pw, p2, rp2 = timed(c, trace, engine="python", result=True)
            same = r2.requests.equals(rp2.requests) and r2.steps.equals(rp2.steps)
            label = system + "".join(f" --{k.replace('_', '-')} {v}" for k, v in kw.items())
            print(f"  same trace, --system {label}: core engine {s2['wall_time_s']:.3f} s ({w:.2f} s wall), "
                  f"Python engine {p2['wall_time_s']:.2f} s ({pw:.2f} s wall; engine x{p2['wall_time_s'] / s2['wall_time_s']:.0f}), "
                  f"{s2['num_steps']} steps, records {'identical' if same else 'DIFFERENT'} (target: engine < 0.3 s)")
        c = SimConfig.for_system("token", model="opt-13b", gpu="a100-80gb", max_len_policy="error")
        w, s2 = timed(c, trace)
        print(f"  same trace, --system token: {w:.2f} s wall ({s2['engine']} engine), {s2['num_steps']} steps")
        whole_process(trace)
    elif not args.skip_azure:
        print(f"azure conv trace not found at {AZURE}: skipped")

    from pagesim.traces.synth import make_workload

    sizes = [n for n in (10_000, 100_000, 1_000_000) if n <= args.max_requests]
    rows = []
    for n in sizes:
        trace = make_workload("sharegpt", rate=20.0, num_requests=n, seed=0)
        system = args.synthetic_system
        cfg = SimConfig.for_system(system, model="opt-13b", gpu="a100-80gb", record_steps=False)
        wall, s = timed(cfg, trace, engine="core")
        rows.append((n, wall))
        line = (f"sharegpt {n:>9,} requests at 20 req/s, {system} opt-13b a100-80gb, core: {wall:7.2f} s wall, "
                f"{n / wall:,.0f} req/s ({wall / n * 1e6:.1f} us/request, engine {s['wall_time_s']:.2f} s), "
                f"{s['num_steps']:,} steps, peak RSS {peak_rss_mb():,.0f} MB")
        if n <= 100_000:
            py, _ = timed(cfg, trace, engine="python")
            line += f"; Python engine {py:.2f} s (x{py / wall:.1f})"
        print(line)
    # decode-heavy stretches (few arrivals per iteration): where macro steps pay off
    trace = make_workload("sharegpt", rate=1.0, num_requests=2000, seed=0)
    cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", record_steps=False)
    on, s = timed(cfg, trace, engine="python")
    off, _ = timed(cfg, trace, macro_steps=False)
    print(f"sharegpt     2,000 requests at 1 req/s, vllm opt-13b a100-80gb, Python engine: {on:7.2f} s wall, "
          f"{s['num_steps']:,} steps; step by step (macro_steps=False) {off:.2f} s (x{off / on:.2f})")
    if len(rows) > 1:
        n0, w0 = rows[0]
        for n, w in rows[1:]:
            print(f"growth {n0:,} -> {n:,} requests: x{n / n0:.0f} requests, x{w / w0:.1f} time "
                  f"(1M at this rate: {w / n * 1e6:.0f} s; target < 10 s)")
    prefix_caching()
    beam_search()


if __name__ == "__main__":
    main()
