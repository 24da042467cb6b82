"""Calibrated roofline: the roofline's physics plus the terms real GPU timings show it lacks.

The roofline (``sim/cost.py``) prices a step from FLOPs, bytes and two datasheet ceilings with
guessed efficiencies. Measured per-operation timings (``sim/measured.py``) show what it misses:
every kernel has a fixed launch-and-tail cost (a per-layer fixed cost that dominates small
batches and tensor-parallel shards), GEMMs near the weight-bound/compute-bound ridge are slower
than either bound (both limits bite at once) and jump where the token count spills into one
more tile of rows, decode attention streams KV at close to peak bandwidth once enough sequences
run in parallel but far below it for a few, and FlashAttention prefill runs at a small fraction of
tensor peak. Per layer, for ``T`` tokens on one GPU of a tensor-parallel group of ``tp``::

    gemm(T, K, N) = gemm_fixed + max(C, M) + overlap * min(C, M)                     (x4: qkv, o, up, down)
        C = 2 * ceil(T / tile) * tile * K * N / (peak_flops * compute_eff)          tensor cores work in tiles
        M = dtype * (K N + T (K + N)) / (mem_bw * memory_eff)                        weights, activations in and out
    elementwise(T) = sum over norm (x2), rope, act, add of  fixed_k + T * bytes_per_token_k / (mem_bw * eff_k)
    allreduce(T) = 2 * (latency[tp] + T * hidden * dtype / bytes_per_s[tp])         fitted on the measured collectives
    decode attention = dec_fixed + dec_per_seq * B + KV_bytes / (mem_bw * min(1, bw_coef * (B * heads/tp) ** bw_exp))
    prefill attention = pre_fixed + 4 * heads/tp * head_dim * sum_i c_i (p_i + causal * c_i) / (peak_flops * pre_eff)

with the GEMM shapes sharded as vLLM shards them (qkv and up by output columns, o and down by
input rows: ``K x N`` = ``h x (q + 2 kv)/tp``, ``q/tp x h``, ``h x (2|1) I/tp``, ``I/tp x h``) and the
elementwise bytes per token read plus written (norm ``2 h``, rope ``2 (q + kv)/tp``, act gated
``3 I/tp`` else ``2 I/tp``, residual add ``3 h``; times ``dtype``). A step adds the layers times
``L``, the LM head as one more GEMM over one row per sequence (vLLM computes logits only for each
sequence's last token), the roofline's CPU overheads (``overhead_s``, ``per_seq_overhead_s``: not
calibrated here, Vidur's CPU tables are not among the measurements), and swap and copy-on-write
traffic over PCIe and HBM. A tensor-parallel degree without a measured collective table takes
the roofline's ring all-reduce.

The constants are fitted per GPU by ``pagesim cost fit`` (``sim/calibration_fit.py``) and stored
with their provenance and measured error in ``sim/data/calibration/<gpu>.toml``. Every formula
above is one module-level function of plain numbers (:func:`gemm_seconds` ...): the fit calls
them on numpy arrays of measured rows, the cost model on scalars, and a compiled core can take
them as they are (``max``/``min`` are written with ``abs``, ``ceil`` with integer division).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.batch import StepBatch
from sim.errors import ConfigError
from sim.specs import GPUSpec, ModelSpec

#: elementwise kernel kinds, in the order of the per-kind constants
ELEMENTWISE = ("norm", "rope", "act", "add")
#: how many kernels of each kind one layer runs (input and post-attention norm)
ELEMENTWISE_PER_LAYER = (2, 1, 1, 1)
DATA_DIR = Path(__file__).resolve().parent / "data" / "calibration"


# -- the formulas, once (scalars or numpy arrays) ----------------------------------------------

def _max_plus_overlap_min(a, b, overlap):
    """``max(a, b) + overlap * min(a, b)`` in arithmetic that takes scalars and arrays alike."""
    return (1.0 + overlap) * 0.5 * (a + b) + (1.0 - overlap) * 0.5 * abs(a - b)


def gemm_seconds(tokens, k, n, dtype_bytes, peak_flops, mem_bw, fixed_s, compute_eff, memory_eff, overlap,
                 tile_tokens):
    """One ``tokens x k`` by ``k x n`` GEMM (``tokens`` an int or an int array)."""
    padded = -(-tokens // tile_tokens) * tile_tokens
    compute = 2.0 * padded * k * n / (peak_flops * compute_eff)
    memory = dtype_bytes * (k * n + tokens * (k + n)) / (mem_bw * memory_eff)
    return fixed_s + _max_plus_overlap_min(compute, memory, overlap)


def elementwise_seconds(tokens, bytes_per_token, mem_bw, fixed_s, memory_eff):
    """One elementwise kernel streaming ``bytes_per_token`` per token."""
    return fixed_s + tokens * bytes_per_token / (mem_bw * memory_eff)


def allreduce_seconds(tokens, bytes_per_token, latency_s, bytes_per_s):
    """One all-reduce of ``tokens`` activations of ``bytes_per_token`` each."""
    return latency_s + tokens * bytes_per_token / bytes_per_s


def decode_bandwidth(streams, mem_bw, bw_coef, bw_exponent):
    """HBM bandwidth the decode attention reaches with ``streams`` (sequence, head) pairs in flight."""
    frac = bw_coef * streams ** bw_exponent
    return mem_bw * 0.5 * (1.0 + frac - abs(1.0 - frac))  # min(1, frac)


def decode_attention_seconds(seqs, kv_bytes, bandwidth, fixed_s, per_seq_s):
    """One layer's decode attention over ``kv_bytes`` of cached K and V for ``seqs`` sequences."""
    return fixed_s + per_seq_s * seqs + kv_bytes / bandwidth


