"""How far a cost model's GPU time is from measured iterations (``pagesim cost error``).

Each measured cell (``sim.cost.measured.cells``: one layer's operations plus attention or
all-reduces) is priced by the cost model as a step of one layer with no LM head and no CPU
overhead, so both sides count the same work; the error of a cell is
``predicted / measured - 1``. Statistics are over ``|error|``: the median, the 90th percentile
(numpy's linear interpolation between order statistics) and the maximum, by phase, token-count
bucket, context bucket and TP degree.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagesim.sim.batch import StepBatch
from pagesim.sim.cost.measured import PHASES
from pagesim.sim.cost.models import make_cost_model
from pagesim.sim.specs import GPUSpec, ModelSpec
from pagesim.sim.terminal import fill, table_lines

#: bucket upper edges: a value v falls in the first bucket with v <= edge (the last is open)
TOKEN_EDGES = (1, 8, 32, 128, 512, 2048)
CONTEXT_EDGES = (0, 256, 1024, 2048)


def cell_batch(phase: str, tokens: int, context: int) -> StepBatch:
    """The step a cell measures: ``tokens`` decode sequences of ``context`` cached tokens (the new
    token's KV included, as pagesim counts it), a prefill chunk of ``tokens`` after ``context``, or
    ``tokens`` tokens without attention (layers)."""
    if phase == "prefill":
        return StepBatch(prefill_seq_ids=np.zeros(1, np.int64), prefill_tokens=np.array([tokens], np.int64),
                         prefill_context=np.array([context + tokens], np.int64))
    ids = np.arange(tokens, dtype=np.int64)
    if phase == "decode":
        return StepBatch(decode_seq_ids=ids, decode_context=np.full(tokens, context + 1, np.int64))
    return StepBatch(decode_seq_ids=ids)


def predict(cells: pd.DataFrame, spec: ModelSpec, gpu: GPUSpec, cost_model: str, calibration=None) -> np.ndarray:
    """Each cell's GPU time (s) under ``cost_model`` (``roofline`` or ``calibrated``)."""
    out = np.empty(len(cells))
    models = {}
    rows = cells[["phase", "tokens", "context", "tp"]].itertuples(index=False)
    for i, (phase, tokens, context, tp) in enumerate(rows):
        cm = models.get(tp)
        if cm is None:
            cm = models[tp] = make_cost_model(spec, gpu, int(tp), step_overhead_ms=0.0, per_seq_overhead_ms=0.0,
                                              cost_model=cost_model, calibration=calibration)
        out[i] = cm.step_time(cell_batch(phase, int(tokens), int(context)))
    return out


def bucket_labels(values, edges: tuple[int, ...]) -> list[str]:
    """``a-b`` for the bucket ``edges[i-1] < v <= edges[i]`` of each value; ``e`` for the first
    (``v <= edges[0]``), ``a+`` past the last edge."""
    labels = []
    for v in np.asarray(values):
        i = int(np.searchsorted(edges, v, side="left"))
        if i == 0:
            labels.append(str(edges[0]))
        elif i == len(edges):
            labels.append(f"{edges[-1] + 1}+")
        else:
            lo, hi = edges[i - 1] + 1, edges[i]
            labels.append(str(hi) if lo == hi else f"{lo}-{hi}")
    return labels


def scored(cells: pd.DataFrame, predicted: np.ndarray) -> pd.DataFrame:
    """``cells`` with ``predicted_s``, ``error`` and the bucket labels."""
    out = cells.assign(predicted_s=predicted, error=predicted / cells["measured_s"].to_numpy() - 1.0)
    out["token_bucket"] = bucket_labels(out["tokens"], TOKEN_EDGES)
    out["context_bucket"] = bucket_labels(out["context"], CONTEXT_EDGES)
    return out


def stats(errors) -> dict:
    """``median``, ``p90`` and ``max`` of ``|errors|`` and the number of ``cells``."""
    a = np.abs(np.asarray(errors, float))
    if not len(a):
        return dict(median=float("nan"), p90=float("nan"), max=float("nan"), cells=0)
    return dict(median=float(np.median(a)), p90=float(np.quantile(a, 0.9)), max=float(a.max()), cells=int(len(a)))


def by(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """:func:`stats` per group of ``columns`` (groups in order of first appearance)."""
    rows = [{**dict(zip(columns, key if isinstance(key, tuple) else (key,))), **stats(g["error"])}
            for key, g in frame.groupby(list(columns), sort=False)]
    return pd.DataFrame(rows)


def summary(frame: pd.DataFrame) -> dict:
    """Overall and per-phase :func:`stats` (the phases present)."""
    out = {"all": stats(frame["error"])}
    for phase, g in frame.groupby("phase", sort=False):
        out[phase] = stats(g["error"])
    return out


def worst(frame: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The ``n`` cells with the largest ``|error|``."""
    order = np.argsort(-np.abs(frame["error"].to_numpy()), kind="stable")[:n]
    return frame.iloc[order]


def pct(v: float) -> str:
    return "-" if v != v else f"{100 * v:.1f} %"


def print_report(frame: pd.DataFrame, title: str, f, worst_n: int = 10) -> None:
    """The error tables ``pagesim cost error`` prints."""
    def table(t: pd.DataFrame, keys: list[str]) -> None:
        cols = keys + ["median", "p90", "max", "cells"]
        cells = [[str(r[k]) for k in keys] + [pct(r["median"]), pct(r["p90"]), pct(r["max"]), str(r["cells"])]
                 for r in t.to_dict("records")]
        print("\n".join(table_lines(cols, cells, keys=len(keys))), file=f)

    rank = frame["phase"].map({p: i for i, p in enumerate(PHASES)})
    frame = frame.assign(_rank=rank).sort_values(["_rank", "tokens", "context"], kind="stable")
    print(fill(title), file=f)
    print("|predicted / measured - 1| of the GPU time per iteration (one layer; LM head and CPU left out)\n", file=f)
    overall = pd.DataFrame([{"phase": "all", **stats(frame["error"])}])
    table(pd.concat([overall, by(frame, "phase")], ignore_index=True), ["phase"])
    print("\nby token count (decode: batch size; prefill: chunk; layers: tokens)", file=f)
    table(by(frame, "phase", "token_bucket"), ["phase", "token_bucket"])
    attn = frame[frame["phase"] != "layers"]
    if len(attn):
        print("\nby context (cached tokens per sequence)", file=f)
        table(by(attn.sort_values(["_rank", "context"], kind="stable"), "phase", "context_bucket"),
              ["phase", "context_bucket"])
    if frame["tp"].nunique() > 1:
        print("\nby tensor-parallel degree", file=f)
        table(by(frame.sort_values("tp", kind="stable"), "tp"), ["tp"])
    print(f"\nworst {worst_n} cells", file=f)
    w = worst(frame, worst_n)
    print(pd.DataFrame({"phase": w["phase"], "tokens": w["tokens"], "context": w["context"], "tp": w["tp"],
                        "measured ms": (w["measured_s"] * 1e3).round(4),
                        "predicted ms": (w["predicted_s"] * 1e3).round(4),
                        "error": [f"{100 * e:+.1f}%" for e in w["error"]]}).to_string(index=False), file=f)
