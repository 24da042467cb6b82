"""The step time of today's serving engines, fitted on real serving runs (``--cost-model serving``).

The physics is the roofline's (``sim/cost/roofline.py``, one statement in ``sim.core.cost``): a step
reads the weights once and the batch's cached K/V once, computes 2 x parameters FLOPs per
token, prefill attention's causal pairs, and two all-reduces per layer at TP > 1. What the
roofline guesses, this model fits on what real engines did end to end, per GPU:

- ``bandwidth_eff`` and ``compute_eff``: the fractions of the datasheet's HBM bandwidth that a
  step's weight and K/V reads reach, and of its dense 16-bit FLOP/s that its GEMMs reach (prefill
  attention is priced at ``compute_eff`` too), this one at most what the fastest compute-bound
  GEMM measured on the GPU reached (``sim/data/serving/achieved.toml``'s ``[fitted]``: 0.881 of
  the H100's; the fitting runs' steps, at most 2,048 tokens, cannot tell it from the others and a
  free fit takes the datasheet's peak). One bandwidth for the weights' GEMMs and the K/V's
  attention kernels: with a second for the K/V, only Llama-2-7B (MHA: 512 KiB of K/V per token,
  4x the others') could fit it, and the held-out error grew (E2E 13.0 % against 9.4 %, TPOT
  12.3 % against 8.8 %, median over the 16 runs, both fits with efficiencies up to 1.2:
  ``benchmarks/results/fit_serving_time_variant_kv_2026-11-24.txt`` and ``..._bound12_...``);
- ``layer_s`` and ``per_seq_s``: what a step costs beyond them, per layer (the gaps between a
  layer's kernels and their minimum durations, inside the CUDA graph: a step of L layers pays
  L x ``layer_s``) and per sequence (sampling, and the scheduler's CPU time the engine does not
  overlap with the GPU);
- ``allreduce_s``: one all-reduce's latency at TP > 1 (two per layer), beside its bytes over the
  GPU's interconnect;
- ``moe_eff``: a mixture of experts' fused-MoE grouped GEMMs, which pad each expert's tokens to
  the kernel's block of rows (``sim.core.cost.routed_expert_seconds``), at this fraction of the
  dense GEMMs' FLOP/s. Not fitted: 1. The fitting runs hold one mixture of experts, so a fit
  held out by model cannot set it, and a fit on that model trades it against the TTFT every model
  under-predicts (docs/accuracy.md, the Mixtral note);
- ``gemm_overlap``: near its ridge a GEMM pays part of its lesser bound on top of the greater
  (``sim.core.cost.bound_seconds``): measured, not fitted, the calibrated model's fit on the GPU's
  per-operation timings (``sim/data/calibration/<gpu>.toml``: 0.45 on the H100);
- ``frontend_s``: what a request spends outside the engine loop (the HTTP server, tokenizing the
  prompt, detokenizing and streaming the tokens): added to its TTFT and E2E as its client sees
  them (``sim.metrics.request_latencies``), not to any step.

Today's engines capture decode steps in CUDA graphs and overlap the scheduler with the GPU; the
engine's other half of that, async scheduling (a request arriving during step N is first
scheduled in step N+2), is the scheduler's: ``sim/core/sched/scheduler_v1.py``.

The constants live in ``sim/data/serving/<gpu>.toml``, written by
``benchmarks/fit_serving_time.py`` with their provenance and the model's error on each real run
leave-one-model-out (each model's runs priced by constants fitted without them). A GPU without
a file takes the fractions of a fitted GPU (:data:`FITTED_ON`) and says so: scaled by what the
two GPUs achieved on the same measured operations where both were measured (:func:`on_gpu`,
``sim/cost/achieved.py``), else as they are.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

from pagesim.sim.config import read_toml
from pagesim.sim.cost.achieved import ACHIEVED_PATH, RATIOS, achieved_for
from pagesim.sim.cost.regime import regime_band
from pagesim.sim.cost.roofline import RooflineCostModel
from pagesim.sim.errors import ConfigError
from pagesim.sim.specs import GPUSpec, ModelSpec

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "serving"  # sim/data/serving/
#: the GPU whose fitted fractions a GPU without its own file takes (the only one with real runs)
FITTED_ON = "h100-80gb"


@dataclass(frozen=True)
class ServingConstants:
    """One GPU's fitted constants (fractions of its datasheet peaks; seconds)."""

    bandwidth_eff: float
    compute_eff: float
    layer_s: float
    per_seq_s: float
    allreduce_s: float
    frontend_s: float
    #: the fused-MoE grouped GEMM's FLOP/s as a fraction of the dense GEMMs' (``compute_eff``):
    #: 1, not fitted (the module docstring); a constants file may give it
    moe_eff: float = 1.0
    #: the fraction of the datasheet interconnect an all-reduce's bytes reach: 1 on the fitted GPU
    #: (what it lacks is in ``allreduce_s``), another GPU's measured ratio to it (:func:`on_gpu`)
    link_eff: float = 1.0
    #: a GEMM's lesser bound's share added to its greater near the ridge (``sim.core.cost.bound_seconds``):
    #: measured, not fitted (the calibration file's ``gemm_overlap``); 0: the roofline's plain max
    gemm_overlap: float = 0.0

    @classmethod
    def from_dict(cls, d: dict, source: str) -> "ServingConstants":
        missing = [f.name for f in fields(cls) if f.name not in d and f.default is MISSING]
        if missing:
            raise ConfigError(f"{source}: [constants] lacks {', '.join(missing)}")
        return cls(**{f.name: float(d[f.name]) for f in fields(cls) if f.name in d})