def prefill_attention_seconds(flops, peak_flops, fixed_s, compute_eff):
    """One layer's prefill attention of ``flops`` (see :func:`prefill_attention_flops`)."""
    return fixed_s + flops / (peak_flops * compute_eff)


def prefill_attention_flops(heads, head_dim, new_tokens, cached_tokens, causal_fraction):
    """QK^T and PV of ``new_tokens`` queries over ``cached_tokens`` earlier keys and their own
    (``causal_fraction`` of the square: 0.5 for a kernel that skips masked tiles, 1 for one that does not)."""
    return 4.0 * heads * head_dim * new_tokens * (cached_tokens + causal_fraction * new_tokens)


def layer_gemm_shapes(model: ModelSpec, tp: int) -> tuple[tuple[float, float], ...]:
    """``(K, N)`` of the layer's four GEMMs on one GPU of the TP group: qkv, o, up(+gate), down."""
    h, q, kv = model.hidden_size, model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    up = (2 if model.gated_mlp else 1) * model.intermediate_size
    return ((h, (q + 2 * kv) / tp), (q / tp, h), (h, up / tp), (model.intermediate_size / tp, h))


def elementwise_bytes_per_token(model: ModelSpec, tp: int) -> tuple[float, ...]:
    """Bytes each elementwise kernel reads and writes per token, in :data:`ELEMENTWISE` order."""
    h, q, kv = model.hidden_size, model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    act = (3 if model.gated_mlp else 2) * model.intermediate_size / tp
    d = model.dtype_bytes
    return (2 * h * d, 2 * (q + kv) / tp * d, act * d, 3 * h * d)


# -- the constants of one GPU ---------------------------------------------------------------------

