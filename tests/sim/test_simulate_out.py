"""`pagesim simulate --out`: the folder appears whole or not at all, a full disk names the file,
and the run's system label says what ran."""

from __future__ import annotations

import errno
import itertools
import json

import pytest

from pagesim.sim import run as run_module
from pagesim.sim.cli import main
from pagesim.sim.outdir import staged_folder

RUN = ["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "20", "--model", "opt-13b", "--kv-gib", "4",
       "--no-progress"]


def test_full_disk_leaves_no_complete_looking_folder(tmp_path, monkeypatch, capsys):
    """steps.csv is written last; when the disk fills there, the error line names it and the
    folder does not exist (before: summary.json was written first, beside a truncated steps.csv)."""
    real = run_module.write_csv

    def full_at_steps(frame, path):
        if str(path).endswith("steps.csv"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(frame, path)

    monkeypatch.setattr(run_module, "write_csv", full_at_steps)
    out = tmp_path / "run"
    assert main([*RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"pagesim: error: {out / 'steps.csv'}: No space left on device\n"
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing left behind, not even the temporary


def test_rerun_into_an_existing_folder_replaces_the_files_and_keeps_others(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "summary.json").write_text("{}")
    assert main([*RUN, "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["completed"] > 0
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_failure_keeps_the_previous_folder_untouched(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text('{"old": 1}')
    with pytest.raises(RuntimeError):
        with staged_folder(out) as staged:
            (staged / "summary.json").write_text('{"new": 1}')
            raise RuntimeError("the run failed")
    assert (out / "summary.json").read_text() == '{"old": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("flags, label", [
    # docs/guide/simulate.md's example: no preset is contiguous + orca with a predicted reservation and first-fit placement
    (["--manager", "contiguous", "--scheduler", "orca", "--reservation", "predicted", "--placement", "first-fit"],
     "custom: contiguous manager, orca scheduler, predicted reservation, first-fit placement"),
    # contiguous + orca with the defaults (max reservation, buddy placement) is the orca-max preset
    (["--manager", "contiguous", "--scheduler", "orca"], "orca-max"),
    (["--system", "orca-max", "--reservation", "oracle"], "orca-oracle"),
    (["--system", "vllm", "--block-size", "32"], "vllm"),  # a knob, not a different system
    (["--system", "vllm", "--manager", "vattention"], "vattention"),
])
def test_system_label_describes_what_ran(tmp_path, capsys, flags, label):
    out = tmp_path / "run"
    assert main([*RUN, *flags, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["system"] == label
    lines = printed.splitlines()  # a long label wraps under its column, within 100 columns
    row = [lines[0], *itertools.takewhile(lambda line: line.startswith(" "), lines[1:])]
    assert " ".join(" ".join(row).split()).split(None, 1) == ["system", label]
    assert all(len(line) <= 100 for line in row)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["system"] == (label if not label.startswith("custom") else "custom")


def test_a_rerun_removes_the_files_of_the_last_run_it_does_not_write(tmp_path, capsys):
    """A run with --report writes report.html; the same folder reused by a run without it no longer
    holds it (it would describe the other run), while a file of the user's stays; the folder lists
    what the last run wrote (.pagesim-written)."""
    out = tmp_path / "run"
    assert main([*RUN, "--out", str(out), "--report"]) == 0
    assert (out / "report.html").exists()
    (out / "notes.txt").write_text("mine")
    assert main([*RUN, "--out", str(out)]) == 0
    assert not (out / "report.html").exists()
    assert (out / "notes.txt").read_text() == "mine"
    written = (out / ".pagesim-written").read_text().splitlines()
    assert "summary.json" in written and "report.html" not in written and "notes.txt" not in written


def test_the_written_list_survives_a_failed_write_and_a_bad_list(tmp_path):
    """The list moves in after every other file: a write that fails midway keeps the old list, so
    the next complete write still removes the old run's report.html. A listed name that is a
    folder is left alone, and a list that is not UTF-8 text removes nothing it cannot read."""
    out = tmp_path / "run"
    with staged_folder(out) as staged:
        for name in ("summary.json", "report.html", "steps.csv"):
            (staged / name).write_text(name)
    (out / "steps.csv").unlink()
    (out / "steps.csv").mkdir()
    (out / "steps.csv" / "x").write_text("blocks the replace")
    with pytest.raises(OSError):
        with staged_folder(out) as staged:
            for name in ("summary.json", "steps.csv"):
                (staged / name).write_text(name)
    assert "report.html" in (out / ".pagesim-written").read_text().splitlines()
    (out / "steps.csv" / "x").unlink()
    (out / "steps.csv").rmdir()
    (out / "mine").mkdir()
    (out / ".pagesim-written").write_text("summary.json\nreport.html\nmine\nsteps.csv\n")
    with staged_folder(out) as staged:
        for name in ("summary.json", "steps.csv"):
            (staged / name).write_text(name)
    assert not (out / "report.html").exists() and (out / "mine").is_dir()
    (out / ".pagesim-written").write_bytes(b"\xff\xfe report\n")
    with staged_folder(out) as staged:
        (staged / "summary.json").write_text("{}")
    assert (out / "steps.csv").exists()  # the list unreadable: nothing removed, though this write left it out
