"""Measured GPU timings (Vidur's published profiling tables) read into tidy tables, and the
iterations they measure.

Layout of a measured folder ``DIR`` (the layout of ``../shared/measured``; the tests write a
small one)::

    DIR/vidur-profiling/compute/<gpu>/<org>/<model>/mlp.csv      per-layer operations, ms
    DIR/vidur-profiling/network/<cluster>/all_reduce.csv         collectives by size, ms
    DIR/vidur-attention-subset/<gpu>_<model>_attention_rows.csv  attention kernel rows, ms
    DIR/README.md                                                 (optional) names the source commit

``mlp.csv``: one row per (``num_tokens``, ``num_tensor_parallel_workers``) with
``time_stats.<op>.median`` for the operations of one transformer layer on one GPU of the TP group
(:data:`LAYER_OPS`; a model without an operation, such as phi-2's post-attention layernorm, has
no column for it) and the model's shape (``n_head, n_kv_head, n_embd, n_expanded_embd,
vocab_size, use_gated_mlp``). Repeated keys are reduced to their median.
``all_reduce.csv``: ``time_stats.all_reduce.median`` by ``size`` (bytes), ``num_workers`` and
``devices_per_node``; the rows with ``num_workers == devices_per_node`` (one node, as Vidur's
predictor selects them) give the all-reduce of each TP degree, read through a running median
over :data:`ALLREDUCE_WINDOW` neighbouring sizes (single sizes jitter by up to 2x).
Attention rows: ``kind,kv,n,median_ms`` with ``kind`` ``decode`` (``n`` sequences, ``kv`` cached
tokens each) or ``prefill`` (a chunk of ``n`` tokens after ``kv`` cached ones); ``*_dup`` kinds
(repeated measurements of the same cells) are left out, the first measurement kept.

What one iteration costs on the GPU (Vidur's sum, ``vidur/entities/execution_time.py`` lines
59-85 and 181-190 at commit 7d47513: per layer the operations above, plus attention, plus two
tensor-parallel all-reduces of the layer's activations, ``size = num_tokens * n_embd * 2`` bytes
as ``vidur/execution_time_predictor/sklearn_execution_time_predictor.py`` lines 220-229 and
811-817 size and add them; the embedding and the LM head are left out), as **cells**:

    layers   every (num_tokens T, tp): the layer's operations at T tokens + 2 all-reduces
             (attention left out: it is measured only for A100 Llama-2-7B)
    decode   (batch B, context kv) where attention is measured: operations at T = B + decode attention
    prefill  (chunk n, cached kv): operations at T = n + prefill attention

One layer stands for the whole iteration: every term of both the measurement and the cost
models' prediction is per layer (the LM head is left out of both), so predicted/measured is the
same for L layers. A cell exists only where every part of it is measured (decode batches at the
token counts the operation table has); the all-reduce of a cell is the measured table's
median at that size, linearly interpolated between the measured sizes (cells whose
all-reduce is larger than the largest measured size are left out). A GPU without a collective
table has no tp > 1 cells.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pagesim.sim.core.price.cost_table import interp_extrap
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.errors import ConfigError
from pagesim.sim.specs import ModelSpec

#: one layer's operations in ``mlp.csv`` (Vidur's ``_train_compute_models`` list; ``emb`` is left out
#: as Vidur's iteration sum leaves it out)
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")
KEY_COLUMNS = ("num_tokens", "num_tensor_parallel_workers")

#: Vidur's GPU folder -> pagesim GPU preset (Vidur's A100 is the 80 GB part)
GPU_FOLDERS = {"a100": "a100-80gb", "h100": "h100-80gb", "a40": "a40"}
#: sizes in the running median the all-reduce table is read through (see read_allreduce)
ALLREDUCE_WINDOW = 9
PHASES = ("decode", "prefill", "layers")


def model_key(folder_name: str) -> str:
    """The pagesim name of a Vidur model folder: ``Llama-2-7b-hf`` -> ``llama-2-7b``,
    ``Meta-Llama-3-70B`` -> ``llama-3-70b``, ``Qwen-72B`` -> ``qwen-72b``."""
    name = folder_name.lower()
    name = re.sub(r"-hf$", "", name)
    return re.sub(r"^meta-", "", name)


def _cell(df: pd.DataFrame, col: str, row: int):
    """Row ``row`` (1-based) of ``col`` as a message shows it: -1, not np.int64(-1)."""
    v = df[col].iloc[row - 1]
    return v.item() if isinstance(v, np.generic) else v


def _read_csv(path: Path, need: tuple[str, ...]) -> pd.DataFrame:
    try:
        df = pd.read_csv(path)
    except pd.errors.ParserError as e:
        raise ConfigError(f"{path}: not a readable CSV ({e})") from None
    except pd.errors.EmptyDataError:
        raise ConfigError(f"{path}: empty file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ConfigError(f"{path}: missing column '{missing[0]}'")
    for c in need:
        bad = pd.to_numeric(df[c], errors="coerce").isna() if c not in ("use_gated_mlp", "kind") else None
        if bad is not None and bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0]) + 1
            raise ConfigError(f"{path}: row {row}, field '{c}': "
                              + ("is missing" if pd.isna(_cell(df, c, row)) else f"not a number: {_cell(df, c, row)!r}"))
    return df


def _positive(df: pd.DataFrame, col: str, path: Path) -> None:
    v = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
    bad = ~(np.isfinite(v) & (v > 0))
    if bad.any():
        row = int(np.flatnonzero(bad)[0]) + 1
        raise ConfigError(f"{path}: row {row}, field '{col}': must be a number > 0, got {_cell(df, col, row)!r}")


@dataclass
class MeasuredModel:
    """One model's operation table on one GPU: ``ops`` has ``num_tokens, tp`` and one column (ms)
    per operation of :data:`LAYER_OPS` it measures; ``spec`` is one layer of the model, no LM head."""

    name: str
    path: Path
    spec: ModelSpec
    ops: pd.DataFrame

    def layer_ms(self) -> pd.Series:
        """The layer's operations summed, per row (ms)."""
        return self.ops[[c for c in LAYER_OPS if c in self.ops]].sum(axis=1)