@dataclass(frozen=True)
class Calibration:
    """Fitted constants of one GPU (seconds, fractions of the datasheet peaks), their provenance
    and the measured error of the model they make (see the module docstring for the formulas)."""

    gpu: str
    gemm_fixed_s: float
    gemm_compute_eff: float
    gemm_memory_eff: float
    gemm_overlap: float
    gemm_tile_tokens: int
    elementwise_fixed_s: tuple[float, ...]
    elementwise_memory_eff: tuple[float, ...]
    decode_fixed_s: float
    decode_per_seq_s: float
    decode_bw_coef: float
    decode_bw_exponent: float
    prefill_fixed_s: float
    prefill_compute_eff: float
    prefill_causal_fraction: float
    allreduce_tp: tuple[int, ...] = ()
    allreduce_latency_s: tuple[float, ...] = ()
    allreduce_bytes_per_s: tuple[float, ...] = ()
    provenance: dict = field(default_factory=dict, compare=False)
    error: dict = field(default_factory=dict, compare=False)

    def to_toml(self) -> str:
        d = asdict(self)
        head = [f"# Calibrated roofline constants for {self.gpu} (read by sim/cost_calibrated.py).",
                "# Written by `pagesim cost fit`; rerun the command in [provenance] instead of editing.",
                "# Seconds; efficiencies are fractions of the GPU preset's datasheet peaks (sim/specs.py).",
                "# elementwise_* lists follow the kinds " + ", ".join(ELEMENTWISE) + "."]
        consts = {k: v for k, v in d.items() if k not in ("provenance", "error")}
        return "\n".join(head) + "\n\n" + _toml({"constants": consts, "provenance": d["provenance"],
                                                  "error": d["error"]})

    @classmethod
    def from_toml(cls, path: str | Path) -> "Calibration":
        import tomllib
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: calibration file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML ({e})") from None
        consts = dict(data.get("constants", {}))
        names = [f.name for f in cls.__dataclass_fields__.values() if f.name not in ("provenance", "error")]
        missing = [n for n in names if n not in consts]
        if missing:
            raise ConfigError(f"{path}: [constants] has no '{missing[0]}'")
        unknown = [k for k in consts if k not in names]
        if unknown:
            raise ConfigError(f"{path}: [constants] has an unknown key '{unknown[0]}'")
        for k in names:
            v = consts[k]
            vals = v if isinstance(v, list) else [v]
            if k != "gpu" and not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                      and (x > 0 or k == "gemm_overlap" and x >= 0) for x in vals):
                raise ConfigError(f"{path}: [constants] field '{k}' must hold finite numbers > 0, got {v!r}")
            if isinstance(v, list):
                consts[k] = tuple(v)
        for k in ("elementwise_fixed_s", "elementwise_memory_eff"):
            if len(consts[k]) != len(ELEMENTWISE):
                raise ConfigError(f"{path}: [constants] field '{k}' needs {len(ELEMENTWISE)} values "
                                  f"({', '.join(ELEMENTWISE)})")
        if not len(consts["allreduce_tp"]) == len(consts["allreduce_latency_s"]) == len(consts["allreduce_bytes_per_s"]):
            raise ConfigError(f"{path}: [constants] allreduce_tp, allreduce_latency_s, allreduce_bytes_per_s "
                              "must have the same length")
        return cls(**consts, provenance=data.get("provenance", {}), error=data.get("error", {}))


