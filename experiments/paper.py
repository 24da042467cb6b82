"""The vLLM paper's numbers (Kwon et al., SOSP'23) that ``pagesim reproduce`` compares against,
and DistServe's (Zhong et al., OSDI '24) for the ``distserve`` figure.

All of them live in one file, ``experiments/data/paper_numbers.csv``, one number per row with
where it comes from::

    figure, section, workload, system, metric, mode, width, rate, value, unit, note

* ``fig2``: average share of KV memory (percent) per category. The paper gives only the token-state
  share for vLLM (96.3 %); its ``reservation`` / ``internal_frag`` rows are NaN (not reported) and
  ``external_frag_and_others`` holds the remainder 3.7.
* ``fig13``: average batched requests (OPT-13B; ShareGPT 2 req/s, Alpaca 30 req/s).
* ``fig15``: block savings from sharing. Alpaca per width; ShareGPT only as ranges over widths 2-6
  (``block_saving_pct_low`` / ``_high``).
* ``fig12``: sustained-rate ratios of vLLM against Orca (as ``rate_ratio_vs_<system>_low/_high``).
* ``fig18b``: the range of best block sizes (``best_block_size_low/_high``).
* ``fig14``: vLLM's sustained-rate ratio over Orca-Oracle (``rate_ratio_vs_orca-oracle``) by mode
  and width, Alpaca: the two §6.3 gives in its text (basic sampling, beam width 6).
* ``fig17``: vLLM's sustained-rate ratio over each Orca variant on the chatbot workload (§6.5: 2x).
* ``fig16``: vLLM's throughput over Orca-Oracle's with a shared few-shot prefix
  (``throughput_ratio_vs_orca-oracle``, per workload ``wmt16-1shot`` / ``wmt16-5shot``).
* ``fig19``: recompute vs swap: recompute's spread over block sizes, its largest ratio to swap
  in+out (the paper's "never higher than 20 %", read as at most 1.2x) and the block sizes where
  both give comparable end-to-end latency (``comparable_block_size_low/_high``).
* ``distserve``: DistServe's per-GPU goodput over vLLM's on its chatbot workload
  (``rate_ratio_vs_vllm_low/_high``, §6.2's range over three models) and the SLOs and target of
  its OPT-13B panel, from the authors' artifact (``slo_ttft_s``, ``slo_tpot_s``,
  ``slo_attainment_target``); that panel's measured curves (``slo_attainment_pct`` by per-GPU
  ``rate``, systems ``distserve`` and ``vllm``) and goodputs (``goodput_per_gpu``), read off the
  artifact's saved figure.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import pandas as pd

DATA = Path(__file__).resolve().parent / "data" / "paper_numbers.csv"

#: Fig. 2 categories in the order the paper stacks them
FIG2_CATEGORIES = ("token_states", "reservation", "internal_frag", "external_frag_and_others")
#: the four systems of the paper's end-to-end figures, in plotting order
PAPER_SYSTEMS = ("orca-max", "orca-pow2", "orca-oracle", "vllm")


@lru_cache(maxsize=1)
def _load() -> pd.DataFrame:
    return pd.read_csv(DATA)


def paper_numbers() -> pd.DataFrame:
    """Every paper number, one row each (a fresh copy: change it freely)."""
    return _load().copy()


def paper_value(figure: str, metric: str, *, system: str | None = None, workload: str | None = None,
                mode: str | None = None, width: int | None = None) -> float:
    """One paper number; NaN when the paper does not give it."""
    df = _load()
    sel = (df["figure"] == figure) & (df["metric"] == metric)
    for col, val in (("system", system), ("workload", workload), ("mode", mode)):
        if val is not None:
            sel &= df[col] == val
    if width is not None:
        sel &= df["width"] == width
    rows = df[sel]
    if rows.empty:
        return math.nan
    return float(rows["value"].iloc[0])


def fig2_paper() -> pd.DataFrame:
    """Fig. 2 as a table: index system, columns :data:`FIG2_CATEGORIES` (percent)."""
    df = _load()
    df = df[df["figure"] == "fig2"]
    t = df.pivot_table(index="system", columns="metric", values="value", aggfunc="first", dropna=False)
    return t.reindex(index=list(PAPER_SYSTEMS), columns=list(FIG2_CATEGORIES))


def fig13_paper() -> pd.DataFrame:
    """Fig. 13: columns workload, rate, system, avg_batch_size."""
    df = _load()
    df = df[(df["figure"] == "fig13") & (df["metric"] == "avg_batch_size")]
    return df[["workload", "rate", "system", "value"]].rename(columns={"value": "avg_batch_size"}).reset_index(drop=True)


def fig15_paper(workload: str, mode: str, width: int) -> tuple[float, float, float]:
    """(point, low, high) saving in percent. Alpaca has a point per width (low = high = point);
    ShareGPT only a range over widths 2-6 (point = NaN)."""
    point = paper_value("fig15", "block_saving_pct", workload=workload, mode=mode, width=width)
    if not math.isnan(point):
        return point, point, point
    low = paper_value("fig15", "block_saving_pct_low", workload=workload, mode=mode)
    high = paper_value("fig15", "block_saving_pct_high", workload=workload, mode=mode)
    return math.nan, low, high


def fig12_paper_ratio(baseline: str, workload: str = "sharegpt") -> tuple[float, float]:
    """(low, high) of vLLM's sustained-rate ratio over ``baseline`` (NaN, NaN when not given)."""
    return (paper_value("fig12", f"rate_ratio_vs_{baseline}_low", workload=workload),
            paper_value("fig12", f"rate_ratio_vs_{baseline}_high", workload=workload))


def fig18b_paper_best(workload: str) -> tuple[float, float]:
    """(low, high) of the best block sizes on ``workload``."""
    return (paper_value("fig18b", "best_block_size_low", workload=workload),
            paper_value("fig18b", "best_block_size_high", workload=workload))


def fig14_paper_ratio(baseline: str, mode: str, width: int) -> float:
    """vLLM's sustained-rate ratio over ``baseline`` at (mode, width) on Alpaca (NaN when not given)."""
    return paper_value("fig14", f"rate_ratio_vs_{baseline}", workload="alpaca", mode=mode, width=width)


def fig19_paper_comparable(workload: str = "sharegpt") -> tuple[float, float]:
    """(low, high) of the block sizes where recompute and swap perform alike end to end."""
    return (paper_value("fig19", "comparable_block_size_low", workload=workload),
            paper_value("fig19", "comparable_block_size_high", workload=workload))


#: the DistServe figure's designs by the paper's system names
DISTSERVE_DESIGNS = {"distserve": "disaggregated", "vllm": "colocated"}


def distserve_paper_curve() -> pd.DataFrame:
    """DistServe's Fig. 8 (OPT-13B chatbot) as the artifact measured it: columns design
    (``disaggregated`` for DistServe, ``colocated`` for vLLM), per_gpu_rate, slo_attainment (a
    fraction)."""
    df = _load()
    df = df[(df["figure"] == "distserve") & (df["metric"] == "slo_attainment_pct")]
    return pd.DataFrame({"design": df["system"].map(DISTSERVE_DESIGNS),
                         "per_gpu_rate": df["rate"].astype(float),
                         "slo_attainment": df["value"] / 100.0}).reset_index(drop=True)