@dataclass
class MeasuredGPU:
    """Everything measured on one GPU: operation tables per model, the all-reduce table (``tp``,
    ``size``, ``ms``; empty when none), the attention rows per model (``kind, kv, n, ms``)."""

    folder: str
    gpu: str
    models: dict[str, MeasuredModel]
    allreduce: pd.DataFrame
    attention: dict[str, pd.DataFrame] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)

    def allreduce_ms(self, tp: int, size_bytes: np.ndarray) -> np.ndarray:
        """The measured all-reduce at ``tp`` for each size: median per size, interpolated linearly."""
        t = self.allreduce[self.allreduce["tp"] == tp]
        return np.interp(np.asarray(size_bytes, float), t["size"].to_numpy(float), t["ms"].to_numpy(float))

    def allreduce_tps(self) -> list[int]:
        return sorted(int(x) for x in self.allreduce["tp"].unique())


def _one_layer_spec(name: str, shape: dict, path: Path) -> ModelSpec:
    heads, hidden = int(shape["n_head"]), int(shape["n_embd"])
    if hidden % heads:
        raise ConfigError(f"{path}: n_embd={hidden} is not a multiple of n_head={heads}")
    gated = str(shape["use_gated_mlp"]).strip().lower() in ("true", "1")
    return ModelSpec(name, 1, hidden, heads, int(shape["n_kv_head"]), hidden // heads,
                     int(shape["n_expanded_embd"]), 0, 1 << 20, gated_mlp=gated)