def _toml(d: dict, prefix: str = "") -> str:
    """``d`` as TOML: scalars and lists first, then each sub-table under its dotted header."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, np.integer)):
            return str(int(v))
        if isinstance(v, (float, np.floating)):
            v = float(v)
            return "nan" if math.isnan(v) else ("inf" if v == math.inf else repr(v))
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(str(v))
    lines = [f"{k} = {value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    out = ("[" + prefix + "]\n" if prefix else "") + "".join(line + "\n" for line in lines)
    for k, v in d.items():
        if isinstance(v, dict):
            out += "\n" + _toml(v, f"{prefix}.{k}" if prefix else k)
    return out


def calibration_path(gpu: str) -> Path:
    return DATA_DIR / f"{gpu}.toml"


def calibrated_gpus() -> list[str]:
    return sorted(p.stem for p in DATA_DIR.glob("*.toml"))


@lru_cache(maxsize=None)
def load_calibration(gpu: str) -> Calibration:
    """The shipped constants of GPU preset ``gpu`` (ConfigError naming the calibrated GPUs)."""
    path = calibration_path(gpu)
    if not path.exists():
        raise ConfigError(f"no calibration for GPU '{gpu}' (calibrated: {', '.join(calibrated_gpus()) or 'none'}); "
                          "use --cost-model roofline, or fit one: pagesim cost fit --measured DIR --gpu GPU --out FILE")
    return Calibration.from_toml(path)


# -- the cost model ---------------------------------------------------------------------------------

class CalibratedCostModel:
    """Prices a step with a :class:`Calibration` (the shipped one of ``gpu`` unless given)."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tensor_parallel: int = 1,
                 calibration: Calibration | None = None):
        from sim.cost import RooflineCostModel

        c = calibration if calibration is not None else load_calibration(gpu.name)
        self.model, self.gpu, self.tensor_parallel, self.calibration = model, gpu, tensor_parallel, c
        tp, d = tensor_parallel, model.dtype_bytes
        self.overhead_s = RooflineCostModel.overhead_s  # CPU side: the roofline's, not calibrated here
        self.per_seq_overhead_s = RooflineCostModel.per_seq_overhead_s
        self._layers = model.num_layers
        self._gemm = (d, gpu.peak_flops, gpu.mem_bw, c.gemm_fixed_s, c.gemm_compute_eff, c.gemm_memory_eff,
                      c.gemm_overlap, c.gemm_tile_tokens)
        self._shapes = layer_gemm_shapes(model, tp)
        self._lm_head = (model.hidden_size, model.vocab_size / tp) if model.vocab_size else None
        ew_bytes = elementwise_bytes_per_token(model, tp)
        self._ew_fixed = sum(n * f for n, f in zip(ELEMENTWISE_PER_LAYER, c.elementwise_fixed_s))
        self._ew_per_token = sum(n * elementwise_seconds(1, b, gpu.mem_bw, 0.0, e)
                                 for n, b, e in zip(ELEMENTWISE_PER_LAYER, ew_bytes, c.elementwise_memory_eff))
        if tp > 1 and tp in c.allreduce_tp:
            i = c.allreduce_tp.index(tp)
            lat, bw = c.allreduce_latency_s[i], c.allreduce_bytes_per_s[i]
            self._ar_fixed = 2 * self._layers * allreduce_seconds(0, 0, lat, bw)
            self._ar_per_token = 2 * self._layers * allreduce_seconds(1, model.hidden_size * d, 0.0, bw)
        else:  # tp 1, or a degree without measured collectives: the roofline's ring all-reduce
            roof = RooflineCostModel(model, gpu, tp)
            self._ar_fixed, self._ar_per_token = roof._ar_fixed, roof._ar_time_per_token
        self._kv_bytes_per_token = model.kv_bytes_per_token(tp)
        self._kv_layer = self._kv_bytes_per_token / model.num_layers
        self._streams_per_seq = model.num_heads / tp
        self._dec = (c.decode_fixed_s, c.decode_per_seq_s)
        self._pre = (model.num_heads / tp, model.head_dim, c.prefill_causal_fraction, gpu.peak_flops,
                     c.prefill_fixed_s, c.prefill_compute_eff)
        self._copy_bw = gpu.mem_bw * c.elementwise_memory_eff[ELEMENTWISE.index("add")]

    def tokens_time(self, tokens: int, seqs: int) -> float:
        """Every layer's GEMMs, elementwise kernels and all-reduces for ``tokens`` tokens, and the LM
        head for ``seqs`` sequences."""
        layer = self._ew_fixed + tokens * self._ew_per_token
        for k, n in self._shapes:
            layer += gemm_seconds(tokens, k, n, *self._gemm)
        t = self._layers * layer + self._ar_fixed + self._ar_per_token * tokens
        if self._lm_head is not None:
            t += gemm_seconds(seqs, *self._lm_head, *self._gemm)
        return t

    def _decode_base(self, seqs: int) -> tuple[float, float]:
        """(fixed part, bandwidth) of one layer's decode attention over ``seqs`` sequences."""
        bw = decode_bandwidth(seqs * self._streams_per_seq, self.gpu.mem_bw, self.calibration.decode_bw_coef,
                              self.calibration.decode_bw_exponent)
        return decode_attention_seconds(seqs, 0.0, bw, *self._dec), bw

    def decode_attention_time(self, seqs: int, context_sum: int) -> float:
        base, bw = self._decode_base(seqs)
        return self._layers * (base + context_sum * self._kv_layer / bw)

    def prefill_attention_time(self, new_tokens: np.ndarray, context_after: np.ndarray) -> float:
        heads, head_dim, causal, peak, fixed, eff = self._pre
        flops = 0.0
        for n, c in zip(new_tokens.tolist(), context_after.tolist()):
            flops += prefill_attention_flops(heads, head_dim, n, c - n, causal)
        return self._layers * prefill_attention_seconds(flops, peak, fixed, eff)

    def step_time(self, batch: StepBatch) -> float:
        tokens = batch.num_prefill_tokens + batch.num_decode_tokens
        t = self.overhead_s + self.per_seq_overhead_s * batch.num_seqs
        if tokens:
            t += self.tokens_time(tokens, batch.num_seqs)
        if batch.decode_context_sum:
            t += self.decode_attention_time(batch.num_decode_tokens, batch.decode_context_sum)
        if len(batch.prefill_tokens):
            t += self.prefill_attention_time(batch.prefill_tokens, batch.prefill_context)
        swapped = batch.swap_in_tokens + batch.swap_out_tokens
        if swapped:  # host <-> device over PCIe, as the roofline prices it
            t += swapped * self._kv_bytes_per_token / self.gpu.pcie_bw
        if batch.copy_tokens:  # copy-on-write: read + write, at the residual add's streaming rate
            t += 2 * batch.copy_tokens * self._kv_bytes_per_token / self._copy_bw
        return t

    def decode_step_time(self, num_seqs: int, context_sum: int) -> float:
        """``step_time`` of one pure decode step, the same operations in the same order."""
        t = self.overhead_s + self.per_seq_overhead_s * num_seqs
        if num_seqs:
            t += self.tokens_time(num_seqs, num_seqs)
        if context_sum:
            t += self.decode_attention_time(num_seqs, context_sum)
        return t

    def decode_step_times(self, num_seqs: int, context_sums: np.ndarray) -> np.ndarray:
        """``step_time`` of pure decode steps of ``num_seqs`` sequences, one per context sum,
        vectorized with the scalar path's operations in its order (equal bit for bit)."""
        t = self.overhead_s + self.per_seq_overhead_s * num_seqs
        if num_seqs:
            t += self.tokens_time(num_seqs, num_seqs)
        ctx = np.asarray(context_sums, dtype=np.int64)
        base, bw = self._decode_base(num_seqs)
        att = self._layers * (base + ctx * self._kv_layer / bw)
        return np.where(ctx != 0, t + att, t)


