"""A seeded fuzz over the features today's engines add (issue 80): SGLang's radix cache and its
host tier, vLLM v1's CPU offload tier, speculative decoding (n-gram, EAGLE, MTP, a draft model),
hybrid models' KV groups (sliding-window and Mamba layers), priorities, vLLM 0.4.2's parallel
sampling and beam search with recompute or swap, chunked prefill, shared prompt prefixes, and
pools from barely one request up; and, one seed in five, Orca's contiguous reservations (max,
pow2, oracle or predicted; buddy, first-fit or best-fit placement; recompute or swap) or static
batching (:func:`reservation_system`); a run on one engine, or replicas behind a router, or vLLM v1
disaggregated into prefill and decode pools (:func:`topology`). Each configuration is drawn from its seed alone
(:func:`case`), checked every iteration (``--check``).

An outcome is ``ok`` (every request finished or rejected with a reason), ``refused`` (a
``ConfigError`` of one line, before the run), or a fault: ``invariant`` (``InvariantError``:
``--check``'s, a stall, a lost request), ``exception`` (anything else: a traceback; with numba's
bounds checking on, ``IndexError`` is a write past a table), ``hang`` or ``crash`` (the process
died: a segfault or an abort).

``tests/sim/test_feature_space.py`` runs a fixed sample in the suite; the whole hunt, each chunk in
a child process watched for hangs and crashes::

    NUMBA_BOUNDSCHECK=1 python -m tests.sim.feature_space --count 5000 [--start 0] [--jobs 2]
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd

MAX_LEN = 128
MODELS = ("opt-13b", "llama-3.1-8b", "mixtral-8x7b", "gemma-2-27b", "jamba-1.5-mini")
FAULTS = ("invariant", "exception", "hang", "crash")


def topology(seed: int, system: str, kw: dict) -> tuple:
    """How configuration ``seed`` is served: ``("single",)``, ``("cluster", replicas, router)`` (any
    system) or ``("disaggregated", prefill, decode, router)`` (vllm-v1 without a host tier, which
    disaggregation refuses), drawn apart from :func:`case`'s draws so that those stay as they were."""
    rng = np.random.default_rng([seed, 1])
    draw = rng.random()
    if system == "vllm-v1" and "kv_offload_gib" not in kw and draw < 0.15:
        from pagesim.sim.disagg import DISAGG_ROUTERS

        return "disaggregated", int(rng.integers(1, 3)), int(rng.integers(1, 3)), str(rng.choice(DISAGG_ROUTERS))
    if draw < 0.3:
        from pagesim.sim.cluster import ROUTERS

        return "cluster", int(rng.integers(2, 4)), str(rng.choice(ROUTERS))
    return ("single",)


#: the systems of whole-request reservations (sim/systems.py): Orca's contiguous reservations and
#: static batching, which a share of seeds is switched to (:func:`reservation_system`)
RESERVATION_SYSTEMS = ("orca-max", "orca-pow2", "orca-oracle", "static")


def slot_bytes(model: str, tensor_parallel: int) -> int:
    """One token's KV bytes over the model's ``tensor_parallel`` GPUs."""
    from pagesim.sim.specs.presets import MODELS as PRESETS

    return PRESETS[model].kv_bytes_per_token(tensor_parallel) * tensor_parallel


def reservation_system(seed: int, kw: dict, trace: pd.DataFrame):
    """The share of seeds (one in five) that runs an Orca scheduler over a contiguous manager
    or static batching instead: (system, its settings, the trace), or None. Drawn apart from
    :func:`case`'s draws (as :func:`topology` is), so that every other seed draws what it drew
    before; the model, pool, sequence limit, seed and trace stay the seed's own."""
    rng = np.random.default_rng([seed, 2])
    if rng.random() >= 0.2:
        return None

    def pick(*options):
        return options[int(rng.integers(len(options)))]

    system = pick(*RESERVATION_SYSTEMS)
    kept = {name: kw[name] for name in ("model", "gpu", "tensor_parallel", "kv_gib", "max_seq_len", "check", "seed",
                                        "max_num_seqs")}
    if system == "static":
        kept["static_batch_size"] = pick(None, 1, 2, 4, 16)
    else:
        kept["placement"] = pick("buddy", "first-fit", "best-fit")
        if rng.random() < 0.2:  # the length predictor's reservation, its error drawn
            kept.update(reservation="predicted", predictor_error=pick(0.0, 0.3, 1.0))
        kept["preemption"] = pick("recompute", "swap")
        kept["swap_gib"] = pick(0, 16, 4096) * slot_bytes(kw["model"], kw["tensor_parallel"]) / 2**30  # in slots
        kept["chunked_prefill"] = bool(rng.random() < 0.3)
    return system, kept, trace.drop(columns=["priority"], errors="ignore")  # priorities are vllm-v1's


