"""Every report page pagesim writes, opened in headless Chromium as a user would: plotly drew
every chart (offline), no chart or table shows NaN, the reproduce charts carry every system and
the paper's values, bar labels are numbers to one decimal.

Pages: a single run (``simulate --report``), the reproduce report (``reproduce all --quick``),
the plan reports of the three modes, and the GPU-mode validation report (``validate --backend
fake``, CPU only). Marked ``slow`` (real runs, then about five seconds of Chromium per page);
skipped when no Chromium is installed (``apt-get install chromium``).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pagesim.experiments import engine_era
from pagesim.reports import chart_checks as C
from pagesim.sim.cli import main
from tests.reports.test_chart_checks import NO_PAPER_VALUES

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="chromium not on PATH")]

SYSTEMS = ("orca-max", "orca-pow2", "orca-oracle", "vllm")
SMALL = ["--workload", "sharegpt", "--duration", "30", "--no-progress"]


def render(path: Path) -> str:
    """The page's DOM after its scripts ran (plotly replaces each chart's div by SVG); a script
    error on the page (Chromium's console, logged to stderr) fails the test."""
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--enable-logging=stderr", "--v=0", "--window-size=1280,900",  # a laptop's browser
                        "--virtual-time-budget=10000", "--dump-dom",
                        path.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    console = [line for line in p.stderr.splitlines() if "CONSOLE" in line and ("Error" in line or "Uncaught" in line)]
    assert not console, console[:3]
    return p.stdout


#: read into the page: each chart's facts as plotly.js resolved them (its traces, its axes' types
#: and ranges after autorange, its shapes' names and annotations' texts), in the shape
#: ``reports.chart_checks.figure_facts`` gives a figure, written into <pre id="chart-facts">
FACTS_SCRIPT = """<script>
window.addEventListener("load", function () { setTimeout(function () {
  var out = [];
  document.querySelectorAll(".plotly-graph-div").forEach(function (gd) {
    var L = gd._fullLayout || {}, axes = {};
    Object.keys(L).forEach(function (k) {
      if (/^[xy]axis\\d*$/.test(k)) {
        var a = L[k];
        axes[k[0] + k.slice(5)] = {type: a.type, range: a.range, rangemode: a.rangemode,
                                   title: (a.title && a.title.text) || ""};
      }
    });
    var list = function (v) { return v && typeof v !== "string" && v.length !== undefined ? Array.from(v) : []; };
    var traces = (gd._fullData || []).map(function (t) {
      var m = t.marker || {}, l = t.line || {}, e = t.error_y || {};
      return {name: t.name || "", type: t.type, showlegend: !!t.showlegend && L.showlegend !== false,
              xaxis: t.xaxis || "x", yaxis: t.yaxis || "y", x: list(t.x), y: list(t.y),
              base: t.base === undefined ? null : t.base, stackgroup: t.stackgroup || null,
              error_y: {visible: !!e.visible, array: list(e.array), arrayminus: list(e.arrayminus)},
              colour: typeof m.color === "string" ? m.color : (l.color || null),
              style: t.type + " " + (l.dash || "solid") + " " + (typeof m.symbol === "string" ? m.symbol : "circle"),
              legendgroup: t.legendgroup};
    });
    var marks = (L.shapes || []).map(function (s) { return s.name || ""; })
      .concat((L.annotations || []).map(function (a) { return a.text || ""; }));
    out.push({title: (L.title && L.title.text) || "", traces: traces, axes: axes, marks: marks,
              barmode: L.barmode});
  });
  var pre = document.createElement("pre");
  pre.id = "chart-facts";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 500); });
</script>"""


def chart_facts(dom: str) -> list[dict]:
    """The facts :data:`FACTS_SCRIPT` wrote into the drawn page."""
    found = re.search(r'<pre id="chart-facts">(.*?)</pre>', dom, flags=re.S)
    assert found, "the page's charts were not read (FACTS_SCRIPT did not run)"
    return json.loads(html.unescape(found.group(1)))


def charts(dom: str) -> dict[str, str]:
    """Each chart's DOM by its title (the part of the page from its div to the next chart's)."""
    parts = re.split(r'(?=<div[^>]*class="plotly-graph-div)', dom)[1:]
    out = {}
    for part in parts:
        title = re.search(r'class="gtitle"[^>]*data-unformatted="([^"]*)"', part)
        out[title.group(1) if title else f"untitled {len(out)}"] = part
    return out


def texts(chunk: str, cls: str) -> list[str]:
    """The text of every SVG element of class ``cls`` (legend entries, bar labels, tick labels)."""
    return [re.sub(r"<[^>]+>", "", t) for t in re.findall(rf'<text class="{cls}[^"]*"[^>]*>(.*?)</text>', chunk)]


def x_ticks(chunk: str) -> list[str]:
    """The x-axis tick labels of every panel (plotly classes their groups xtick, x2tick, ...)."""
    return [re.sub(r"<[^>]+>", "", t) for t in re.findall(r'<g class="x\d*tick\d*"><text[^>]*>(.*?)</text>', chunk)]


def crowded_ticks(chunk: str) -> list[str]:
    """The x axes whose tick labels plotly had to turn (it rotates them when they would overlap),
    sit under 12 px apart, or (3 or more) spread over less than half the panel's width: an axis
    range far wider than its data, as a label placed at 10^11 on a log axis made it."""
    widths = {m[0]: float(m[1]) for m in re.findall(
        r'<rect class="nsewdrag drag" data-subplot="(x\d*)y\d*"[^>]*width="([\d.]+)"', chunk)}
    crowded = []
    for axis in sorted(set(re.findall(r'<g class="(x\d*)tick"', chunk))):
        labels = re.findall(rf'<g class="{axis}tick"><text[^>]*transform="translate\(([\d.]+),[^"]*"[^>]*>', chunk)
        xs = sorted(float(x) for x in labels)
        turned = re.search(rf'<g class="{axis}tick"><text[^>]*transform="[^"]*rotate\(', chunk)
        narrow = len(xs) >= 3 and axis in widths and xs[-1] - xs[0] < 0.5 * widths[axis]
        if turned or narrow or any(b - a < 12 for a, b in zip(xs, xs[1:])):
            crowded.append(axis)
    return crowded


def check_page(path: Path, min_charts: int, paper: bool = False) -> dict[str, str]:
    """Open ``path`` in Chromium; every chart drawn, its ticks apart, its data within its axes
    as drawn, no legend entry twice, its colours apart (``reports.chart_checks``); with
    ``paper``, the paper's marks on every chart of a figure with paper values."""
    checked = path.with_name(path.stem + ".checked.html")
    checked.write_text(path.read_text(encoding="utf-8").replace("</body>", FACTS_SCRIPT + "</body>"),
                       encoding="utf-8")
    dom = render(checked)
    found = charts(dom)
    assert len(found) >= min_charts, list(found)
    for title, chunk in found.items():
        assert 'class="main-svg"' in chunk, f"{title}: not drawn"  # plotly.js ran, from the page itself
        assert not crowded_ticks(chunk), f"{title}: crowded x ticks on {crowded_ticks(chunk)}"
    facts = chart_facts(dom)
    assert len(facts) == len(found)
    for f in facts:
        assert C.chart_problems(f) == [], f["title"]
        if paper:
            assert C.has_paper_marks(f) or f["title"].startswith(NO_PAPER_VALUES), f"{f['title']}: no paper marks"
    dom = re.sub(r'<pre id="chart-facts">.*?</pre>', "", dom, flags=re.S)
    shown = re.sub(r"<script.*?</script>", "", dom, flags=re.S)
    bad = re.findall(r">\s*(NaN|nan|undefined|null|None|inf)\s*<", shown)
    assert not bad, f"{path.name} shows {bad[:5]}"
    return found


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("pages")


@pytest.mark.timeout(300)
def test_single_run_report(out):
    d = out / "run"
    assert main(["simulate", *SMALL, "--rate", "2", "--system", "orca-pow2", "--out", str(d), "--report"]) == 0
    found = check_page(d / "report.html", 4)
    assert any(t.startswith("KV memory breakdown: orca-pow2") for t in found)
    assert "paper" in x_ticks(found[next(t for t in found if t.startswith("KV memory"))])


@pytest.mark.timeout(600)
def test_reproduce_report(out):
    from pagesim.sim.errors import ConfigError
    from pagesim.traces.chatbot import lengths_path

    try:
        lengths_path()  # Fig. 17's and DistServe's chatbot workload reads the real ShareGPT lengths
    except ConfigError as absent:
        pytest.skip(str(absent))
    d = out / "repro"
    assert main(["reproduce", "all", "--quick", "--out", str(d), "--no-progress", "--cache-dir", str(out / "cache")]) == 0
    found = check_page(d / "report.html", 8, paper=True)
    fig13 = found["Fig. 13: average batched requests"]
    ticks = x_ticks(fig13)
    for s in SYSTEMS:  # every system in both panels (before: 2 of 4, labelled NaN)
        assert ticks.count(s) == 2, (s, ticks)
    legend = texts(fig13, "legendtext")
    era = engine_era.gpu_time_scale("roofline")
    assert "paper" in legend and {f"pagesim, the 2023 engines' speed (GPU time x{era:g})",
                                  "pagesim, the cost model's own speed"} <= set(legend)
    labels = texts(fig13, "bartext")
    assert len(labels) == 2 * 4 * 3  # 2 workloads x 4 systems x (paper + 2 speeds)
    assert all(re.fullmatch(r"\d+\.\d", t) for t in labels), labels  # one decimal, never raw floats
    ratios = found["Fig. 12: vLLM's sustainable rate over each Orca variant"]
    assert "paper range" in texts(ratios, "legendtext")
    fig18b = found["Fig. 18b: normalized latency vs block size (vLLM)"]
    assert {"paper: best 16-128", "paper: best 16-32"} <= set(texts(fig18b, "annotation-text"))
    assert "paper" in x_ticks(found["Fig. 2: where KV-cache memory goes"])
    assert "paper" in texts(found["Fig. 15: memory saved by sharing KV blocks"], "legendtext")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode, flags, min_charts", [
    ("max-rate", ["--systems", "orca-oracle,vllm"], 2),
    ("resources", ["--rate", "1", "--tp-options", "1", "--what-if", "block_size=32", "--systems", "vllm"], 2),
    ("compare-gpus", ["--gpus", "a100-40gb,a100-80gb", "--systems", "vllm"], 3),
])
def test_plan_reports(out, mode, flags, min_charts):
    d = out / f"plan-{mode}"
    rc = main(["plan", mode, *SMALL, "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.1", "--rtol", "0.2", *flags,
               "--workers", "1", "--cache-dir", str(out / "cache"), "--out", str(d), "--report"])
    assert rc == 0
    found = check_page(d / "report.html", min_charts)
    assert "Probed points: latency, SLO attainment and throughput against request rate" in found


@pytest.mark.timeout(300)
def test_validation_report(out):
    d = out / "val"
    assert main(["validate", "--workload", "sharegpt", "--rate", "2", "--num-requests", "20", "--model", "llama-2-7b",
                 "--gpu", "h200", "--backend", "fake", "--out", str(d)]) == 0
    check_page(d / "report.html", 2)