def serving_path(gpu: str) -> Path:
    return DATA_DIR / f"{gpu}.toml"


@lru_cache(maxsize=None)
def load_serving(gpu: str) -> tuple[ServingConstants, str, dict]:
    """``gpu``'s constants, the GPU they were fitted on, and the file's ``[error]`` table; a GPU
    without a file gets :data:`FITTED_ON`'s, as :func:`on_gpu` carries them over."""
    source = gpu if serving_path(gpu).exists() else FITTED_ON
    path = serving_path(source)
    if not path.exists():
        raise ConfigError(f"no fitted serving constants ({path}); run benchmarks/fit_serving_time.py")
    data = read_toml(path, "serving constants")
    constants = ServingConstants.from_dict(data.get("constants", {}), str(path))
    return on_gpu(constants, gpu, source), source, data.get("error", {})


def on_gpu(constants: ServingConstants, gpu: str, fitted_on: str) -> ServingConstants:
    """``constants``, fitted on ``fitted_on``, as ``gpu`` reaches them. Where both GPUs' operations
    were measured (``sim/cost/achieved.py``), each fraction of a datasheet peak is scaled by the
    ratio of what the two achieved on the same operations: ``bandwidth_eff`` by the memory-bound
    GEMMs', ``compute_eff`` (the GEMMs and prefill attention) by the compute-bound ones', at most
    the datasheet's; ``allreduce_s`` by the all-reduce's latency ratio and ``link_eff`` by its
    achieved link. The rest is the engine's (per layer, per sequence, front end) and stays. A GPU
    not measured keeps the fitted fractions, which its band says (:func:`measured_note`)."""
    ratios = achieved_for(gpu, fitted_on) if gpu != fitted_on else None
    if ratios is None:
        return constants
    return replace(constants, bandwidth_eff=min(1.0, constants.bandwidth_eff * ratios["bandwidth"]),
                   compute_eff=min(1.0, constants.compute_eff * ratios["flops"]),
                   allreduce_s=constants.allreduce_s * ratios["allreduce_latency"],
                   link_eff=min(1.0, constants.link_eff * ratios["link"]))