#: how much a stretched seed (:func:`stretched`) scales its lengths, its pool and its hash blocks
STRETCH = 8


def stretched(seed: int, system: str, kw: dict, trace: pd.DataFrame):
    """The share of seeds (one in ten) whose requests, sequence limit, pool and prefix-hash blocks
    are :data:`STRETCH` times longer (up to 1,024 tokens: a block of 256 then holds several
    tokens' worth of a request, so hybrid models' cached states and prefix caching's align mode
    are reached), and whose vLLM 0.4.2 chunked prefill has a token budget drawn down to one token
    (below a group's width); drawn apart from :func:`paged_case`'s draws (as :func:`topology` is),
    so that every other seed draws what it drew before. (system, settings, trace), or None."""
    rng = np.random.default_rng([seed, 3])
    if rng.random() >= 0.1:
        return None
    kw = dict(kw, max_seq_len=STRETCH * kw["max_seq_len"], kv_gib=STRETCH * kw["kv_gib"])
    if system == "vllm" and kw.get("chunked_prefill"):
        kw["chunk_budget"] = int((1, 8, 64, 512)[int(rng.integers(4))])
    trace = trace.assign(prompt_tokens=STRETCH * trace["prompt_tokens"],
                         output_tokens=STRETCH * trace["output_tokens"])
    if "hash_block_tokens" in trace.attrs:
        trace.attrs["hash_block_tokens"] *= STRETCH  # the same hashes over the longer prompts
    return system, kw, trace


def case(seed: int):
    """Configuration ``seed``: (system, the settings ``SimConfig.for_system`` takes, the trace);
    one seed in ten stretched (:func:`stretched`), one in five an Orca or static system
    (:func:`reservation_system`)."""
    system, kw, trace = paged_case(seed)
    system, kw, trace = stretched(seed, system, kw, trace) or (system, kw, trace)
    return reservation_system(seed, kw, trace) or (system, kw, trace)


