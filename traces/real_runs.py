"""Real serving runs read back: the engine a run served with, the workload it was sent and what
its client measured, so that ``pagesim validate --against`` can replay the same workload on the
same configuration and compare (``experiments/real_validate.py``).

Three formats:

- **inference-perf** (kubernetes-sigs/inference-perf), a run folder: ``results/config.yaml`` (the
  load generator's own config: stages, the ``shared_prefix`` data generator, ``ignore_eos``),
  ``results/summary_lifecycle_metrics.json`` and ``results/stage_N_lifecycle_metrics.json`` (what
  the client measured), and beside them the server's launch settings, ``exp-config.yaml``
  (``model``, ``tensor_parallelism``, ``max_model_len``, ``max_num_batched_tokens``,
  ``max_num_seqs``), as the public inference-sim/training runs keep them; a folder without it
  is refused (the engine's defaults are not the run's settings).
- **vllm bench serve** ``--save-result --save-detailed`` JSON (vLLM 0.33.0
  ``vllm/benchmarks/serve.py``, ``benchmark()``'s result dict, lines 1318-1339): per request
  ``input_lens``, ``output_lens``, ``start_times`` (the client's ``perf_counter`` at send),
  ``ttfts``, ``itls``, ``latencies``, ``errors``; the server's settings are not in the file. An
  older file (``benchmarks/benchmark_serving.py --save-result``, vLLM before ``start_times`` and
  ``latencies`` were kept) is read too: each latency is its TTFT plus the sum of its ITLs (the
  client timed both from the same send, ``latency = last chunk - send``), and without send times
  the client's own arrival process is drawn again at the file's ``request_rate`` and
  ``burstiness`` (``get_request``: gamma gaps of shape ``burstiness``, Poisson at 1; every request
  at 0 under ``"inf"``) when the replay runs.
- **LLMServingSim's vLLM runs** (casys-kaist/LLMServingSim, MIT; ``bench/core/recorder.py``), a
  folder ``<GPU>/<run>/vllm/`` (or that ``<run>`` folder): ``meta.json`` (the engine's settings,
  ``engine_kwargs``; where the run kept them, ``kv_cache.num_gpu_blocks`` (the pool vLLM
  allocated), ``block_size`` and ``hardware.device_name``) and ``requests.jsonl`` (per request
  ``input_toks``, ``output_toks`` and vLLM's ``RequestStateStats`` timestamps). ``arrival_time`` is
  the front end's wall clock and the other stamps the engine's monotonic one, so, as
  LLMServingSim's ``bench/core/validate.py`` does, a request arrives at its ``queued_ts`` and its
  TTFT and E2E count from there: the engine's view, without a front end.

A run reads into a :class:`RealRun`; the same :class:`RealRun` writes itself as rows of a fact
table (``run, section, key, value``) and reads back from them, so that figures taken from public
runs travel as a small table with their provenance instead of the runs' files
(``experiments/data/real_runs/``). Every malformed or missing field is a ``TraceError`` naming
the file and the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pagesim.sim.errors import TraceError
from pagesim.sim.limits import physical_memory_bytes
from pagesim.sim.run_memory import BYTES_PER_REQUEST_BOUND, bytes_per_request
from pagesim.traces.schema import to_seconds, to_tokens

#: the statistics inference-perf's lifecycle metrics give (``reportgen/base.py``'s ``summarize``)
#: that the comparison reads; the quantiles of prompt and output lengths are read in full
LATENCY_STATS = ("mean", "median", "p90", "p99")
LENGTH_QUANTILES = {"min": 0.0, "p0.1": 0.001, "p1": 0.01, "p5": 0.05, "p10": 0.1, "p25": 0.25, "median": 0.5,
                    "p75": 0.75, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p99.9": 0.999, "max": 1.0}
#: inference-perf's metric names -> ours (seconds each)
INFERENCE_PERF_LATENCIES = {"time_to_first_token": "ttft", "time_per_output_token": "tpot",
                            "inter_token_latency": "itl", "request_latency": "e2e"}
#: exp-config.yaml's keys -> the engine settings we read (vLLM's own names)
SERVER_KEYS = {"model": str, "tensor_parallelism": int, "max_model_len": int, "max_num_batched_tokens": int,
               "max_num_seqs": int}
#: aiohttp's default total timeout of a request (aiohttp client.py DEFAULT_TIMEOUT: 5 x 60 s)
AIOHTTP_DEFAULT_TIMEOUT_S = 300.0
#: vllm bench serve's client timeout (vllm/benchmarks/lib/endpoint_request_func.py:20: 6 h)
VLLM_BENCH_TIMEOUT_S = 6 * 60 * 60.0
#: vllm bench serve's per-request arrays: required, and those an older file lacks
VLLM_BENCH_ARRAYS = ("input_lens", "output_lens", "ttfts", "itls")
VLLM_BENCH_NEWER_ARRAYS = ("start_times", "latencies")
#: LLMServingSim's per-request fields (bench/core/recorder.py write_requests): the lengths, and the
#: engine's timestamps (null all together where vLLM returned no metrics: a failed request)
LLMSERVINGSIM_LENGTHS = ("input_toks", "output_toks")
LLMSERVINGSIM_STAMPS = ("queued_ts", "first_token_ts", "last_token_ts")
#: meta.json's engine_kwargs -> the engine settings we read (vLLM's names; tensor_parallelism as
#: exp-config.yaml names it)
LLMSERVINGSIM_ENGINE = {"tensor_parallel_size": ("tensor_parallelism", int),
                        "data_parallel_size": ("data_parallel_size", int),
                        "enable_expert_parallel": ("enable_expert_parallel", bool),
                        "max_num_seqs": ("max_num_seqs", int), "max_num_batched_tokens": ("max_num_batched_tokens", int),
                        "max_model_len": ("max_model_len", int), "kv_cache_dtype": ("kv_cache_dtype", str),
                        "dtype": ("dtype", str)}
#: meta.json's kv_cache (runs recorded once LLMServingSim kept it) -> the engine settings we read
LLMSERVINGSIM_KV_CACHE = {"num_gpu_blocks": ("num_gpu_blocks", int), "block_size": ("block_size", int),
                          "gpu_memory_utilization": ("gpu_memory_utilization", float),
                          "enable_prefix_caching": ("enable_prefix_caching", bool)}
#: the GPU presets of LLMServingSim's hardware names (its bench/examples/<GPU>/ folders and
#: configs/cluster "hardware") and of the device names its meta.json records (torch's)
LLMSERVINGSIM_GPUS = {"RTX4090": "rtx-4090", "RTXPRO6000": "rtx-pro-6000",
                      "NVIDIA GeForce RTX 4090": "rtx-4090",
                      "NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtx-pro-6000"}


@dataclass
class RealRun:
    """One real serving run. ``engine``: the server's settings the files state (vLLM's names:
    ``model``, ``tensor_parallelism``, ...). ``workload``: inference-perf's load and data settings,
    flattened (``stage.0.rate``, ``shared_prefix.num_groups``, ``prompt_len.p90``, ...), or empty.
    ``requests``: the per-request workload a vllm bench file lists (``arrival_s``, ``prompt_tokens``,
    ``output_tokens``), or None. ``measured``: scope (``overall``, ``stage 0``, ...) -> metric
    (``ttft_mean``, ``e2e_p99``, ``requests_per_s``, ...; seconds, requests per second).
    ``info``: what a fact table adds that the run's files do not state (``gpu``, ``source``)."""

    name: str
    fmt: str  # "inference-perf" or "vllm-bench"
    source: str
    engine: dict = field(default_factory=dict)
    workload: dict = field(default_factory=dict)
    requests: pd.DataFrame | None = None
    measured: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # a fact table's notes on the run: its gpu, its source

    @property
    def num_stages(self) -> int:
        return int(self.workload.get("stages", 1))

    def facts(self) -> list[tuple[str, str, str, object]]:
        """The run as fact-table rows ``(run, section, key, value)``: what a replay needs (engine,
        workload) and what the client measured, nothing else."""
        rows = [(self.name, "run", "format", self.fmt)] + [(self.name, "run", k, v) for k, v in self.info.items()]
        rows += [(self.name, "engine", k, v) for k, v in self.engine.items()]
        rows += [(self.name, "workload", k, v) for k, v in self.workload.items()]
        rows += [(self.name, f"measured {scope}", k, v) for scope, m in self.measured.items() for k, v in m.items()]
        return rows


