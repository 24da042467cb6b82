"""``pagesim plan MODE --help`` prints that mode's own options (its question, SLO, search, its cost
options, output), within 100 columns; ``pagesim plan --help`` prints them all."""

import pytest

from pagesim.experiments.plan_cli import MODE_HELP
from pagesim.sim.cli import main
from pagesim.experiments.plan_cli import MODES

OWN = {"max-rate": "--error-band", "resources": "--tp-options", "compare-gpus": "--gpus",
       "disaggregation": "--kv-link"}
#: another mode's own option a mode shares (disaggregation: --gpus N, its band, its pools' router;
#: compare-gpus: each GPU's band)
SHARED = {"disaggregation": ("--gpus", "--error-band"), "compare-gpus": ("--error-band",)}


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_prints_its_own_help(mode, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as done:
        main(["plan", mode, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: pagesim plan {mode} ") and MODE_HELP[mode][0][:40] in " ".join(text.split())
    assert OWN[mode] in text and not [other for m, other in OWN.items()
                                      if m != mode and other in text and other not in SHARED.get(mode, ())]
    assert "\n  --workload" not in text and max(map(len, text.splitlines())) <= 100  # plan's, not listed
    assert len(text.splitlines()) < 120  # the whole plan --help is ~275 lines


def test_plan_help_without_a_mode_lists_every_option(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = capsys.readouterr().out
    assert all(flag in text for flag in (*OWN.values(), "--workload", "--kv-gib", "--slo-ttft-p99"))
