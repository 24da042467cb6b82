"""The chart checks (``reports/chart_checks.py``) on hand-made figures, each with the fault it
names and without it; then every chart of the reproduce report (the fake engine's figures) and
of the plan reports passes them, and the reproduce charts with paper values draw them. No
browser: ``test_browser.py`` runs the same checks on the pages Chromium drew."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from pagesim.reports import chart_checks as C


def facts(fig: go.Figure) -> dict:
    return C.figure_facts(fig)


def test_numbers_outside_an_axis_range_are_found():
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[0.2, 0.9, 3.0], name="vllm"))
    fig.update_yaxes(range=[0, 1.05])  # Fig. 12's old axis: the curve left the chart at its knee
    assert C.outside_axis(facts(fig)) == ["y: 1 of 3 numbers outside its range 0-1.05 (3)"]
    fig.update_yaxes(range=[0, 3.1])
    assert C.outside_axis(facts(fig)) == []
    # a log axis's range is in log10: 10^-1..10^0.5 = 0.1..3.16 holds them all
    fig.update_yaxes(type="log", range=[-1, 0.5])
    assert C.outside_axis(facts(fig)) == []
    fig.update_yaxes(range=[-0.5, 0.5])  # from 0.316: 0.2 is below
    assert C.outside_axis(facts(fig)) == ["y: 1 of 3 numbers outside its range 0.3162-3.162 (log) (0.2)"]


def test_stacked_bars_are_checked_by_their_sums_and_log_axes_refuse_zero():
    fig = go.Figure([go.Bar(x=["a", "b"], y=[60, 30], name="one"), go.Bar(x=["a", "b"], y=[50, 20], name="two")])
    fig.update_layout(barmode="stack")
    fig.update_yaxes(range=[0, 100])
    assert C.outside_axis(facts(fig)) == ["y: 1 of 4 numbers outside its range 0-100 (110)"]
    fig = go.Figure(go.Scatter(x=[1, 2], y=[0, 5], name="x"))
    fig.update_yaxes(type="log")
    assert C.outside_axis(facts(fig)) == ["y: 1 numbers <= 0 on a log axis"]


def test_an_axis_whose_points_span_decades_at_one_edge_is_squeezed():
    rates = [1, 2, 4, 8, 16, 32, 64, 128, 256]  # Fig. 16's old probes on a linear axis
    assert C.squeezed(rates)  # 256 >= 100 x 1; the median 16 < 51.2
    assert not C.squeezed([10, 20, 30, 40, 120])  # 12x: no decades
    assert not C.squeezed([0.001, 0.5, 0.9, 0.95, 1.0])  # a fraction: its median near the top
    fig = go.Figure(go.Scatter(x=rates, y=[1] * 9, name="vllm"))
    assert C.squeezed_axes(facts(fig)) == ["x: 1-256 on a linear axis, half the points in its lowest fifth"]
    fig.update_xaxes(type="log")
    assert C.squeezed_axes(facts(fig)) == []


def test_a_y_axis_off_zero_must_say_why():
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[9.70, 9.85, 9.78], name="goodput"))  # a 1.5 % spread
    assert C.off_zero_axes(facts(fig)) == [
        "y: positive numbers 9.7-9.85, the axis does not start at zero and its title does not say why"]
    fig.update_yaxes(rangemode="tozero")
    assert C.off_zero_axes(facts(fig)) == []
    fig.update_yaxes(rangemode=None, title_text=f"goodput ({C.NOT_FROM_ZERO}: the spread is 1.5 %)")
    assert C.off_zero_axes(facts(fig)) == []
    bars = go.Figure(go.Bar(x=["a", "b"], y=[9.7, 9.85], name="bars"))  # plotly starts bars at zero
    assert C.off_zero_axes(facts(bars)) == []


def test_a_legend_entry_shown_twice_is_found():
    fig = go.Figure([go.Bar(x=["n=2"], y=[5], name="paper range"), go.Bar(x=["n=2"], y=[6], name="pagesim"),
                     go.Bar(x=["beam 2"], y=[5], name="paper range")])  # Fig. 15's old legend
    assert C.duplicate_legend(facts(fig)) == ["legend lists 'paper range' 2 times"]
    fig.data[2].showlegend = False
    assert C.duplicate_legend(facts(fig)) == []


def test_colours_a_reader_cannot_tell_apart_are_found():
    # the hybrid chart's old greens: #2ca02c beside #66bb6a is 17 apart, but #2ca02c and #1b5e20
    # differ mostly in lightness, and red against green is the deuteranope's confusion
    assert C.colour_distance("#000000", "#ffffff") == pytest.approx(100, abs=0.1)
    assert C.colour_distance("#2ca02c", "#2ca02c") == 0
    assert C.colour_distance("#d62728", "#2ca02c") > 60  # far apart to most readers
    assert C.colour_distance("#ff0000", "#00ff00", deutan=True) < C.colour_distance("#ff0000", "#00ff00")
    fig = go.Figure([go.Bar(x=["a"], y=[1], name="in use: full", marker_color="#2ca02c"),
                     go.Bar(x=["a"], y=[1], name="in use: window", marker_color="#3aa53a")])
    assert C.similar_colours(facts(fig)) and "look alike" in C.similar_colours(facts(fig))[0]
    fig.data[1].marker.color = "#CC79A7"
    assert C.similar_colours(facts(fig)) == []


def test_paper_marks_are_traces_shapes_or_annotations_saying_paper():
    fig = go.Figure(go.Scatter(x=[1], y=[1], name="pagesim"))
    assert not C.has_paper_marks(facts(fig))
    fig.add_annotation(x=1, y=1, text="paper's axis: 0-30 req/s")
    assert C.has_paper_marks(facts(fig))


class Recorder:
    """A stand-in for the report (``reports.html.HtmlReport``) that keeps its figures."""

    def __init__(self):
        self.figures = []

    def figure(self, fig):
        self.figures.append(fig)

    def heading(self, *args, **kwargs):
        pass

    text = reading = table = heading


#: the reproduce charts whose figure has no paper values of its own: the timelines (the paper
#: gives averages), the hybrid models (no paper), and the latency curves of Figs. 14 and 17 (the
#: paper's numbers are the ratios, drawn in the chart that follows each)
NO_PAPER_VALUES = ("Fig. 2 runs", "Hybrid models", "Fig. 14: normalized latency", "Fig. 17: chatbot, normalized")


def test_every_reproduce_chart_passes_and_draws_the_papers_values(tmp_path):
    import pandas as pd

    from pagesim.experiments import figures as X
    from tests.experiments.fakes import fake_run

    opts = X.SweepOptions(workers=1, cache_dir=tmp_path / "cache", progress=False, run_fn=fake_run)
    X.reproduce("all", tmp_path / "out", opts, quick=True)
    rep = Recorder()
    for name in X.REPORT_ORDER:
        p = tmp_path / "out" / f"{name}.csv"
        X.FIGURES[name].section(rep, pd.read_csv(p),
                                lambda n: pd.read_csv(tmp_path / "out" / f"{n}.csv")
                                if (tmp_path / "out" / f"{n}.csv").exists() else None)
    assert len(rep.figures) >= 17
    for fig in rep.figures:
        f = facts(fig)
        assert C.chart_problems(f) == [], f["title"]
        assert C.has_paper_marks(f) or f["title"].startswith(NO_PAPER_VALUES), f["title"]


def test_an_answer_without_a_band_side_loses_its_own_interval_alone():
    """Two GPUs' answers of one system, the second with no slow side (a slower GPU time met no
    rate): the first keeps its interval (its high and low sides about its answer), the second
    none; neither erases the other's."""
    from pagesim.reports.plan_report import answers_figure

    rows = [{"gpu": "h100-80gb", "system": "vllm-v1", "max_rate_rps": 10.0, "max_rate_low_rps": 8.0,
             "max_rate_high_rps": 11.0},
            {"gpu": "a100-80gb", "system": "vllm-v1", "max_rate_rps": 4.0, "max_rate_low_rps": None,
             "max_rate_high_rps": 4.5}]
    fig = answers_figure(rows, "gpu", "max_rate_rps", "t", "req/s", color="system", low="max_rate_low_rps",
                         high="max_rate_high_rps")
    [trace] = fig.data
    assert list(trace.error_y.array) == [1.0, None] and list(trace.error_y.arrayminus) == [2.0, None]
