"""Real serving runs read back: the engine a run served with, the workload it was sent and what
its client measured, so that ``pagesim validate --against`` can replay the same workload on the
same configuration and compare (``experiments/real_validate.py``).

Two formats:

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
  ``ttfts``, ``itls``, ``latencies``, ``errors``; the server's settings are not in the file.

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
from pagesim.sim.limits import BYTES_PER_REQUEST, physical_memory_bytes

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
#: vllm bench serve's per-request arrays, all required
VLLM_BENCH_ARRAYS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "latencies")


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
    """A run folder of inference-perf (``results/*_lifecycle_metrics.json`` inside), or a vllm
    bench serve JSON file; TraceError where it is neither."""
    p = Path(path)
    if p.is_dir():
        return read_inference_perf(p)
    if p.is_file():
        return read_vllm_bench(p)
    raise TraceError("no such file or folder (an inference-perf run folder, a vllm bench serve JSON or a fact "
                     "table CSV)", path=str(p))


def read_real_runs(path: str | Path) -> list[RealRun]:
    """The runs at ``path``: one (:func:`read_real_run`), or every run of a fact table (a ``.csv``
    file, :func:`runs_from_facts`)."""
    p = Path(path)
    if p.suffix.lower() == ".csv" and p.is_file():
        try:
            table = pd.read_csv(p, comment="#", dtype=str, keep_default_na=False)
        except (OSError, UnicodeDecodeError, pd.errors.ParserError) as e:
            raise TraceError(f"cannot read as a fact table: {str(e).splitlines()[0]}", path=str(p)) from None
        runs = runs_from_facts(table, str(p))
        if not runs:
            raise TraceError("no runs", path=str(p))
        return runs
    return [read_real_run(p)]


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
        if requests * BYTES_PER_REQUEST > physical_memory_bytes():  # refused before any table is made
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


def read_vllm_bench(path: Path) -> RealRun:
    """A ``vllm bench serve --save-result --save-detailed`` JSON file."""
    data = _load(path)
    for key in VLLM_BENCH_ARRAYS:
        if key not in data:
            raise TraceError("missing (save the run with --save-result --save-detailed)", path=str(path), field=key)
        if not isinstance(data[key], list):
            raise TraceError(f"expected a list, got {type(data[key]).__name__}", path=str(path), field=key)
    n = len(data["input_lens"])
    for key in VLLM_BENCH_ARRAYS:
        if len(data[key]) != n:
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

    prompt, output = column("input_lens", int), column("output_lens", int)
    start, ttft, latency = column("start_times"), column("ttfts"), column("latencies")
    ok = np.array([not e for e in errors], dtype=bool) & (output > 0)  # vLLM: a failed request has output 0
    if not ok.any():
        raise TraceError("every request failed (errors, or output_lens all 0): nothing to compare",
                         path=str(path), field="errors")
    arrival = start - start.min()
    order = np.argsort(arrival, kind="stable")
    requests = pd.DataFrame({"request_id": [f"r{i}" for i in order], "arrival_s": arrival[order],
                             "prompt_tokens": np.maximum(prompt[order], 1), "output_tokens": output[order],
                             "succeeded": ok[order]})
    # vLLM's own definitions (calculate_metrics, serve.py:634-664): TPOT over outputs longer than one
    tpot = np.where(output > 1, (latency - ttft) / np.maximum(output - 1, 1), np.nan)[ok]
    itl = np.concatenate([np.asarray(x, dtype=np.float64) for x, good in zip(data["itls"], ok) if good and len(x)]
                         or [np.zeros(0)])
    measured = {"count": int(ok.sum()), "failures": int((~ok).sum())}
    for name, values in (("ttft", ttft[ok]), ("tpot", tpot[~np.isnan(tpot)]), ("itl", itl), ("e2e", latency[ok])):
        if len(values):
            measured.update({f"{name}_mean": float(np.mean(values)), f"{name}_median": float(np.median(values)),
                             f"{name}_p90": float(np.percentile(values, 90)),
                             f"{name}_p99": float(np.percentile(values, 99))})
    duration = _get(data, "duration", path, minimum=0, required=False)
    if duration:  # vLLM's request_throughput: completed / the benchmark's duration
        measured["requests_per_s"] = measured["count"] / duration
    engine = {"model": str(data.get("model_id") or data.get("tokenizer_id") or "")}
    if not engine["model"]:
        engine.pop("model")
    return RealRun(path.stem, "vllm-bench", str(path), engine, {"client_timeout_s": VLLM_BENCH_TIMEOUT_S}, requests,
                   {"overall": measured})