# -- the error that travels with an answer ------------------------------------------------------------

def error_band(cost_model: str, gpu: str, profile: str | None = None) -> dict:
    """Which cost model ran and its measured error on ``gpu``, as ``summary.json`` and ``plan``
    report it: ``{"cost_model": ..., "cost_error": {"median", "p90", "max", "cells", "method",
    "source"}}``, or ``"cost_error": "uncalibrated: ..."`` where ``gpu`` has no measurements."""
    if profile:
        return {"cost_model": "table", "cost_error": f"not scored: a measured profile ({profile})"}
    path = calibration_path(gpu)
    if not path.exists():
        return {"cost_model": cost_model, "cost_error": f"uncalibrated: no measured timings for {gpu}"}
    err = load_calibration(gpu).error.get(cost_model, {})
    band = dict(err.get("all", {}))
    if not band:
        return {"cost_model": cost_model, "cost_error": f"uncalibrated: {path.name} has no [error.{cost_model}]"}
    band["method"] = err.get("method", "")
    band["source"] = f"sim/data/calibration/{path.name}"
    return {"cost_model": cost_model, "cost_error": band}


def describe_band(band: dict, gpu: str) -> str:
    """One line for a printed summary: ``calibrated (a100-80gb: median 2.3 %, p90 7.8 % ...)``."""
    err = band["cost_error"]
    if isinstance(err, str):
        return f"{band['cost_model']} ({err})"
    return (f"{band['cost_model']} (GPU time per iteration vs measured on {gpu}: median {100 * err['median']:.1f} %, "
            f"p90 {100 * err['p90']:.1f} %, {err['method']})")