def read_ops(path: Path, name: str) -> MeasuredModel:
    """One ``mlp.csv`` as a :class:`MeasuredModel` (ConfigError naming the file, row and field)."""
    df = _read_csv(path, KEY_COLUMNS + SHAPE_COLUMNS)
    cols = {op: f"time_stats.{op}.median" for op in LAYER_OPS if f"time_stats.{op}.median" in df.columns}
    if "attn_pre_proj" not in cols:
        raise ConfigError(f"{path}: missing column 'time_stats.attn_pre_proj.median'")
    for c in cols.values():
        _positive(df, c, path)
    for c in KEY_COLUMNS:
        _positive(df, c, path)
    shapes = df[list(SHAPE_COLUMNS)].astype(str).drop_duplicates()
    if len(shapes) != 1:
        raise ConfigError(f"{path}: rows of more than one model shape ({len(shapes)} different)")
    ops = (df.rename(columns={v: k for k, v in cols.items()})
             .rename(columns={"num_tensor_parallel_workers": "tp"})
             .groupby(["num_tokens", "tp"], as_index=False)[list(cols)].median())
    ops[["num_tokens", "tp"]] = ops[["num_tokens", "tp"]].astype(np.int64)
    return MeasuredModel(name, path, _one_layer_spec(name, shapes.iloc[0].to_dict(), path), ops)


def read_allreduce(path: Path) -> pd.DataFrame:
    """``all_reduce.csv`` as ``tp, size, ms`` (one node: ``num_workers == devices_per_node``)."""
    need = ("num_workers", "devices_per_node", "size", "time_stats.all_reduce.median")
    df = _read_csv(path, need)
    _positive(df, "time_stats.all_reduce.median", path)
    _positive(df, "size", path)
    one = df[df["num_workers"] == df["devices_per_node"]]
    out = (one.rename(columns={"num_workers": "tp", "time_stats.all_reduce.median": "ms"})
              .groupby(["tp", "size"], as_index=False)["ms"].median())
    # each size is a median of a few repetitions; neighbouring sizes (8 KiB apart at the small end)
    # jitter by up to 2x, so the table is read through a running median of ALLREDUCE_WINDOW sizes
    out["ms"] = out.groupby("tp")["ms"].transform(lambda s: running_median(s.to_numpy(float), ALLREDUCE_WINDOW))
    return out.astype({"tp": np.int64, "size": np.int64})


def running_median(values: np.ndarray, window: int) -> np.ndarray:
    """The median of each value's centred window of ``window`` values, narrowed symmetrically at
    the ends (so a straight line stays itself)."""
    half, n = window // 2, len(values)
    out = np.empty(n)
    for i in range(n):
        r = min(half, i, n - 1 - i)
        out[i] = np.median(values[i - r:i + r + 1])
    return out


def read_attention(path: Path) -> pd.DataFrame:
    """An attention-rows file as ``kind, kv, n, ms`` (decode and prefill rows only)."""
    df = _read_csv(path, ("kind", "kv", "n", "median_ms"))
    _positive(df, "median_ms", path)
    _positive(df, "n", path)
    kv = pd.to_numeric(df["kv"])
    if (kv < 0).any():
        row = int(np.flatnonzero((kv < 0).to_numpy())[0]) + 1
        raise ConfigError(f"{path}: row {row}, field 'kv': must be >= 0, got {_cell(df, 'kv', row)!r}")
    df = df[df["kind"].isin(("decode", "prefill"))].rename(columns={"median_ms": "ms"})
    df = df.drop_duplicates(["kind", "kv", "n"], keep="first")
    return df[["kind", "kv", "n", "ms"]].astype({"kv": np.int64, "n": np.int64}).reset_index(drop=True)