def runs_from_facts(table: pd.DataFrame, source: str) -> list[RealRun]:
    """The runs a fact table (:meth:`RealRun.facts`'s rows, columns ``run, section, key, value``)
    holds, in the table's order. Only runs whose workload the table states (inference-perf's
    settings) can be replayed from it: a vllm bench run's per-request lists stay in its file."""
    for col in ("run", "section", "key", "value"):
        if col not in table.columns:
            raise TraceError(f"missing column (a fact table has run, section, key, value)", path=source, field=col)
    runs: dict[str, RealRun] = {}
    for i, (name, section, key, value) in enumerate(table[["run", "section", "key", "value"]].itertuples(index=False)):
        run = runs.setdefault(name, RealRun(name, "inference-perf", source))
        value = _fact_value(value)
        if section == "run" and key == "format":
            run.fmt = str(value)
        elif section == "run":
            run.info[key] = value
        elif section == "engine":
            run.engine[key] = value
        elif section == "workload":
            run.workload[key] = value
        elif section.startswith("measured "):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TraceError(f"expected a number, got {value!r}", path=source, row=i + 1, field="value")
            run.measured.setdefault(section[len("measured "):], {})[key] = float(value)
        else:
            raise TraceError(f"unknown section {section!r} (run, engine, workload, measured SCOPE)",
                             path=source, row=i + 1, field="section")
    return list(runs.values())


