"""``reproduce all``'s closing table: a line per figure within 100 columns, its first miss
under it wrapped, never cut (it was cut at any width: the miss came after four padded columns)."""

from pagesim.experiments import figures as F
from pagesim.experiments import reproduce_cli as R
from pagesim.sim.terminal import WIDTH


def test_the_first_miss_wraps_under_its_figure_and_is_never_cut(monkeypatch):
    long_miss = ("disaggregated: colocated censored: the ratio is an upper bound; 0.50x outside the paper's "
                 "2-4.6x, and more words besides so that it takes two lines")
    found = {"fig2": (4, ["orca-pow2: token_states +3.5 pp vs paper"]), "distserve": (2, [long_miss, "second"]),
             "hybrid": (0, [])}
    monkeypatch.setattr(F, "misses", lambda fig, tables: found[fig])  # (reproduce_cli reads them there)
    monkeypatch.setitem(F.TITLES, "distserve", "DistServe: disaggregated vs colocated")
    lines = R.closing_table({}, ["fig2", "distserve", "hybrid"])
    assert all(len(line) <= WIDTH for line in lines), [len(line) for line in lines]
    assert lines[0].split() == ["figure", "shows", "paper", "misses"]
    assert lines[1].startswith("fig2 ") and lines[1].endswith("differs  1 of 4")
    assert lines[2] == "    first miss: orca-pow2: token_states +3.5 pp vs paper"
    wrapped = [line for line in lines if line.startswith("    first miss: disaggregated") or line.startswith("      ")]
    assert len(wrapped) >= 2
    assert " ".join(w.strip() for w in wrapped) == "first miss: " + long_miss  # whole, not cut with "..."
    assert lines[-2].startswith("hybrid") and lines[-2].endswith("none     0 of 0")
    assert lines[-1] == "(every miss: the report)"
