"""Builders shared by the simulator's tests (plain functions and one fake executor; fixtures
live in conftest.py). Test modules import from here, never from each other."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from pagesim.sim.config import SimConfig

OPT13B_SLOT = 819200  # KV bytes per token of OPT-13B
TESTS_ROOT = Path(__file__).resolve().parents[2]  # the checkout the tests run from


def subprocess_path(root: Path = TESTS_ROOT) -> str:
    """A child's import path: the tests' root, after the caller's PYTHONPATH (a worktree's
    ``pagesim`` link), so that the child imports the same ``pagesim`` as this process."""
    return os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(root)) if p)


def trace_of(rows, prefix=False) -> pd.DataFrame:
    """Requests as (arrival_s, prompt, output[, prefix hashes])."""
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(len(rows))], "arrival_s": [r[0] for r in rows],
                       "prompt_tokens": [r[1] for r in rows], "output_tokens": [r[2] for r in rows]})
    if prefix:
        df["prefix_hashes"] = [r[3] for r in rows]
        df.attrs["hash_block_tokens"] = 16
    return df


def rand_trace(seed: int, n: int = 160, rate: float = 40.0, max_len: int = 256, width: dict | None = None,
               prefix: bool = False) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, n)
    burst = rng.random(n) < 0.3  # bursts: several arrivals at once queue up behind each other
    gaps[burst] = 0.0
    arrival = np.cumsum(gaps)
    prompt = rng.integers(1, max_len // 2, n)
    output = np.minimum(rng.integers(1, max_len // 2, n), max_len - prompt)
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_s": arrival,
                       "prompt_tokens": prompt, "output_tokens": np.maximum(output, 1)})
    for k, v in (width or {}).items():
        df[k] = rng.choice(v, n)
    if prefix:
        df["prefix_hashes"] = [tuple(rng.integers(0, 3, max(p // 16, 0)).tolist()) for p in prompt]
        df.attrs["hash_block_tokens"] = 16
    return df


def cfg_for(system="vllm", slots=3000, **kw):
    kw.setdefault("max_seq_len", 256)
    kw.setdefault("model", "opt-13b")
    return SimConfig.for_system(system, gpu="a100-80gb", kv_gib=slots * OPT13B_SLOT / 2**30, **kw)


#: a one-layer Llama with one 64-wide KV head: 256 B of KV per token, so a pool of 3 x 2**26
#: tokens (48 GiB) fits on a real GPU beside its weights, as a larger --kv-gib is refused
TINY_SLOT = 256
TINY_CONFIG = {"_name_or_path": "tiny-test", "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
               "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 1000,
               "max_position_embeddings": 1 << 28, "tie_word_embeddings": True, "torch_dtype": "float16"}


def schedule_vllm(s):
    """vLLM v0's (and Orca's) iteration over state ``s``, by CPython (no compile of it on its own
    for a test's few calls: ~20 s of numba), for the state's scheduler family."""
    from pagesim.sim.core import state
    from pagesim.sim.core.sched import scheduler_vllm
    from pagesim.sim.core.compile.jit import interpreted

    return interpreted(scheduler_vllm.schedule)(s, s.config[state.FAMILY_TRAITS])


@functools.cache
def tiny_model() -> str:
    """The path of :data:`TINY_CONFIG` as a Hugging Face config.json (``--model PATH``)."""
    path = Path(tempfile.mkdtemp(prefix="pagesim-tiny-")) / "config.json"
    path.write_text(json.dumps(TINY_CONFIG))
    return str(path)


def huge_cfg_for(system="vllm", slots=3000, **kw):
    """:func:`cfg_for` with :func:`tiny_model`: pools of hundreds of millions of token slots."""
    kw.setdefault("max_seq_len", 256)
    return SimConfig.for_system(system, model=tiny_model(), gpu="a100-80gb", kv_gib=slots * TINY_SLOT / 2**30, **kw)


class ConstExecutor:
    """Every iteration takes ``dt`` seconds: timelines become hand-computable. An executor
    outside the core (``sim.executor.is_external``): it reads each scheduled iteration from the
    core's arrays, as the GPU executor does, and keeps ``batches``: (prefilling requests, their
    new tokens, decoding requests, their contexts including this step's token, copy-on-write
    block copies)."""

    def __init__(self, dt: float = 1.0):
        self.dt = dt
        self.batches = []

    def start(self, core) -> None:
        pass

    def step(self, core) -> float:
        from pagesim.sim.core import state

        c = core.count
        num_prefill = int(c[state.STEP_PREFILL_SEQS])
        decoding = []
        if c[state.STEP_DECODE_SEQS]:
            running = core.running[:c[state.NUM_RUNNING]]
            decoding = running[core.in_decode[running] != 0].tolist()
        self.batches.append((core.step_prefill_ids[:num_prefill].tolist(),
                             core.step_prefill_tokens[:num_prefill].tolist(), decoding,
                             core.num_computed_tokens[decoding].tolist(), int(c[state.STEP_COPIED_BLOCKS])))
        return self.dt

    def finish(self, core) -> None:
        pass


def trace(rows, **extra) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["arrival_s", "prompt_tokens", "output_tokens"])
    df.insert(0, "request_id", [f"r{i}" for i in range(len(df))])
    for k, v in extra.items():
        df[k] = v
    return df


def small_cfg(system="vllm", **kw) -> SimConfig:
    # 64 KV slots of OPT-13B (819,200 B each), max length 32: small enough to reason about
    kw.setdefault("kv_gib", 64 * 819200 / 2**30)
    kw.setdefault("max_seq_len", 32)
    kw.setdefault("check", True)
    if system == "vllm":
        kw.setdefault("block_size", 4)
        kw.setdefault("watermark", 0.0)
    return SimConfig.for_system(system, **kw)


def write_table_profile(path, prefill: bool = True, overhead_us: float | None = 3000.0):
    """A small measured profile (``sim/cost/profile_format.py``) for the table cost model: linear at
    1-256 tokens, decode on a 3 x 3 grid (batch 1-32, context 16-256), prefill at 16-64 tokens
    (``prefill=False``: none, the roofline prices prefill), so runs of ``rand_trace`` fall inside,
    below and beyond every table. Returns ``path``."""
    from pagesim.sim.cost.profile_format import write_profile

    common = dict(model="opt-13b", gpu="a100-80gb", dtype="float16", tp=1)
    rows = [dict(component="linear", num_tokens=n, batch=None, context=None, time_us=t, **common)
            for n, t in ((1, 20000.0), (16, 20500.0), (64, 22000.0), (256, 40000.0))]
    rows += [dict(component="attn_decode", num_tokens=None, batch=b, context=c, time_us=20.0 + 0.05 * b * c, **common)
             for b in (1, 8, 32) for c in (16, 64, 256)]
    if prefill:
        rows += [dict(component="attn_prefill", num_tokens=n, batch=None, context=None, time_us=t, **common)
                 for n, t in ((16, 150.0), (32, 250.0), (64, 700.0))]
    if overhead_us is not None:
        rows.append(dict(component="overhead", num_tokens=None, batch=None, context=None, time_us=overhead_us,
                         **common))
    write_profile(rows, path)
    return path


class RunTooLong(Exception):
    pass


class ends_within:
    """``with ends_within(seconds):`` fails a test whose run does not end in time (a live lock
    would otherwise hang the suite) instead of waiting for it. Main thread, POSIX only."""

    def __init__(self, seconds: int):
        self.seconds = int(seconds)

    def __enter__(self):
        import signal

        def alarm(signum, frame):
            raise RunTooLong(f"the run did not end within {self.seconds} s")
        self._previous = signal.signal(signal.SIGALRM, alarm)
        signal.alarm(self.seconds)
        return self

    def __exit__(self, *exc):
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, self._previous)
        return False


# (TP, fixed ms, ms per sequence, Ray ms): what the fit must find again
LINES = [(1, 1.0, 0.05, 0.5), (2, 6.0, 0.04, 5.0)]
BATCHES = (8, 16, 32, 64, 128)


def vidur_table(path, lines=LINES, upper=False):
    """Vidur's columns: each iteration's CPU time (fixed + per_seq x batch ms, the Ray round trip
    included) split 10/30/20/40 % over schedule, sampler, prepare inputs and process outputs."""
    rows = []
    for tp, fixed, per_seq, ray in lines:
        for model in ("org/A", "org/B"):
            for b in BATCHES:
                cpu = fixed + per_seq * b - ray
                rows.append({"model_name": model, "batch_size": b, "tensor_parallel_degree": tp,
                             "schedule_median": 0.1 * cpu, "sampler_e2e_median": 0.3 * cpu,
                             "prepare_inputs_e2e_median": 0.2 * cpu, "process_model_outputs_median": 0.4 * cpu,
                             "schedule_mean": 9.0, "sampler_e2e_mean": 9.0, "prepare_inputs_e2e_mean": 9.0,
                             "process_model_outputs_mean": 9.0, "model_execution_e2e_median": 50.0,
                             "ray_comm_time_mean": ray, "ray_comm_time_median": 99.0})
    import pandas as pd

    df = pd.DataFrame(rows)
    if upper:  # the older files name their columns in capitals
        df.columns = [c.upper() if c not in ("model_name", "batch_size", "tensor_parallel_degree") else c
                      for c in df.columns]
    df.to_csv(path)
    return path


def assert_simulate_refuses(argv, words, capsys):
    """``pagesim simulate`` over two requests with ``argv`` exits 2 with one line holding ``words``."""
    from pagesim.sim.cli import main
    try:
        rc = main(["simulate", "--num-requests", "2", "--no-progress", *argv])
    except SystemExit as e:  # argparse's usage errors exit through SystemExit
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


#: Qwen1.5-MoE-A2.7B's config.json (Hugging Face): 60 routed experts, 4 a token, a shared expert
QWEN1_5_MOE = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
               "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_attention_heads": 16,
               "num_key_value_heads": 16, "num_hidden_layers": 24, "num_experts": 60, "num_experts_per_tok": 4,
               "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
               "max_position_embeddings": 8192, "use_sliding_window": False, "sliding_window": 32768,
               "tie_word_embeddings": False}


def checkout_copy(tmp_path: Path):
    """A copy of the checkout's code (without its tests, docs, results and caches) in
    ``tmp_path/pagesim``, and a function running ``python ARGV...`` there, importing the copy as
    ``pagesim`` (interpreted: ``PAGESIM_JIT=0``), that returns its stdout and fails the test on a
    non-zero exit: where docs/design.md's recipes are carried out."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "pagesim"
    shutil.copytree(TESTS_ROOT, copy, ignore=shutil.ignore_patterns(
        "__pycache__", ".git", "site", "out", "*.egg-info", ".pytest_cache", ".hypothesis", "results",
        "benchmarks", "tests", "docs", "compiled"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PAGESIM_JIT="0")  # `import pagesim` is the copy

    def python(*argv: str) -> str:
        done = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    return copy, python
