"""Transformations of canonical traces. Each returns a new DataFrame (attrs kept) and never
mutates its input; :func:`apply_max_len_policy` also returns a report of what it changed."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pagesim.sim.errors import ConfigError, TraceError
from pagesim.traces.schema import first_true

from pagesim.sim.config import MAX_LEN_POLICIES


def _with_attrs(out: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    out.attrs = dict(df.attrs)
    return out


def time_slice(df: pd.DataFrame, start_s: float | None = None, end_s: float | None = None) -> pd.DataFrame:
    """Requests with ``start_s <= arrival_s < end_s`` (None: unbounded), re-zeroed so that
    ``start_s`` becomes 0 (a request arriving 2 s after ``start_s`` arrives at 2 s)."""
    start = 0.0 if start_s is None else float(start_s)
    end = math.inf if end_s is None else float(end_s)
    if start < 0 or end <= start:
        raise ConfigError(f"time slice needs 0 <= start < end, got {start_s}:{end_s}")
    a = df["arrival_s"].to_numpy()
    lo, hi = np.searchsorted(a, start, side="left"), np.searchsorted(a, end, side="left")
    out = df.iloc[lo:hi].reset_index(drop=True)
    out["arrival_s"] = out["arrival_s"] - start
    return _with_attrs(out, df)


def scale_rate(df: pd.DataFrame, k: float) -> pd.DataFrame:
    """Multiply the arrival rate by ``k`` (``arrival_s / k``): k=2 replays twice as fast."""
    if not (math.isfinite(k) and k > 0):
        raise ConfigError(f"rate scale must be > 0, got {k}")
    out = df.copy()
    out["arrival_s"] = df["arrival_s"] / k
    return _with_attrs(out, df)


def repeat(df: pd.DataFrame, times: int) -> pd.DataFrame:
    """The trace replayed ``times`` times in a row, at its own mean rate: copy ``c`` arrives
    ``c * span * n / (n - 1)`` later (``n`` rows over ``span`` seconds), so the whole keeps the mean
    rate ``(rows - 1) / span``. Each copy's request ids get ``#c`` and its prefix hashes are its own
    (a copy shares prefixes within itself, never with another: the cache sees new conversations)."""
    if int(times) != times or times < 1:
        raise ConfigError(f"repeat count must be a whole number >= 1, got {times}")
    times, n = int(times), len(df)
    if times == 1 or n == 0:
        return df
    a = df["arrival_s"].to_numpy()
    span = float(a[-1] - a[0])
    period = span * n / (n - 1) if n > 1 and span > 0 else max(span, 1.0)
    copies = []
    for c in range(times):
        part = df.copy()
        part["arrival_s"] = a + c * period
        if c:
            part["request_id"] = df["request_id"].astype(str) + f"#{c}"
            if "prefix_hashes" in df.columns:
                part["prefix_hashes"] = df["prefix_hashes"].map(lambda h, c=c: tuple(hash((x, c)) for x in h))
        copies.append(part)
    return _with_attrs(pd.concat(copies, ignore_index=True), df)


def sample(df: pd.DataFrame, fraction: float | None = None, count: int | None = None, seed: int = 0) -> pd.DataFrame:
    """A seeded random subset in arrival order: ``fraction`` in (0, 1] of the rows (rounded) or
    ``count`` rows (at most all of them). Arrival times are kept (the rate drops accordingly)."""
    if (fraction is None) == (count is None):
        raise ConfigError("sample: give exactly one of fraction or count")
    n = len(df)
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise ConfigError(f"sample fraction must be in (0, 1], got {fraction}")
        count = int(round(fraction * n))
    if count < 0:
        raise ConfigError(f"sample count must be >= 0, got {count}")
    count = min(int(count), n)
    idx = np.sort(np.random.default_rng(seed).choice(n, size=count, replace=False))
    return _with_attrs(df.iloc[idx].reset_index(drop=True), df)


def set_parallel(df: pd.DataFrame, n: int | None = None, beam_width: int | None = None) -> pd.DataFrame:
    """Set every request's ``n`` (parallel samples) and/or ``beam_width``; None leaves it."""
    out = df.copy()
    for col, v in (("n", n), ("beam_width", beam_width)):
        if v is None:
            continue
        if int(v) != v or v < 1:
            raise ConfigError(f"{col} must be an integer >= 1, got {v}")
        out[col] = np.full(len(df), int(v), dtype=np.int64)
    return _with_attrs(out, df)


def draw_priorities(df: pd.DataFrame, weights, seed: int = 0) -> pd.DataFrame:
    """Every request's ``priority``: level k with probability ``weights[k] / sum(weights)``, drawn
    with ``seed`` (its own stream: the draws do not move the trace's other seeded choices)."""
    w = np.asarray(weights, dtype=np.float64)
    with np.errstate(over="ignore"):
        total = w.sum() if w.ndim == 1 else np.nan
    if w.ndim != 1 or not len(w) or not ((w >= 0).all() and 0 < total < np.inf):
        raise ConfigError(f"priority weights must be >= 0, not all 0, and sum to a finite number, "
                          f"got {[float(x) for x in np.ravel(w)]}")
    out = df.copy()
    rng = np.random.default_rng([seed, 0x9A1])  # a stream apart from the trace's
    out["priority"] = rng.choice(len(w), size=len(df), p=w / total).astype(np.int64)
    return _with_attrs(out, df)