def _gpu_folder(root: Path, gpu: str) -> str:
    folders = {v: k for k, v in GPU_FOLDERS.items()}
    compute = root / "vidur-profiling" / "compute"
    have = sorted(p.name for p in compute.iterdir() if p.is_dir()) if compute.is_dir() else []
    if not have:
        raise ConfigError(f"{root}: no measured tables (expected {compute}/<gpu>/<org>/<model>/mlp.csv)")
    folder = folders.get(gpu)
    if folder not in have:
        known = ", ".join(GPU_FOLDERS.get(h, h) for h in have)
        raise ConfigError(f"{root}: no measurements for GPU '{gpu}' (measured: {known})")
    return folder


def measured_gpus(root: str | Path) -> list[str]:
    """The pagesim GPU presets that ``root`` has operation tables for."""
    compute = Path(root) / "vidur-profiling" / "compute"
    if not compute.is_dir():
        return []
    return [GPU_FOLDERS[p.name] for p in sorted(compute.iterdir()) if p.name in GPU_FOLDERS]


def read_measured(root: str | Path, gpu: str) -> MeasuredGPU:
    """All of ``root``'s measurements for GPU preset ``gpu`` (``a100-80gb``, ``h100-80gb``, ``a40``)."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{root}: measured folder not found")
    folder = _gpu_folder(root, gpu)
    files: list[Path] = []
    models: dict[str, MeasuredModel] = {}
    for path in sorted((root / "vidur-profiling" / "compute" / folder).glob("*/*/mlp.csv")):
        name = model_key(path.parent.name)
        models[name] = read_ops(path, name)
        files.append(path)
    if not models:
        raise ConfigError(f"{root}: no mlp.csv for GPU '{gpu}' under vidur-profiling/compute/{folder}")
    allreduce = pd.DataFrame({"tp": pd.Series(dtype=np.int64), "size": pd.Series(dtype=np.int64),
                              "ms": pd.Series(dtype=float)})
    for cluster in (f"{folder}_dgx", f"{folder}_pairwise_nvlink"):  # whole nodes first, as Vidur's default
        path = root / "vidur-profiling" / "network" / cluster / "all_reduce.csv"
        if path.exists():
            allreduce = read_allreduce(path)
            files.append(path)
            break
    attention = {}
    for path in sorted((root / "vidur-attention-subset").glob(f"{folder}_*_attention_rows.csv")):
        name = path.name[len(folder) + 1:-len("_attention_rows.csv")]
        attention[name] = read_attention(path)
        files.append(path)
    return MeasuredGPU(folder, gpu, models, allreduce, attention, files)


def source_commit(root: str | Path) -> str:
    """The upstream commit the measured folder's README names (``commit `<40 hex>` ``), or ``unknown``."""
    readme = Path(root) / "README.md"
    if readme.exists():
        m = re.search(r"commit\s+`([0-9a-f]{40})`", readme.read_text(errors="replace"))
        if m:
            return m.group(1)
    return "unknown"


def cells(measured: MeasuredGPU, model: str) -> pd.DataFrame:
    """The measured iteration cells of ``model`` (see the module docstring): columns ``phase``
    (decode/prefill/layers), ``tokens`` (batch, chunk or token count), ``context`` (cached tokens
    per sequence; 0 for layers), ``tp``, ``measured_s`` (one layer)."""
    mm = measured.models[model]
    ops = mm.ops.assign(layer_ms=mm.layer_ms())
    h, dtype = mm.spec.hidden_size, mm.spec.dtype_bytes
    ar_tps = set(measured.allreduce_tps())
    parts = []
    for tp, g in ops.groupby("tp"):
        if tp > 1 and tp not in ar_tps:
            continue  # no measured all-reduce: the cell would not be measured whole
        if tp > 1:  # only sizes within the measured range: the table's ends are not extended
            size = g["num_tokens"].to_numpy() * h * dtype
            measured_sizes = measured.allreduce.loc[measured.allreduce["tp"] == tp, "size"]
            g = g[(size >= measured_sizes.min()) & (size <= measured_sizes.max())]
        ms = g["layer_ms"].to_numpy(float)
        if tp > 1:
            ms = ms + 2 * measured.allreduce_ms(int(tp), g["num_tokens"].to_numpy() * h * dtype)
        parts.append(pd.DataFrame({"phase": "layers", "tokens": g["num_tokens"].to_numpy(), "context": 0,
                                   "tp": int(tp), "measured_s": ms * 1e-3}))
    att = measured.attention.get(model)
    if att is not None:
        tp1 = ops[ops["tp"] == 1].set_index("num_tokens")["layer_ms"]
        for phase in ("decode", "prefill"):
            a = att[(att["kind"] == phase) & att["n"].isin(tp1.index)]
            ms = a["ms"].to_numpy() + tp1.loc[a["n"]].to_numpy()
            parts.append(pd.DataFrame({"phase": phase, "tokens": a["n"].to_numpy(), "context": a["kv"].to_numpy(),
                                       "tp": 1, "measured_s": ms * 1e-3}))
    out = pd.concat(parts, ignore_index=True)
    return out.astype({"tokens": np.int64, "context": np.int64, "tp": np.int64})


