"""The 2023 engines' speed, from a measurement no vLLM-paper figure depends on (issue 84 item 1).

The vLLM paper ran vLLM 0.1 and its Orca baselines (one codebase, §6.1) on OPT-13B and an A100,
with 2023's kernels, no CUDA graphs and a Python engine loop; the roofline prices a step as
today's kernels run it (``sim/cost/roofline.py``). Left at the roofline the paper's engines come
out too fast in every figure that reads time (rates above the paper's axes, batches smaller: the
issue's table). The constant that closes that is not read off the paper: it is fitted on the one
real measurement of an engine of that era at hand, the DistServe artifact's vLLM 0.1.7
(github.com/LLMServe/DistServe at 82831f1, its baseline: OPT-13B on A100-80GB, ShareGPT chatbot,
100 requests per GPU, SLOs TTFT 0.25 s and TPOT 0.1 s), whose SLO attainment at eight rates is in
``experiments/data/paper_numbers.csv`` (the ``distserve`` rows, read off the artifact's saved
figure).

``python benchmarks/fit_engine_era.py`` replays that colocated setup (the ``distserve`` figure's
``vllm`` runs: three replicas behind round-robin) with each cost model's GPU time scaled by a
factor (``cost_scale``: every step's GPU time, not its CPU time) and keeps the factor whose
attainment curve lies closest to the measured one (root mean square over the eight rates). It
tries CPU costs alone too (a fixed cost per step, a cost per sequence) and writes how close
their best comes, so that the file says why the factor is a GPU time's. It writes
:data:`PATH`.

The vLLM paper's figures run with that factor: their configs set ``cost_scale = "engine-era"``
(:data:`ENGINE_ERA`), which :func:`resolve` replaces with the factor of each run's cost model.
Held out by source: no vLLM-paper number is read to fit it. The DistServe figure itself, the
curve it was fitted on, does not (``reproduce`` never prices a figure with a constant fitted on
it); its reading quotes the fitted curve beside the measured one (:func:`fit`).

The memory figures (2 and 15) keep the roofline's speed: at their loads memory, not the step
time, bounds the batch (fig2.toml), and the alternatives their readings quote were measured so.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pagesim.sim.config import SimConfig, default_cost_model, read_toml
from pagesim.sim.errors import ConfigError

#: the fitted factors, their provenance and the fit's error (benchmarks/fit_engine_era.py)
PATH = Path(__file__).resolve().parent / "data" / "engine_era.toml"
#: the value of ``cost_scale`` in an experiment config that stands for the fitted factor
ENGINE_ERA = "engine-era"


@lru_cache(maxsize=1)
def load() -> dict:
    """The fit's file: ``[scale]`` (a factor per cost model), ``[fit.<cost model>]`` (its error and
    curve), ``[source]``."""
    if not PATH.exists():
        raise ConfigError(f"no engine-era factors ({PATH}); run benchmarks/fit_engine_era.py")
    return read_toml(PATH, "engine-era factors")


def gpu_time_scale(cost_model: str) -> float:
    """The factor on ``cost_model``'s GPU time that the 2023 engines' steps took."""
    scales = load().get("scale", {})
    if cost_model not in scales:
        raise ConfigError(f"no engine-era factor for --cost-model {cost_model} in {PATH.name} "
                          f"(fitted: {', '.join(sorted(scales)) or 'none'}); run benchmarks/fit_engine_era.py")
    return float(scales[cost_model])


def resolve(values: dict) -> dict:
    """A run's settings (``run_spec.spec_from_settings``' flat dict) with ``cost_scale =
    "engine-era"`` replaced by the factor of its cost model."""
    if values.get("cost_scale") != ENGINE_ERA:
        return values
    if values.get("profile"):  # a measured profile prices the step (the table model, whatever it names)
        cost_model = "table"
    else:
        system = SimConfig.for_system(values.get("system", "vllm"))
        cost_model = values.get("cost_model") or default_cost_model(system.scheduler)
    return {**values, "cost_scale": gpu_time_scale(cost_model)}


def fit(cost_model: str) -> dict | None:
    """The fit for ``cost_model``: its factor, ``rms``, the rates (``per_gpu_rate``), our curve at
    the factor (``slo_attainment``), the ``measured`` one, and ``alternatives`` (each CPU cost's
    best value and rms); None where the file has none."""
    data = load()
    found = data.get("fit", {}).get(cost_model)
    if not found:
        return None
    return {**found, "alternatives": data.get("alternatives", {}).get(cost_model, {})}