def apply_max_len_policy(df: pd.DataFrame, max_seq_len: int, policy: str = "error") -> tuple[pd.DataFrame, dict]:
    """Handle requests whose ``prompt_tokens + output_tokens > max_seq_len``.

    ``error``: raise :class:`TraceError` naming the first such row (1-based, in arrival order).
    ``drop``: remove them. ``truncate``: keep the prompt and clip the output to
    ``max_seq_len - prompt``; if the prompt alone is ``>= max_seq_len``, clip the prompt to
    ``max_seq_len - 1`` and the output to 1 (a request always generates at least one token); a
    clipped prompt keeps its first tokens, so its prefix hashes are cut to the blocks it still
    reaches. ``clip-prompt`` (as Vidur does): keep the output and the prompt's last
    ``max_seq_len - output`` tokens; an output of ``>= max_seq_len`` alone is clipped to
    ``max_seq_len - 1`` and the prompt to its last token. The prompt then no longer starts with
    the hashed blocks, so those rows lose their prefix hashes (nothing of them is shareable).
    Either policy counts the requests it shortened as ``truncated``.
    ``max_seq_len=None`` means no limit (nothing affected).
    Returns ``(df, {"policy", "max_seq_len", "affected", "dropped", "truncated"})``.
    """
    if policy not in MAX_LEN_POLICIES:
        raise ConfigError(f"unknown max-len policy '{policy}'; valid: {', '.join(MAX_LEN_POLICIES)}")
    if max_seq_len is None:  # no limit
        return df, dict(policy=policy, max_seq_len=None, affected=0, dropped=0, truncated=0)
    if max_seq_len < 2:
        raise ConfigError(f"max_seq_len must be >= 2, got {max_seq_len}")
    p = df["prompt_tokens"].to_numpy()
    o = df["output_tokens"].to_numpy()
    over = p + o > max_seq_len
    affected = int(over.sum())
    report = dict(policy=policy, max_seq_len=int(max_seq_len), affected=affected, dropped=0, truncated=0)
    if affected == 0:
        return df, report
    if policy == "error":
        i = first_true(over)
        rid = df["request_id"].iloc[i]
        raise TraceError(f"request {rid!r} needs {p[i]} prompt + {o[i]} output = {p[i] + o[i]} tokens > "
                         f"max_seq_len {max_seq_len} ({affected} such requests); use --max-len-policy drop, "
                         f"truncate or clip-prompt", path=str(df.attrs.get("source", "<trace>")), row=i + 1,
                         field="prompt_tokens+output_tokens")
    if policy == "drop":
        report["dropped"] = affected
        return _with_attrs(df.loc[~over].reset_index(drop=True), df), report
    if policy == "truncate":
        new_p = np.minimum(p, max_seq_len - 1)
        new_o = np.where(over, np.maximum(max_seq_len - new_p, 1), o)
    else:  # clip-prompt
        new_o = np.minimum(o, max_seq_len - 1)
        new_p = np.where(over, max_seq_len - new_o, p)
    out = df.copy()
    out["prompt_tokens"] = new_p.astype(np.int64)
    out["output_tokens"] = new_o.astype(np.int64)
    clipped = p > new_p
    if "prefix_hashes" in out.columns and "hash_block_tokens" in df.attrs and clipped.any():
        b = int(df.attrs["hash_block_tokens"])
        keep = -(-new_p // b) if policy == "truncate" else np.zeros_like(new_p)
        hashes = out["prefix_hashes"].to_numpy(dtype=object).copy()
        for i in np.flatnonzero(clipped):  # only clipped prompts (rare)
            hashes[i] = tuple(hashes[i][: keep[i]])
        out["prefix_hashes"] = pd.Series(hashes, dtype=object)
    report["truncated"] = affected
    return _with_attrs(out, df), report


def keep_last_prompt_tokens(df: pd.DataFrame, max_prompt_tokens: int, max_output_tokens: int | None = None) -> pd.DataFrame:
    """A chatbot's prompt (history + the last query) cut to its last ``max_prompt_tokens`` tokens,
    and its output capped at ``max_output_tokens`` (None: kept), as the vLLM paper's chatbot
    experiment (§6.5: "we cut the prompt to the last 1024 tokens and let the model generate at
    most 1024 tokens"). A cut prompt no longer starts with its hashed blocks, so those rows lose
    their prefix hashes (as ``clip-prompt`` in :func:`apply_max_len_policy`)."""
    for name, v in (("max_prompt_tokens", max_prompt_tokens), ("max_output_tokens", max_output_tokens)):
        if v is not None and (int(v) != v or v < 1):
            raise ConfigError(f"{name} must be an integer >= 1, got {v}")
    out = df.copy()
    p = df["prompt_tokens"].to_numpy()
    out["prompt_tokens"] = np.minimum(p, int(max_prompt_tokens)).astype(np.int64)
    if max_output_tokens is not None:
        out["output_tokens"] = np.minimum(df["output_tokens"].to_numpy(), int(max_output_tokens)).astype(np.int64)
    cut = p > max_prompt_tokens
    if "prefix_hashes" in out.columns and cut.any():
        hashes = out["prefix_hashes"].to_numpy(dtype=object).copy()
        for i in np.flatnonzero(cut):
            hashes[i] = ()
        out["prefix_hashes"] = pd.Series(hashes, dtype=object)
    return _with_attrs(out, df)