def check_model(measured: MeasuredGPU, model: str) -> str:
    """``model`` as a key of ``measured.models`` (ConfigError listing the measured ones)."""
    key = model_key(model)
    if key not in measured.models:
        raise ConfigError(f"no measurements of model '{model}' on {measured.gpu} "
                          f"(measured: {', '.join(sorted(measured.models))})")
    return key



def measured_profile_rows(measured: MeasuredGPU, model: str, tp: int, layers: int) -> list[dict]:
    """``model``'s measurements as profile rows (``sim/cost/profile_format.py``) for ``layers``
    layers at ``tp``: ``linear`` per token count (the layers cells), ``attn_decode`` on a full
    batch x context grid (the contexts measured from batch 1 up; the batches measured at any of
    them that the operation table has too, as the decode cells take them; a batch past a
    context's measured range extends its last segment, as the table model extrapolates),
    ``attn_prefill`` for chunks with nothing cached. ConfigError where attention is not measured."""
    interp = interpreted(interp_extrap)
    c = cells(measured, model)
    lin = c[(c["phase"] == "layers") & (c["tp"] == tp)]
    if lin.empty:
        raise ConfigError(f"no measured layers of {model} on {measured.gpu} at tp {tp}")
    att = measured.attention.get(model)
    if att is None or tp != 1:
        raise ConfigError(f"no attention timings for {model} on {measured.gpu} at tp {tp} (measured: "
                          f"{', '.join(f'{measured.folder} {m} tp 1' for m in measured.attention) or 'none'}): "
                          "a profile needs attn_decode rows; use --cost-model calibrated instead")
    common = dict(model=model, gpu=measured.gpu, dtype="float16", tp=tp)
    rows = [dict(component="linear", num_tokens=int(t), batch=None, context=None, time_us=layers * s * 1e6, **common)
            for t, s in zip(lin["tokens"], lin["measured_s"])]
    dec = att[(att["kind"] == "decode") & att["n"].isin(measured.models[model].ops["num_tokens"])]
    grid = [kv for kv, g in dec.groupby("kv") if g["n"].min() == 1]
    batches = np.unique(dec.loc[dec["kv"].isin(grid), "n"])
    for kv in grid:
        g = dec[dec["kv"] == kv].sort_values("n")
        xs, ys = g["n"].to_numpy(float), g["ms"].to_numpy(float)
        ms = [interp(b, xs, ys) for b in batches.astype(float).tolist()]
        rows += [dict(component="attn_decode", num_tokens=None, batch=int(b), context=int(kv) + 1,
                      time_us=layers * m * 1e3, **common) for b, m in zip(batches, ms)]
    pre = att[(att["kind"] == "prefill") & (att["kv"] == 0)]
    rows += [dict(component="attn_prefill", num_tokens=int(n), batch=None, context=None, time_us=layers * m * 1e3,
                  **common) for n, m in zip(pre["n"], pre["ms"])]
    return rows