def measured_note(gpu: str, fitted_on: str) -> str:
    """How ``gpu`` takes ``fitted_on``'s constants, in words (empty on the fitted GPU itself)."""
    if gpu == fitted_on:
        return ""
    ratios = achieved_for(gpu, fitted_on)
    if ratios is None:
        return f"{gpu}: no measured operations; {fitted_on}'s fractions of its own datasheet"
    unmeasured = [name.replace("_", " ") for name in RATIOS if not ratios.get(f"{name}_pairs")]
    return (f"{gpu}: {fitted_on}'s fractions scaled by its operations measured against {fitted_on}'s "
            f"(sim/data/serving/{ACHIEVED_PATH.name})"
            + (f"; its {' and '.join(unmeasured)} not measured: {fitted_on}'s" if unmeasured else ""))


def serving_band(gpu: str, moe: bool | None = None, scheduler: str | None = None,
                 max_num_seqs: int | None = None, same_chip: bool = False, engine: str | None = None,
                 expert_parallel: bool = False) -> dict | str:
    """The serving model's error against real runs, as ``sim.cost.calibration.error_band`` hands it
    on: the mean E2E's median and p90 of |sim / real - 1| and its signed 10th and 90th percentiles
    (``low``, ``high``), with TTFT's and TPOT's beside them, over the real runs of the answer's
    regime (``sim.cost.regime.regime_band``: a mixture of experts or not (``moe``), ``gpu``
    fitted or not, ``scheduler`` (following ``engine``), batches up to ``max_num_seqs``, expert
    parallel or not); where it was measured."""
    try:
        _, fitted_on, err = load_serving(gpu)
    except ConfigError as e:
        return f"unfitted: {e}"
    band = regime_band(gpu, fitted_on, same_chip, moe, scheduler, max_num_seqs, engine,
                       expert_parallel=expert_parallel)
    note = "" if same_chip else measured_note(gpu, fitted_on)
    if band is not None and note:
        band["regime"] = [*band["regime"], note]
    if band is None:
        if "median_e2e_mean" not in err:
            return f"unscored: {serving_path(fitted_on).name} has no [error]"
        band = {"median": err["median_e2e_mean"], "p90": err["p90_e2e_mean"],
                "ttft_median": err["median_ttft_mean"], "tpot_median": err["median_tpot_mean"],
                "runs": err.get("runs", 0), "what": f"mean E2E vs {err.get('runs', 0)} real vLLM runs on {fitted_on}"}
    return {**band, "method": err.get("method", ""), "source": f"sim/data/serving/{fitted_on}.toml",
            "measured_on": fitted_on}


class ServingCostModel(RooflineCostModel):
    """The roofline with constants fitted on real serving runs (module docstring). ``constants``
    overrides the GPU's file (the fit prices candidates through it)."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tensor_parallel: int = 1,
                 constants: ServingConstants | None = None, swap_block_tokens: int = 0, kernel_block_tokens: int = 0,
                 expert_group: int = 1, data_parallel: int = 1):
        fitted_on, given = FITTED_ON, constants is not None
        if constants is None:
            constants, fitted_on, _ = load_serving(gpu.name)
        self.serving = constants
        self.fitted_on = fitted_on
        if constants.link_eff != 1.0:  # the GPU's all-reduce bytes at its measured share of the link
            gpu = replace(gpu, interconnect_bw=gpu.interconnect_bw * constants.link_eff)
        super().__init__(model, gpu, tensor_parallel, eff_flops=constants.compute_eff,
                         eff_bw=constants.bandwidth_eff, eff_attn=constants.compute_eff,
                         overhead_s=model.num_layers * constants.layer_s, per_seq_overhead_s=constants.per_seq_s,
                         allreduce_latency_s=constants.allreduce_s, swap_block_tokens=swap_block_tokens,
                         kernel_block_tokens=kernel_block_tokens, eff_moe=constants.moe_eff,
                         expert_group=expert_group, data_parallel=data_parallel,
                         gemm_overlap=constants.gemm_overlap)
        self.frontend_s = constants.frontend_s
        note = "" if given else measured_note(self.gpu.name, fitted_on)  # given constants: the caller's as they are
        self.cpu_overhead_source = f"fitted on real serving runs on {fitted_on}" + (f"; {note}" if note else "")