def _fact_value(value):
    """A fact's value as written: an int where it is one, a float, else the string."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
        return {"True": True, "False": False}.get(value, value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def read_real_run(path: str | Path) -> RealRun:
    """A run folder of LLMServingSim (``requests.jsonl`` inside, or in its ``vllm/``) or of
    inference-perf (``results/*_lifecycle_metrics.json`` inside), or a vllm bench serve JSON
    file; TraceError where it is none of them."""
    p = Path(path)
    if p.is_dir() and ((p / "requests.jsonl").is_file() or (p / "vllm" / "requests.jsonl").is_file()):
        return read_llmservingsim(p)
    if p.is_dir():
        return read_inference_perf(p)
    if p.is_file():
        return read_vllm_bench(p)
    raise TraceError("no such file or folder (an inference-perf or LLMServingSim run folder, a vllm bench serve "
                     "JSON or a fact table CSV)", path=str(p))


def read_real_runs(path: str | Path) -> list[RealRun]:
    """The runs at ``path``: one (:func:`read_real_run`), or every run of a fact table (a ``.csv``
    file, :func:`runs_from_facts`), each with its requests where the table has a per-request
    table beside it (:func:`requests_table_of`)."""
    p = Path(path)
    if p.suffix.lower() == ".csv" and p.is_file():
        try:
            table = pd.read_csv(p, comment="#", dtype=str, keep_default_na=False)
        except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
            raise TraceError(f"cannot read as a fact table: {str(e).splitlines()[0]}", path=str(p)) from None
        runs = runs_from_facts(table, str(p))
        if not runs:
            raise TraceError("no runs", path=str(p))
        if requests_table_of(p).is_file():
            attach_requests(runs, requests_table_of(p))
        return runs
    return [read_real_run(p)]


#: the columns of a per-request table beside a fact table: each request of each run as its files
#: list it (``RealRun.requests``: arrival in seconds from the run's first, lengths in tokens)
REQUEST_FACTS = ("run", "request_id", "arrival_s", "prompt_tokens", "output_tokens", "succeeded")


def requests_table_of(facts: Path) -> Path:
    """The per-request table beside the fact table ``facts``: ``<name>_requests.csv``."""
    return facts.with_name(f"{facts.stem}_requests.csv")


def request_facts(runs: list[RealRun]) -> pd.DataFrame:
    """The runs' requests as one table of :data:`REQUEST_FACTS` (runs without requests left out)."""
    frames = [run.requests.assign(run=run.name)[list(REQUEST_FACTS)] for run in runs if run.requests is not None]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(REQUEST_FACTS))


def attach_requests(runs: list[RealRun], path: Path) -> None:
    """Each run's requests from the per-request table ``path`` (:data:`REQUEST_FACTS`), where it
    lists the run; TraceError naming the file, row and field of a value that is not one."""
    table = pd.read_csv(path, comment="#", dtype={"run": str, "request_id": str}, keep_default_na=False)
    for col in REQUEST_FACTS:
        if col not in table.columns:
            raise TraceError(f"missing column (a per-request table has {', '.join(REQUEST_FACTS)})", path=str(path),
                             field=col)
    columns = {name: check(table[name], path=str(path), field=name) for name, check in
               (("arrival_s", to_seconds), ("prompt_tokens", to_tokens), ("output_tokens", to_tokens))}
    succeeded = table["succeeded"].astype(str)
    bad = np.flatnonzero(~succeeded.isin(["True", "False"]).to_numpy())
    if bad.size:
        raise TraceError(f"expected True or False, got {succeeded.iloc[bad[0]]!r}", path=str(path),
                         row=int(bad[0]) + 1, field="succeeded")
    frame = pd.DataFrame({"run": table["run"], "request_id": table["request_id"], **columns,
                          "succeeded": (succeeded == "True").to_numpy()})
    by_run = dict(tuple(frame.groupby("run", sort=False)))
    for run in runs:
        if run.name in by_run:
            run.requests = by_run[run.name].drop(columns="run").reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# inference-perf


def _load(path: Path) -> dict:
    """A YAML (``.yaml``) or JSON file holding a mapping; TraceError naming it otherwise."""
    import yaml

    yaml_file = path.suffix in (".yaml", ".yml")
    try:
        data = yaml.safe_load(path.read_text()) if yaml_file else json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"cannot read: {e}", path=str(path)) from None
    except yaml.YAMLError as e:
        raise TraceError(f"not YAML: {str(e).splitlines()[0]}", path=str(path)) from None
    except json.JSONDecodeError as e:
        raise TraceError(f"not JSON: {e.msg} at line {e.lineno}", path=str(path)) from None
    if not isinstance(data, dict):
        raise TraceError(f"expected a {'mapping' if yaml_file else 'JSON object'} at the top", path=str(path))
    return data


def _get(data: dict, dotted: str, path: Path, kind=float, required: bool = True, minimum=None,
         parts: list[str] | None = None):
    """``data``'s value at ``dotted`` (``a.b.c``; ``parts``: the keys, where one holds a dot, as
    ``p99.9``) as ``kind``; TraceError naming ``path`` and the field where it is missing
    (``required``) or not a ``kind`` at least ``minimum``."""
    node = data
    for part in parts if parts is not None else dotted.split("."):
        if not isinstance(node, dict) or part not in node or node[part] is None:
            if required:
                raise TraceError("missing", path=str(path), field=dotted)
            return None
        node = node[part]
    try:
        if kind is bool:
            if not isinstance(node, bool):
                raise ValueError
            value = node
        elif kind is int:
            if isinstance(node, bool) or float(node) != int(float(node)):
                raise ValueError
            value = int(float(node))
        elif kind is float:
            if isinstance(node, bool):
                raise ValueError
            value = float(node)
            if not math.isfinite(value):
                raise ValueError
        else:
            value = kind(node)
    except (TypeError, ValueError):
        raise TraceError(f"expected {kind.__name__}, got {node!r}", path=str(path), field=dotted) from None
    if minimum is not None and value < minimum:
        raise TraceError(f"must be >= {minimum}, got {value!r}", path=str(path), field=dotted)
    return value


def _lifecycle(path: Path) -> dict:
    """One lifecycle metrics file's figures the comparison reads (seconds; requests per second)."""
    data = _load(path)
    out = {"count": _get(data, "successes.count", path, int, minimum=0),
           "failures": _get(data, "failures.count", path, int, minimum=0)}
    for theirs, ours in INFERENCE_PERF_LATENCIES.items():
        for stat in LATENCY_STATS:
            out[f"{ours}_{stat}"] = _get(data, f"successes.latency.{theirs}.{stat}", path, minimum=0)
    out["requests_per_s"] = _get(data, "successes.throughput.requests_per_sec", path, minimum=0)
    for length in ("prompt_len", "output_len"):
        for q in LENGTH_QUANTILES:
            value = _get(data, f"successes.{length}.{q}", path, required=False, minimum=0,
                         parts=["successes", length, q])
            if value is not None:
                out[f"{length}.{q}"] = value
    return out


def per_token_figures(scope: dict, output_tokens: int) -> dict:
    """A scope's time per output token where every request generated ``output_tokens``: vLLM's
    TPOT, (E2E - TTFT) / (tokens - 1) per request, whose mean is then exactly (mean E2E - mean
    TTFT) / (tokens - 1) (ITL pooled over the scope's gaps is the same figure). inference-perf's own
    ``time_per_output_token`` and ``inter_token_latency`` time the stream's chunks, not tokens
    (``reportgen/base.py``: one gap per received chunk); in the public H100 runs a token arrives
    as two chunks 30 us apart (chunk gaps: median 31 us, p90 8.7 ms for 8.2 ms per token), which
    halves both. They are not compared."""
    if output_tokens < 2:
        return {}
    tpot = (scope["e2e_mean"] - scope["ttft_mean"]) / (output_tokens - 1)
    for stat in LATENCY_STATS:
        scope.pop(f"tpot_{stat}", None)
        scope.pop(f"itl_{stat}", None)
    return {"tpot_mean": tpot}


def read_inference_perf(folder: Path) -> RealRun:
    """An inference-perf run folder (see the module docstring)."""
    results = folder / "results"
    config_path = results / "config.yaml"
    if not config_path.is_file():
        raise TraceError("missing: an inference-perf run folder holds results/config.yaml", path=str(config_path))
    config = _load(config_path)
    data_type = _get(config, "data.type", config_path, str)
    if data_type != "shared_prefix":
        raise TraceError(f"data type {data_type!r} is not replayable here (shared_prefix is: its lengths are in "
                         "the config; other generators draw prompts from datasets)", path=str(config_path),
                         field="data.type")
    load_type = _get(config, "load.type", config_path, str)
    if load_type != "constant" and load_type != "poisson":
        raise TraceError(f"load type {load_type!r} is not replayable here (constant, poisson)",
                         path=str(config_path), field="load.type")
    stages = _get(config, "load.stages", config_path, list)
    if not stages:
        raise TraceError("no stages", path=str(config_path), field="load.stages")
    workload: dict = {"load.type": load_type, "stages": len(stages),
                      "load.interval": _get(config, "load.interval", config_path, required=False, minimum=0) or 0.0}
    for i in range(len(stages)):
        stage = stages[i]
        if not isinstance(stage, dict):
            raise TraceError(f"expected a mapping, got {stage!r}", path=str(config_path), field=f"load.stages[{i}]")
        for key in ("rate", "duration"):
            value = _get(stage, f"load.stages[{i}].{key}", config_path, parts=[key])
            if value <= 0:
                raise TraceError(f"must be > 0, got {value!r}", path=str(config_path), field=f"load.stages[{i}].{key}")
            workload[f"stage.{i}.{key}"] = value
        requests = workload[f"stage.{i}.rate"] * workload[f"stage.{i}.duration"]
        have = physical_memory_bytes()  # refused before any table is made:
        if requests * BYTES_PER_REQUEST_BOUND > have and requests * bytes_per_request() > have:
            raise TraceError(f"{requests:.3g} requests (rate x duration): more than this machine's memory holds the "
                             "tables of", path=str(config_path), field=f"load.stages[{i}]")
    for key in ("num_groups", "num_prompts_per_group", "system_prompt_len", "question_len", "output_len"):
        workload[f"shared_prefix.{key}"] = _get(config, f"data.shared_prefix.{key}", config_path, int,
                                                minimum=1 if key != "system_prompt_len" else 0)
    if _get(config, "data.shared_prefix.enable_multi_turn_chat", config_path, bool, required=False):
        raise TraceError("multi-turn chat sessions are not replayable here (each turn's prompt grows with the "
                         "session's history)", path=str(config_path), field="data.shared_prefix.enable_multi_turn_chat")
    for key in ("question_distribution", "output_distribution"):
        if _get(config, f"data.shared_prefix.{key}", config_path, dict, required=False):
            raise TraceError("length distributions are not replayable here (fixed lengths are)",
                             path=str(config_path), field=f"data.shared_prefix.{key}")
    workload["ignore_eos"] = bool(_get(config, "server.ignore_eos", config_path, bool, required=False))
    # the client gives up after load.request_timeout (main.py:187), unset: aiohttp's own default
    # total timeout, 5 x 60 s (client/modelserver/openai_client.py:139 passes aiohttp's sentinel)
    workload["client_timeout_s"] = (_get(config, "load.request_timeout", config_path, required=False, minimum=0)
                                    or AIOHTTP_DEFAULT_TIMEOUT_S)

    measured = {}
    summary_path = results / "summary_lifecycle_metrics.json"
    if not summary_path.is_file():
        raise TraceError("missing", path=str(summary_path))
    measured["overall"] = _lifecycle(summary_path)
    for i in range(len(stages)):
        stage_path = results / f"stage_{i}_lifecycle_metrics.json"
        if stage_path.is_file():  # a one-stage run may keep only the summary
            measured[f"stage {i}"] = _lifecycle(stage_path)
        elif len(stages) > 1:
            raise TraceError("missing (the config has this stage)", path=str(stage_path))
    if workload["ignore_eos"]:  # every request generated output_len tokens: TPOT from the means, exactly
        for scope in measured.values():
            scope.update(per_token_figures(scope, workload["shared_prefix.output_len"]))
    for length in ("prompt_len", "output_len"):  # the lengths the client saw, for rebuilding the prompts
        for q in LENGTH_QUANTILES:
            key = f"{length}.{q}"
            if key in measured["overall"]:
                workload[key] = measured["overall"].pop(key)
        for scope in measured.values():
            for q in LENGTH_QUANTILES:
                scope.pop(f"{length}.{q}", None)
    if "prompt_len.median" not in workload:
        raise TraceError("missing (the prompts' lengths as the client counted them)", path=str(summary_path),
                         field="successes.prompt_len.median")

    server_path = folder / "exp-config.yaml"
    engine: dict = {}
    if not server_path.is_file():  # the engine's own defaults would stand in for the run's settings
        raise TraceError("missing (the server's launch settings: its max_num_seqs, max_num_batched_tokens, "
                         "max_model_len, ...)", path=str(server_path))
    server = _load(server_path)
    for key, kind in SERVER_KEYS.items():
        value = _get(server, key, server_path, kind, required=False, minimum=1 if kind is int else None)
        if value is not None:
            engine[key] = value
    if "model" not in engine:
        engine["model"] = _get(config, "server.model_name", config_path, str)
    return RealRun(folder.name, "inference-perf", str(folder), engine, workload, None, measured)


# ---------------------------------------------------------------------------------------------
# vllm bench serve


def latency_stats(name: str, values: np.ndarray) -> dict:
    """``values``' mean, median, p90 and p99 as ``{name}_mean``, ... (nothing where empty)."""
    if not len(values):
        return {}
    return {f"{name}_mean": float(np.mean(values)), f"{name}_median": float(np.median(values)),
            f"{name}_p90": float(np.percentile(values, 90)), f"{name}_p99": float(np.percentile(values, 99))}


def read_vllm_bench(path: Path) -> RealRun:
    """A ``vllm bench serve --save-result --save-detailed`` JSON file, or an older
    ``benchmark_serving.py --save-result`` one (module docstring)."""
    data = _load(path)
    for key in VLLM_BENCH_ARRAYS + VLLM_BENCH_NEWER_ARRAYS:
        if key not in data:
            if key in VLLM_BENCH_NEWER_ARRAYS:
                continue
            raise TraceError("missing (a vllm bench serve file keeps it with --save-result --save-detailed, an older "
                             "benchmark_serving.py one with --save-result)", path=str(path), field=key)
        if not isinstance(data[key], list):
            raise TraceError(f"expected a list, got {type(data[key]).__name__}", path=str(path), field=key)
    n = len(data["input_lens"])
    for key in VLLM_BENCH_ARRAYS + VLLM_BENCH_NEWER_ARRAYS:
        if key in data and len(data[key]) != n:
            raise TraceError(f"{len(data[key])} entries, but input_lens has {n}", path=str(path), field=key)
    if n == 0:
        raise TraceError("no requests", path=str(path), field="input_lens")
    errors = data.get("errors") or [""] * n
    if not isinstance(errors, list) or len(errors) != n:
        raise TraceError(f"expected a list of {n} entries (one per request)", path=str(path), field="errors")
    for i, (e, gaps) in enumerate(zip(errors, data["itls"])):
        if e is not None and not isinstance(e, str):
            raise TraceError(f"expected text, got {e!r}", path=str(path), row=i + 1, field="errors")
        if not isinstance(gaps, list) or any(isinstance(g, bool) or not isinstance(g, (int, float))
                                             or not math.isfinite(g) or g < 0 for g in gaps):
            raise TraceError("expected a list of numbers >= 0 (seconds between tokens)", path=str(path),
                             row=i + 1, field="itls")

    def column(key: str, kind=float) -> np.ndarray:
        values = data[key]
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (kind is int and float(v) != int(v)):
                raise TraceError(f"expected a {'whole ' if kind is int else ''}number >= 0, got {v!r}",
                                 path=str(path), row=i + 1, field=key)
        return np.asarray(values, dtype=np.int64 if kind is int else np.float64)

    prompt, output, ttft = column("input_lens", int), column("output_lens", int), column("ttfts")
    # an older client timed the latency from the same send as the TTFT, to the last chunk: the
    # TTFT and every gap after it (benchmark_serving.py's async_request_openai_completions)
    latency = column("latencies") if "latencies" in data else ttft + np.array([math.fsum(g) for g in data["itls"]])
    workload: dict = {"client_timeout_s": VLLM_BENCH_TIMEOUT_S}
    if "start_times" in data:
        start = column("start_times")
        arrival = start - start.min()
    else:
        workload.update(_send_process(data, path))
        arrival = np.full(n, np.nan)  # drawn when the replay runs (real_validate.validate_run)
    ok = np.array([not e for e in errors], dtype=bool) & (output > 0)  # vLLM: a failed request has output 0
    if not ok.any():
        raise TraceError("every request failed (errors, or output_lens all 0): nothing to compare",
                         path=str(path), field="errors")
    order = np.argsort(arrival, kind="stable")  # without send times: the file's order, the order sent
    requests = pd.DataFrame({"request_id": [f"r{i}" for i in order], "arrival_s": arrival[order],
                             "prompt_tokens": np.maximum(prompt[order], 1), "output_tokens": output[order],
                             "succeeded": ok[order]})
    # vLLM's own definitions (calculate_metrics, serve.py:634-664): TPOT over outputs longer than one
    tpot = np.where(output > 1, (latency - ttft) / np.maximum(output - 1, 1), np.nan)[ok]
    itl = np.concatenate([np.asarray(x, dtype=np.float64) for x, good in zip(data["itls"], ok) if good and len(x)]
                         or [np.zeros(0)])
    measured = {"count": int(ok.sum()), "failures": int((~ok).sum())}
    for name, values in (("ttft", ttft[ok]), ("tpot", tpot[~np.isnan(tpot)]), ("itl", itl), ("e2e", latency[ok])):
        measured.update(latency_stats(name, values))
    duration = _get(data, "duration", path, minimum=0, required=False)
    if duration:  # vLLM's request_throughput: completed / the benchmark's duration
        measured["requests_per_s"] = measured["count"] / duration
    engine = {"model": str(data.get("model_id") or data.get("tokenizer_id") or "")}
    if not engine["model"]:
        engine.pop("model")
    return RealRun(path.stem, "vllm-bench", str(path), engine, workload, requests, {"overall": measured})


def _send_process(data: dict, path: Path) -> dict:
    """How an older client sent its requests, where the file keeps no send times: its
    ``request_rate`` (requests per second, ``"inf"``: all at once) and ``burstiness`` (1: Poisson),
    as ``workload`` entries ``send.rate`` and ``send.burstiness``; TraceError where the file does not
    say, or where the client's sends followed something else (a concurrency cap, a ramp)."""
    rate = data.get("request_rate")
    if rate is None:
        raise TraceError("missing, and no request_rate to draw the send times from", path=str(path),
                         field="start_times")
    if data.get("max_concurrency") is not None:
        raise TraceError(f"{data['max_concurrency']!r}: each send waited for a free slot, and without start_times "
                         "those times are unknown", path=str(path), field="max_concurrency")
    if data.get("ramp_up_strategy") is not None:
        raise TraceError("a ramped rate without start_times is not replayable here", path=str(path),
                         field="ramp_up_strategy")
    if rate == "inf":
        rate = math.inf
    elif isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise TraceError(f"expected a number > 0 or \"inf\", got {rate!r}", path=str(path), field="request_rate")
    burstiness = _get(data, "burstiness", path, required=False) or 1.0
    if burstiness <= 0:
        raise TraceError(f"must be > 0, got {burstiness!r}", path=str(path), field="burstiness")
    return {"send.rate": float(rate), "send.burstiness": float(burstiness)}


def send_times(count: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """``count`` send times (seconds from the first) as vLLM's ``benchmark_serving.py``
    ``get_request`` spaces them: the first at 0, then a gap before each next one drawn from a gamma
    distribution of shape ``burstiness`` and mean 1 / ``rate`` (exponential at burstiness 1); all
    at 0 at an infinite rate. The client's own draws used its own seed: these are a draw of the same
    process, not its times."""
    if math.isinf(rate):
        return np.zeros(count)
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=max(count - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])


# ---------------------------------------------------------------------------------------------
# LLMServingSim


def read_llmservingsim(folder: Path) -> RealRun:
    """An LLMServingSim run folder (module docstring): ``<GPU>/<run>/vllm`` or ``<GPU>/<run>``."""
    vllm = folder if (folder / "requests.jsonl").is_file() else folder / "vllm"
    run_folder = vllm.parent if vllm.name == "vllm" else vllm
    meta_path, requests_path = vllm / "meta.json", vllm / "requests.jsonl"
    if not meta_path.is_file():
        raise TraceError("missing (the engine's settings)", path=str(meta_path))
    meta = _load(meta_path)
    engine: dict = {"model": _get(meta, "model", meta_path, str)}
    for theirs, (ours, kind) in LLMSERVINGSIM_ENGINE.items():
        value = _get(meta, f"engine_kwargs.{theirs}", meta_path, kind, required=False,
                     minimum=1 if kind is int else None)
        if value is not None:
            engine[ours] = value
    for theirs, (ours, kind) in LLMSERVINGSIM_KV_CACHE.items():
        value = _get(meta, f"kv_cache.{theirs}", meta_path, kind, required=False, minimum=1 if kind is int else None)
        if value is not None:
            engine[ours] = value
    version = _get(meta, "vllm_version", meta_path, str, required=False)
    if version:
        engine["vllm_version"] = version
    info = {}
    device = _get(meta, "hardware.device_name", meta_path, str, required=False)
    gpu = LLMSERVINGSIM_GPUS.get(device) if device else LLMSERVINGSIM_GPUS.get(run_folder.parent.name)
    if gpu:
        info["gpu"] = gpu

    rows = _jsonl(requests_path)
    lengths = {key: np.zeros(len(rows), dtype=np.int64) for key in LLMSERVINGSIM_LENGTHS}
    stamps = {key: np.full(len(rows), np.nan) for key in LLMSERVINGSIM_STAMPS}
    for i, (line, row) in enumerate(rows):
        where = {"path": str(requests_path), "row": line}
        for key in LLMSERVINGSIM_LENGTHS:
            value = row.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1 or float(value) != int(value):
                raise TraceError("missing" if value is None else f"expected a whole number >= 1, got {value!r}",
                                 **where, field=key)
            lengths[key][i] = int(value)
        given = [row.get(key) is not None for key in LLMSERVINGSIM_STAMPS]
        if any(given) and not all(given):
            raise TraceError("missing, where the request's other timestamps are given", **where,
                             field=LLMSERVINGSIM_STAMPS[given.index(False)])
        if all(given):
            for key in LLMSERVINGSIM_STAMPS:
                value = row[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise TraceError(f"expected a number (seconds), got {value!r}", **where, field=key)
                stamps[key][i] = value
            for earlier, later in zip(LLMSERVINGSIM_STAMPS, LLMSERVINGSIM_STAMPS[1:]):
                if stamps[later][i] < stamps[earlier][i]:
                    raise TraceError(f"{stamps[later][i]!r} is before {earlier} {stamps[earlier][i]!r}", **where,
                                     field=later)
    if not rows:
        raise TraceError("no requests", path=str(requests_path))
    queued, first, last = (stamps[key] for key in LLMSERVINGSIM_STAMPS)
    ok = np.isfinite(queued)
    if not ok.any():
        raise TraceError("no request has timestamps (vLLM returned no metrics for any): nothing to compare",
                         path=str(requests_path), field="queued_ts")
    prompt, output = lengths["input_toks"], lengths["output_toks"]
    arrival = queued - np.nanmin(queued)
    order = np.flatnonzero(ok)[np.argsort(arrival[ok], kind="stable")]  # a request without stamps never arrived
    requests = pd.DataFrame({"request_id": [f"r{i}" for i in order], "arrival_s": arrival[order],
                             "prompt_tokens": prompt[order], "output_tokens": output[order],
                             "succeeded": np.ones(len(order), dtype=bool)})
    ttft, e2e = (first - queued)[ok], (last - queued)[ok]
    many = ok & (output > 1)
    tpot = ((last - first) / np.maximum(output - 1, 1))[many]
    measured = {"count": int(ok.sum()), "failures": int((~ok).sum())}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        measured.update(latency_stats(name, values))
    if many.any():  # a scope's token gaps pooled, as real_validate.scope_figures pools the simulation's
        measured["itl_mean"] = float((last - first)[many].sum() / (output[many] - 1).sum())
    span = float(np.nanmax(last) - np.nanmin(queued))
    if span > 0:
        measured["requests_per_s"] = measured["count"] / span
    name = f"{run_folder.parent.name}-{run_folder.name}" if run_folder.parent.name else run_folder.name
    return RealRun(name, "llmservingsim", str(folder), engine, {"clock": "engine"}, requests,
                   {"overall": measured}, info)


def _jsonl(path: Path) -> list[tuple[int, dict]]:
    """A JSON-lines file's objects with their 1-based line numbers (blank lines skipped);
    TraceError naming the file and the line."""
    if not path.is_file():
        raise TraceError("missing (the requests)", path=str(path))
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"cannot read: {e}", path=str(path)) from None
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"not JSON: {e.msg}", path=str(path), row=i + 1) from None
        if not isinstance(row, dict):
            raise TraceError("expected a JSON object", path=str(path), row=i + 1)
        rows.append((i + 1, row))
    return rows
