"""What every chart pagesim draws owes its reader, as checks on the chart's facts.

A chart's facts (:func:`figure_facts`) are its traces (name, whether the legend shows it, its
axes, its numbers, its colour) and its axes (type, range when known, the title). They come from
a plotly figure here (ranges only where the figure sets them), or from the page a browser drew
(``tests/reports/test_browser.py`` reads plotly.js's resolved ``_fullData`` / ``_fullLayout``
into the same shape), so the same checks run with and without a browser:

    outside_axis       a trace's numbers beyond its axis's range (drawn off the chart), or <= 0
                       on a log axis
    squeezed_axes      a linear axis whose numbers span two decades or more with half of them in
                       its lowest fifth: the curves stand as vertical lines at one edge (log it)
    off_zero_axes      a linear y axis of positive numbers that does not start at zero and whose
                       title does not say why (:data:`NOT_FROM_ZERO`): a 1.5 % spread drawn as
                       the chart's whole height
    duplicate_legend   a legend entry shown twice
    similar_colours    two legend entries whose colours a reader cannot tell apart, with normal
                       vision or with deuteranopia (the commonest colour blindness)
    has_paper_marks    whether a trace, shape or annotation says "paper" (the paper's values
                       beside ours)
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

#: an axis title containing this says why it does not start at zero
NOT_FROM_ZERO = "not from zero"
#: two colours closer than this (CIE76 distance in Lab) read as one: about 2.3 is the smallest
#: difference noticed side by side, but legend swatches are small and apart from the marks they
#: name, and two shades of one hue (the hybrid chart's greens, 14-22 apart) are read as one
MIN_COLOUR_DISTANCE = 25.0
#: the same under a deuteranopia simulation (Viénot, Brettel & Mollon 1999): Tableau's red and
#: green are 8 apart to a deuteranope, Okabe & Ito's palette at least 12
MIN_COLOUR_DISTANCE_DEUTAN = 12.0


def _numbers(values) -> list[float]:
    """The finite numbers among ``values`` (a list, an array, None); strings and NaN dropped."""
    if values is None or isinstance(values, (str, bytes, dict)):
        return []
    out = []
    for v in values if hasattr(values, "__iter__") else [values]:
        if isinstance(v, bool) or v is None:
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return out


def _list(values) -> list:
    if values is None or isinstance(values, (str, bytes, dict)):
        return []
    return list(values) if hasattr(values, "__iter__") else [values]


def _colour(trace: dict) -> str | None:
    for part in ("marker", "line", "fillcolor"):
        c = trace.get(part)
        c = c.get("color") if isinstance(c, dict) else c
        if isinstance(c, str):
            return c
    return None


def _style(trace: dict) -> str:
    """What tells two traces of one colour apart: the kind, the line's dash, the marker's symbol."""
    line, marker = trace.get("line") or {}, trace.get("marker") or {}
    dash = line.get("dash") if isinstance(line, dict) else None
    symbol = marker.get("symbol") if isinstance(marker, dict) else None
    return f"{trace.get('type', 'scatter')} {dash or 'solid'} {symbol if isinstance(symbol, str) else 'circle'}"


def _trace_dict(trace) -> dict:
    """A trace's properties, arrays as plotly holds them (numpy arrays, tuples), not packed."""
    out = {"type": trace.type}
    for key in ("name", "showlegend", "xaxis", "yaxis", "x", "y", "base", "stackgroup", "legendgroup"):
        out[key] = getattr(trace, key, None)
    for key in ("marker", "line", "error_y"):
        part = getattr(trace, key, None)
        out[key] = {k: getattr(part, k, None) for k in ("color", "dash", "symbol", "array", "arrayminus", "visible")
                    if k in getattr(part, "_valid_props", ())} if part is not None else None
    out["fillcolor"] = getattr(trace, "fillcolor", None)
    return out