def paged_case(seed: int):
    """Configuration ``seed`` on a paged engine (sglang, vllm-v1, vllm), before
    :func:`reservation_system`'s switch."""
    rng = np.random.default_rng(seed)

    def pick(*options):
        return options[int(rng.integers(len(options)))]

    system = pick("sglang", "sglang", "vllm-v1", "vllm-v1", "vllm-v1", "vllm")
    model = pick(*MODELS)
    tensor_parallel = 2 if model in ("mixtral-8x7b", "jamba-1.5-mini") else 1  # their weights fit two A100s
    slot = slot_bytes(model, tensor_parallel)
    slots = pick(MAX_LEN, MAX_LEN + 40, 2 * MAX_LEN, 4 * MAX_LEN, 16 * MAX_LEN)
    block = pick(1, 4, 16, 64, 256) if system != "vllm" else pick(4, 8, 16)
    kw = dict(model=model, gpu="a100-80gb", tensor_parallel=tensor_parallel, kv_gib=slots * slot / 2**30, max_seq_len=MAX_LEN,
              block_size=block, check=True, seed=int(rng.integers(2**16)),
              max_num_seqs=pick(1, 2, 4, 16, 256), prefix_caching=bool(rng.random() < 0.6))
    width = 1
    priorities = False
    if system in ("sglang", "vllm-v1") and rng.random() < 0.5:  # a host tier
        kw["kv_offload_gib"] = pick(8, 64, 512, 4096) * slot / 2**30
    if system == "sglang":
        kw.pop("prefix_caching")  # the radix cache is always on
        kw["schedule_policy"] = pick("fcfs", "lpm")
        kw["schedule_conservativeness"] = pick(0.3, 1.0, 1.4286)
    elif system == "vllm-v1":
        kw["async_scheduling"] = bool(rng.random() < 0.5)
        kw["max_num_batched_tokens"] = pick(MAX_LEN, 2 * MAX_LEN, 2048)
        kw["max_num_seqs"] = min(kw["max_num_seqs"], kw["max_num_batched_tokens"])
        hybrid = model in ("gemma-2-27b", "jamba-1.5-mini")
        if "kv_offload_gib" in kw:  # the tier is keyed by block hash; not modelled over hybrids' groups
            kw["prefix_caching"] = True
            if hybrid:
                del kw["kv_offload_gib"]
        if rng.random() < 0.5:
            # EAGLE's and MTP's trailing block is not modelled with the tier
            method = pick("ngram", "draft-model") if "kv_offload_gib" in kw else pick("ngram", "eagle", "draft-model",
                                                                                    "mtp")
            if hybrid:
                kw["prefix_caching"] = False  # hybrids' prefix caching is not modelled with drafts
            kw.update(speculative_method=method, num_speculative_tokens=int(pick(1, 2, 4)),
                      spec_acceptance_rate=pick(0.0, 0.5, 1.0))
            if method == "draft-model":
                kw["draft_model"] = model
        if rng.random() < 0.3:
            kw["scheduling_policy"] = "priority"
            priorities = True
    else:  # vLLM 0.4.2
        kw["preemption"] = pick("recompute", "swap")
        kw["swap_gib"] = pick(0, 16, 4096) * slot / 2**30
        kw["chunked_prefill"] = bool(rng.random() < 0.3)
        kw["watermark"] = pick(0.0, 0.01, 0.1)
        width = pick(1, 1, 2, 4)
    n = int(rng.integers(1, 25))
    gaps = rng.exponential(pick(0.01, 0.1, 1.0), n) * (rng.random(n) < 0.7)
    prompt = rng.integers(1, MAX_LEN, n)
    output = np.maximum(1, np.minimum(rng.integers(1, MAX_LEN, n), MAX_LEN - prompt))
    trace = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_s": np.cumsum(gaps),
                          "prompt_tokens": prompt, "output_tokens": output})
    if width > 1:
        trace[pick("n", "beam_width")] = rng.integers(1, width + 1, n)
    if priorities:
        trace["priority"] = rng.integers(0, 3, n)
    if rng.random() < 0.7:  # shared prompt prefixes: a few chains, each request ending its own way
        hash_tokens = pick(4, 16, 32)
        roots = rng.integers(0, 3, n)
        trace["prefix_hashes"] = [tuple([int(root)] + rng.integers(0, 2, -(-int(p) // hash_tokens) - 1).tolist())
                                  for root, p in zip(roots, prompt)]
        trace.attrs["hash_block_tokens"] = hash_tokens
    return system, kw, trace


def refusal(error) -> tuple[str, str]:
    """A ConfigError's outcome: ``refused`` where it is one line, else a fault."""
    return ("refused", str(error)) if "\n" not in str(error) else ("exception", "a refusal of many lines")


def prepared(seed: int):
    """Configuration ``seed`` made ready to run: (its configuration, its trace, how it is served:
    :func:`topology`); a ``ConfigError`` where it is refused before it runs."""
    from pagesim.sim.config import SimConfig
    from pagesim.sim.run import initial_state

    system, kw, trace = case(seed)
    served = topology(seed, system, kw)
    if served[0] == "cluster":  # --check reads one engine's state (a disaggregated run checks each)
        kw = {**kw, "check": False}
    cfg = SimConfig.for_system(system, **kw)
    initial_state(cfg, trace)
    if served[0] == "disaggregated":  # what a disaggregated run refuses, before it runs
        from pagesim.sim.disagg import check_disagg
        check_disagg(cfg, cfg, served[1], served[2], served[3], "ib-ndr")
    return cfg, trace, served


def served_run(cfg, trace, served):
    """Run a :func:`prepared` configuration as it is served: one engine, a cluster or
    disaggregated pools; returns the run's result."""
    from pagesim.sim.run import run_simulation

    if served[0] == "cluster":
        from pagesim.sim.cluster import run_cluster
        return run_cluster(cfg, trace, served[1], served[2])
    if served[0] == "disaggregated":
        from pagesim.sim.disagg import run_disaggregated
        return run_disaggregated(cfg, cfg, trace, served[1], served[2], served[3])
    return run_simulation(cfg, trace)


def outcome(seed: int) -> tuple[str, str]:
    """Run configuration ``seed``: (its outcome, a line saying why where it is not ``ok``)."""
    from pagesim.sim.errors import ConfigError, InvariantError

    try:
        cfg, trace, served = prepared(seed)
    except ConfigError as error:
        return refusal(error)
    try:
        result = served_run(cfg, trace, served)
    except InvariantError as error:
        return "invariant", str(error)
    except ConfigError as error:  # a cluster's own refusal (its router, its replicas)
        return refusal(error)
    except Exception as error:  # noqa: BLE001 (every other one is a fault, named)
        return "exception", f"{type(error).__name__}: {error}"
    summary, requests = result.summary, result.requests
    if summary["completed"] + summary["rejected"] != len(trace):
        return "invariant", f"{len(trace) - summary['completed'] - summary['rejected']} requests lost"
    rejected = requests[requests["status"] == "rejected"]
    if (rejected["reject_reason"].str.len() == 0).any():
        return "invariant", "a request rejected without a reason"
    return "ok", ""


def child(start: int, stop: int) -> None:
    """Run ``start..stop``, one line per seed as it starts and as it ends (the parent watches)."""
    for seed in range(start, stop):
        print(f"start {seed}", flush=True)
        kind, why = outcome(seed)
        print(f"done {seed} {kind} {why[:300]!r}", flush=True)


def hunt(start: int, count: int, jobs: int, hang_s: float) -> collections.Counter:
    """Every seed of ``start..start + count`` in ``jobs`` children, a chunk each; a child that
    dies (a crash) or is silent for ``hang_s`` on a seed (a hang) is that seed's fault, and a new
    child goes on from the next seed. Each fault and every 250th seed's counts are said on stderr
    as they come."""
    import selectors

    bounds = np.linspace(start, start + count, jobs + 1).astype(int)
    todo = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    counts: collections.Counter = collections.Counter()
    faults = []
    selector = selectors.DefaultSelector()

    def found(seed, kind, why):  # said at once on stderr (a long hunt's progress), listed in order at the end
        faults.append((seed, kind, why))
        print(f"found: seed {seed}: {kind}: {why}", file=sys.stderr, flush=True)

    def launch(a, b):
        process = subprocess.Popen([sys.executable, "-m", "tests.sim.feature_space", "--child", str(a), str(b)],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        selector.register(process.stdout, selectors.EVENT_READ, [process, a, b, None, time.monotonic()])

    for a, b in todo:
        launch(a, b)
    while selector.get_map():
        for key, _ in selector.select(timeout=1.0):
            data = key.data
            line = key.fileobj.readline()
            if line.startswith("start "):
                data[3], data[4] = int(line.split()[1]), time.monotonic()
            elif line.startswith("done "):
                _, seed, kind, why = line.rstrip("\n").split(" ", 3)
                counts[kind] += 1
                data[3] = None
                if kind in FAULTS:
                    found(int(seed), kind, why)
                if sum(counts.values()) % 250 == 0:
                    print(f"{sum(counts.values())} of {count} seeds: " + ", ".join(f"{k} {n}" for k, n in counts.items()),
                          file=sys.stderr, flush=True)
            elif not line:  # the child ended
                selector.unregister(key.fileobj)
                process, seed = data[0], data[3]
                process.wait()
                if seed is not None:  # died inside a seed
                    counts["crash"] += 1
                    found(seed, "crash", f"exit code {process.returncode}")
                    if seed + 1 < data[2]:
                        launch(seed + 1, data[2])
        for key in list(selector.get_map().values()):
            data = key.data
            if data[3] is not None and time.monotonic() - data[4] > hang_s:
                data[0].kill()
                counts["hang"] += 1
                found(data[3], "hang", f"no end within {hang_s:g} s")
                seed, data[3] = data[3], None
                selector.unregister(key.fileobj)
                data[0].wait()
                if seed + 1 < data[2]:
                    launch(seed + 1, data[2])
    for seed, kind, why in sorted(faults):
        print(f"seed {seed}: {kind}: {why}")
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--hang-s", type=float, default=300.0, help="seconds a seed may run (compiles included)")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    began = time.monotonic()
    counts = hunt(args.start, args.count, args.jobs, args.hang_s)
    faults = sum(counts[kind] for kind in FAULTS)
    print(f"seeds {args.start}..{args.start + args.count - 1}: " + ", ".join(
        f"{kind} {counts[kind]}" for kind in ("ok", "refused", *FAULTS))
        + f"; {time.monotonic() - began:.0f} s; bounds checked: {os.environ.get('NUMBA_BOUNDSCHECK') == '1'}")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