def figure_facts(fig) -> dict[str, Any]:
    """A plotly figure's facts (see the module's docstring): ``title``, ``traces`` and ``axes``
    (by id: ``x``, ``x2``, ``y``...), ``marks`` (the shapes' names and the annotations' texts)
    and ``barmode``. An axis's ``range`` is the figure's own, None where plotly would choose it."""
    layout = fig.layout.to_plotly_json()
    legend_default = layout.get("showlegend", True) is not False
    traces = []
    # each trace's own properties: the figure's JSON (plotly >= 6) packs numeric arrays as base64
    for t in (_trace_dict(trace) for trace in fig.data):
        traces.append({"name": t.get("name") or "", "type": t.get("type", "scatter"),
                       "showlegend": legend_default and t.get("showlegend") is not False and bool(t.get("name")),
                       "xaxis": t.get("xaxis") or "x", "yaxis": t.get("yaxis") or "y",
                       "x": _list(t.get("x")), "y": _list(t.get("y")), "base": t.get("base"),
                       "stackgroup": t.get("stackgroup"), "error_y": t.get("error_y") or {},
                       "colour": _colour(t), "style": _style(t), "legendgroup": t.get("legendgroup")})
    axes = {}
    for key, a in layout.items():
        if key.startswith(("xaxis", "yaxis")):
            axis_id = key[0] + key[5:]
            title = a.get("title")
            axes[axis_id] = {"type": a.get("type"), "range": a.get("range"), "rangemode": a.get("rangemode"),
                             "title": (title.get("text") if isinstance(title, dict) else title) or ""}
    for t in traces:  # axes a trace uses but the layout leaves at plotly's defaults
        for axis_id in (t["xaxis"], t["yaxis"]):
            axes.setdefault(axis_id, {"type": None, "range": None, "rangemode": None, "title": ""})
    title = layout.get("title")
    marks = [s.get("name") or "" for s in layout.get("shapes", [])]
    marks += [a.get("text") or "" for a in layout.get("annotations", [])]
    return {"title": (title.get("text") if isinstance(title, dict) else title) or "", "traces": traces,
            "axes": axes, "marks": marks, "barmode": layout.get("barmode")}


def _axis_type(axis: dict, values: list) -> str:
    """The axis's type, or plotly's guess for an unset one (numbers: linear, else category)."""
    if axis.get("type") and axis["type"] != "-":
        return axis["type"]
    return "linear" if values and all(_numbers([v]) for v in values if v is not None) else "category"


def _extents(facts: dict) -> dict[str, list[float]]:
    """Every number each axis draws: a trace's x and y, a bar's base and top, a stack's sums,
    the ends of error bars."""
    out: dict[str, list[float]] = defaultdict(list)
    stacks: dict[tuple, float] = defaultdict(float)
    for t in facts["traces"]:
        xs, ys = t["x"], t["y"]
        out[t["xaxis"]].extend(_numbers(xs) if t["type"] != "bar" else _numbers(xs))
        stacked = t["stackgroup"] or (t["type"] == "bar" and facts.get("barmode") == "stack")
        base = t["base"]
        bases = _list(base) if base is not None and not isinstance(base, (int, float)) else [base] * len(ys)
        errors = t["error_y"] if isinstance(t["error_y"], dict) and t["error_y"].get("visible", True) else {}
        plus, minus = _list(errors.get("array")), _list(errors.get("arrayminus")) or _list(errors.get("array"))
        for i, y in enumerate(ys):
            v = _numbers([y])
            if not v:
                continue
            if stacked:
                key = (t["stackgroup"] or "bars", t["xaxis"], t["yaxis"], str(xs[i]) if i < len(xs) else i)
                stacks[key] += v[0]
                out[t["yaxis"]].append(stacks[key])
                continue
            b = _numbers([bases[i]]) if i < len(bases) else []
            low = b[0] if b else 0.0
            out[t["yaxis"]].append(low + v[0] if t["type"] == "bar" else v[0])
            if t["type"] == "bar" and b:
                out[t["yaxis"]].append(low)
            for spread, sign in ((plus, 1), (minus, -1)):
                e = _numbers([spread[i]]) if i < len(spread) else []
                if e:
                    out[t["yaxis"]].append(v[0] + sign * e[0])
    return out


def outside_axis(facts: dict) -> list[str]:
    """Each axis with a known range that leaves some of its numbers out, and each log axis
    given numbers <= 0 (plotly drops them silently)."""
    problems = []
    for axis_id, values in _extents(facts).items():
        axis = facts["axes"].get(axis_id, {})
        kind = _axis_type(axis, values)
        if kind not in ("linear", "log") or not values:
            continue
        if kind == "log":
            bad = [v for v in values if v <= 0]
            if bad:
                problems.append(f"{axis_id}: {len(bad)} numbers <= 0 on a log axis")
            values = [math.log10(v) for v in values if v > 0]
        r = axis.get("range")
        if not r or len(r) != 2 or not _numbers(r) or len(_numbers(r)) != 2:
            continue
        low, high = sorted(_numbers(r))
        slack = 1e-6 * max(high - low, 1e-12)
        out = [v for v in values if v < low - slack or v > high + slack]
        if out:
            shown = ", ".join(f"{10 ** v if kind == 'log' else v:.4g}" for v in sorted(out)[:3])
            problems.append(f"{axis_id}: {len(out)} of {len(values)} numbers outside its range "
                            f"{_range_text(low, high, kind)} ({shown}{', ...' if len(out) > 3 else ''})")
    return problems


def _range_text(low: float, high: float, kind: str) -> str:
    return f"{10 ** low:.4g}-{10 ** high:.4g} (log)" if kind == "log" else f"{low:.4g}-{high:.4g}"


def squeezed_axes(facts: dict) -> list[str]:
    """Linear axes whose curves' (scatter traces', unstacked) positive numbers span two decades
    or more with half of them in the lowest fifth of the span: a log axis would show them."""
    values: dict[str, list[float]] = defaultdict(list)
    for t in facts["traces"]:
        if t["type"] not in ("scatter", "scattergl") or t["stackgroup"]:
            continue
        values[t["xaxis"]].extend(v for v in _numbers(t["x"]) if v > 0)
        values[t["yaxis"]].extend(v for v in _numbers(t["y"]) if v > 0)
    problems = []
    for axis_id, vs in values.items():
        if _axis_type(facts["axes"].get(axis_id, {}), vs) == "linear" and squeezed(vs):
            problems.append(f"{axis_id}: {min(vs):.3g}-{max(vs):.3g} on a linear axis, half the points in "
                            "its lowest fifth")
    return problems


def squeezed(values) -> bool:
    """Whether a linear axis would squeeze ``values`` (their positive numbers, 4 or more) into
    its low edge: they span two decades or more and half of them lie in the lowest fifth of
    the span (Fig. 16's probes at 2-256 req/s: five of eight below 52). The plots draw such an
    axis log."""
    vs = sorted(v for v in _numbers(values) if v > 0)
    return len(vs) >= 4 and vs[-1] >= 100 * vs[0] and vs[len(vs) // 2] < 0.2 * vs[-1]


def off_zero_axes(facts: dict) -> list[str]:
    """Linear y axes of positive numbers starting above zero without saying why (an axis title
    with :data:`NOT_FROM_ZERO`). A figure's own axis starts at zero with ``rangemode="tozero"`` or
    a range from <= 0; a drawn page's resolved range shows it."""
    problems = []
    for axis_id, values in _extents(facts).items():
        axis = facts["axes"].get(axis_id, {})
        if not axis_id.startswith("y") or not values or _axis_type(axis, values) != "linear":
            continue
        if min(values) <= 0 or NOT_FROM_ZERO in (axis.get("title") or ""):
            continue
        r = _numbers(axis.get("range"))
        starts = min(r) <= 0 if len(r) == 2 else axis.get("rangemode") == "tozero"
        if not starts and not _all_bars(facts, axis_id):  # plotly starts a bar chart's axis at zero itself
            problems.append(f"{axis_id}: positive numbers {min(values):.4g}-{max(values):.4g}, the axis "
                            f"does not start at zero and its title does not say why")
    return problems


def _all_bars(facts: dict, axis_id: str) -> bool:
    mine = [t for t in facts["traces"] if t["yaxis"] == axis_id]
    return bool(mine) and all(t["type"] == "bar" and t["base"] is None for t in mine)


def duplicate_legend(facts: dict) -> list[str]:
    """Legend entries shown more than once (the same name)."""
    counts = Counter(t["name"] for t in facts["traces"] if t["showlegend"])
    return [f"legend lists {name!r} {n} times" for name, n in counts.items() if n > 1]


def has_paper_marks(facts: dict) -> bool:
    """Whether the chart draws the paper's values: a trace named, a category labelled (Fig. 2's
    bars: ``paper`` beside ``pagesim``), or a shape or annotation saying, "paper"."""
    names = [t["name"] for t in facts["traces"]] + list(facts["marks"])
    for t in facts["traces"]:
        for x in t["x"]:
            names.extend(x if isinstance(x, (list, tuple)) else [x])  # a multi-category axis: one list a level
    return any("paper" in n.lower() for n in names if isinstance(n, str))


# ------------------------------------------------------------------------------------------
# colours


def _rgb(colour: str) -> tuple[float, float, float] | None:
    """sRGB in 0..1 from ``#rrggbb``, ``#rgb`` or ``rgb(a)(r, g, b...)``; None for a name."""
    c = colour.strip().lower()
    if c.startswith("#") and len(c) in (4, 7):
        h = c[1:] if len(c) == 7 else "".join(ch * 2 for ch in c[1:])
        return tuple(int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))
    if c.startswith("rgb"):
        parts = _numbers(c[c.index("(") + 1:c.index(")")].split(","))
        return tuple(p / 255 for p in parts[:3]) if len(parts) >= 3 else None
    return None


def _linear(c: float) -> float:
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _lab(linear_rgb: tuple[float, float, float]) -> tuple[float, float, float]:
    r, g, b = linear_rgb
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t):
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116
    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def _deutan(linear_rgb: tuple[float, float, float]) -> tuple[float, float, float]:
    """Deuteranopia as Viénot, Brettel & Mollon (1999) simulate it, in linear RGB."""
    r, g, b = linear_rgb
    rg = 0.29275 * r + 0.70725 * g
    blue = -0.02234 * r + 0.02234 * g + b
    return rg, rg, min(max(blue, 0.0), 1.0)


def colour_distance(a: str, b: str, deutan: bool = False) -> float:
    """CIE76 distance between two colours (as a deuteranope sees them with ``deutan``)."""
    lin = [tuple(_linear(c) for c in _rgb(x)) for x in (a, b)]
    if deutan:
        lin = [_deutan(x) for x in lin]
    (l1, a1, b1), (l2, a2, b2) = (_lab(x) for x in lin)
    return math.sqrt((l1 - l2) ** 2 + (a1 - a2) ** 2 + (b1 - b2) ** 2)


def similar_colours(facts: dict) -> list[str]:
    """Pairs of legend entries (distinct names, drawn alike but for the colour: the same kind,
    dash and marker) whose colours read as one."""
    entries, styles = {}, {}
    for t in facts["traces"]:
        if t["showlegend"] and t["colour"] and _rgb(t["colour"]) and t["name"] not in entries:
            entries[t["name"]], styles[t["name"]] = t["colour"], t.get("style")
    names = list(entries)
    problems = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if styles[a] != styles[b]:
                continue
            if entries[a].lower() == entries[b].lower():
                problems.append(f"{a!r} and {b!r} share the colour {entries[a]}")
                continue
            normal = colour_distance(entries[a], entries[b])
            deutan = colour_distance(entries[a], entries[b], deutan=True)
            if normal < MIN_COLOUR_DISTANCE or deutan < MIN_COLOUR_DISTANCE_DEUTAN:
                problems.append(f"{a!r} ({entries[a]}) and {b!r} ({entries[b]}) look alike "
                                f"(distance {normal:.1f}, {deutan:.1f} to a deuteranope)")
    return problems


#: every check a chart must pass, by name
CHECKS = {"outside_axis": outside_axis, "squeezed_axes": squeezed_axes, "off_zero_axes": off_zero_axes,
          "duplicate_legend": duplicate_legend, "similar_colours": similar_colours}


def chart_problems(facts: dict) -> list[str]:
    """Everything :data:`CHECKS` finds wrong with one chart, each prefixed by its check."""
    return [f"{name}: {p}" for name, check in CHECKS.items() for p in check(facts)]
