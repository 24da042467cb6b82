"""The GPU programme's dry run (benchmarks/gpu_programme.py --dry-run): every step of the three
phases on the CPU, with what the device would send back checked against its limits."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_programme as gp  # noqa: E402

NAME = re.compile(r"^[A-Za-z0-9._-]+$")


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    work = tmp_path_factory.mktemp("work")
    rc = gp.main(["all", "--dry-run", "--out", str(out), "--work", str(work)])
    return rc, out, work


def test_dry_run_every_step_passes(dry):
    rc, out, _ = dry
    assert rc == 0
    (tag,) = [p.name for p in out.iterdir()]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d-cpu-dry-run", tag)
    for phase in (1, 2, 3):
        text = (out / tag / f"summary{phase}.txt").read_text()
        steps = re.findall(r"^(\S+)\s+rc=(\d+)", text, re.M)
        assert steps and all(r == "0" for _, r in steps), text
        assert not re.search(r"^\S+\s+skipped: \d+ s left", text, re.M), text
    s1 = (out / tag / "summary1.txt").read_text()
    # 40 attention (2 dtypes x 5 head dims x 4 heads) + 2 reduce + 4 reshape_and_cache + 2 copy_blocks
    # + 8 fused (2 dtypes x (norm, silu, rotary with int and long long slots)) + 20 tensor-core
    # attention (2 dtypes x 5 head dims x 2 and 3 pipeline stages)
    assert "listed 76 instantiations with --std=c++14 -lineinfo" in s1
    assert re.search(r"\d+ tests? collected", s1), s1  # the GPU tests collect
    # the sweep's summary against the targets runs
    assert re.search(r"^summary\s+rc=0 ", s1, re.M) and "kernel sweep: no point with >= 256 MiB" in s1, s1
    s3 = (out / tag / "summary3.txt").read_text()
    assert "compute-sanitizer memcheck/racecheck skipped: dry run" in s3
    assert re.search(r"^decode_paths\s+rc=0 ", s3, re.M) and "dry run: 3 paths" in s3, s3  # its cases listed
    s2 = (out / tag / "summary2.txt").read_text()
    assert re.search(r"^decode_slope\s+rc=0 ", s2, re.M), s2
    # each model's steps priced with the other's host term (the fake backend's runs: the figures
    # mean nothing, the table's rows must be there)
    assert re.search(r"^host_heldout\s+rc=0 ", s2, re.M), s2
    heldout = _member(out, 2, "log/host_heldout.txt").decode()
    fit = json.loads(_member(out, 2, "val_llama-3-8b/validation.json"))["host_fit"]
    term = f"{fit['intercept_ms']:.3f} + {fit['per_seq_ms']:.4f}"  # llama-3-8b's own host term
    assert re.search(rf"^val_llama-2-7b .* val_llama-3-8b +{re.escape(term)} ", heldout, re.M), (term, heldout)
    # its kernel table, through the runner's torch paths on the CPU; without torch, a line saying so
    has_torch = importlib.util.find_spec("torch") is not None
    assert ("(sum, scaled)" if has_torch else "decode_slope skipped: no torch here") in s2, s2


def test_validations_run_the_core_interpreted():
    """No call pays numba's compile of the core: every validation runs with PAGESIM_JIT=0, and
    nothing else of phases 2-3 imports the simulator's core compiled."""
    for phase in (2, 3):
        steps = gp.steps_for(phase, Path("w"), False, "h200", Path("p"))
        vals = [st for st in steps if st.name.startswith("val_")]
        assert vals and all(st.env.get("PAGESIM_JIT") == "0" for st in vals)
        assert "warm_core" not in [st.name for st in steps]


def test_phase_2_finds_phase_1s_profiles_on_a_warm_machine(tmp_path):
    prev = tmp_path / "phase1"
    prev.mkdir()
    (prev / "profile_llama-3-8b.csv").write_text("x\n")  # llama-2-7b's is missing: a quick calibration
    names = [st.name for st in gp.steps_for(2, tmp_path / "phase2", False, "h200", prev)]
    assert names == ["calibrate_quick_llama-2-7b", "val_cow_swap", "val_llama-3-8b", "val_llama-2-7b", "summary",
                     "host_heldout", "decode_slope"]
    (val,) = [st for st in gp.steps_for(2, tmp_path / "phase2", False, "h200", prev) if st.name == "val_llama-3-8b"]
    assert val.argv[val.argv.index("--profile") + 1] == str(prev / "profile_llama-3-8b.csv")


def test_what_comes_back_fits_the_device_limits(dry):
    _, out, _ = dry
    files = [p for p in out.rglob("*") if p.is_file()]
    # one phase returns 2 files, at most 2 folders deep under $OUT, plain names, small: a call of
    # the session's two phases 4, of all three 6 (the device returns 8)
    for phase in (1, 2, 3):
        per_call = [p for p in files if p.name in (f"summary{phase}.txt", f"phase{phase}.tgz")]
        assert len(per_call) == 2
    assert len(files) == 6
    for p in files:
        rel = p.relative_to(out)
        assert len(rel.parts) <= 3 and all(NAME.match(x) for x in rel.parts)
        assert p.stat().st_size < 16 << 20


def _member(out, phase, suffix):
    (tgz,) = out.rglob(f"phase{phase}.tgz")
    with tarfile.open(tgz) as t:
        names = t.getnames()
        hit = [n for n in names if n.endswith(suffix)]
        assert hit, (suffix, names)
        return t.extractfile(hit[0]).read()


def test_the_phases_hold_their_outputs(dry):
    _, out, _ = dry
    assert b"instantiations" in _member(out, 1, "log/compile_all.txt")
    assert b"component" in _member(out, 1, "profile_llama-3-8b.csv")
    # each run priced with the host term fitted on the run before it: held out
    before = {"llama-3-8b": "val_cow_swap", "llama-2-7b": "val_llama-3-8b"}
    for m in gp.MODELS:
        v = json.loads(_member(out, 2, f"val_{m}/validation.json"))
        assert v["step_error_model"] == "table" and v["profile"].endswith(f"profile_{m}.csv")
        assert v["host_from"]["run"].endswith(before[m])
    cow = json.loads(_member(out, 2, "val_cow_swap/validation.json"))
    assert cow["executor_copies"] > 0 and cow["real_num_preemptions"] > 0  # copy-on-write and swaps ran
    # priced by the table model of the model's own runs, as they are, and held out by host term too
    assert cow["step_error_model"] == "table" and cow["profile"].endswith("profile_llama-2-7b.csv")
    assert b"val_cow_swap" in _member(out, 2, "log/host_heldout.txt")
    steps = _member(out, 2, "val_cow_swap/steps.csv").decode().splitlines()
    cols = steps[0].split(",")
    i, o = cols.index("swap_in_tokens"), cols.index("swap_out_tokens")
    assert sum(int(r.split(",")[i]) + int(r.split(",")[o]) for r in steps[1:]) > 0
    scaling = json.loads(_member(out, 3, "layer_scaling.json"))
    assert set(scaling["runs"]) == {"4", "8", "16", "32"}
    assert set(scaling["relative_difference_by_layers"]) == {"4", "8", "16"}


def test_planned_device_time_fits_the_budget():
    assert all(hi < 600 for _, hi in gp.PHASES.values())  # each call under 10 minutes
    assert sum(gp.PHASES[p][1] for p in gp.SESSION_PHASES) < 600  # the session's phases: one call too
    # a session lent a GPU has 15 minutes: its phases at worst, a machine's start (2 min) and 3 min for
    # a rerun of the shorter phase
    assert sum(gp.PHASES[p][1] for p in gp.SESSION_PHASES) + 120 + 180 <= 15 * 60
    for p in gp.PHASES:  # no step alone is longer than its phase
        assert all(st.timeout_s <= gp.PHASES[p][1] for st in gp.steps_for(p, Path("w"), False, "h200", Path("p")))


def test_a_phase_past_its_deadline_skips_steps_and_says_so(tmp_path):
    rc = gp.main(["1", "--dry-run", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w"),
                  "--limit-s", "20"])
    (summary,) = (tmp_path / "o").rglob("summary1.txt")
    text = summary.read_text()
    assert rc == 5 and re.search(r"calibrate_llama-3-8b\s+skipped: \d+ s left", text), text
    assert list((tmp_path / "o").rglob("phase1.tgz"))



def test_a_validation_held_out_by_host_term_runs_without_it_where_the_run_before_failed(tmp_path):
    """``host_from``: ``--host-from DIR`` where DIR holds a validation.json, else the command as
    given and one line in the log naming the run that wrote none."""
    lines = []
    step = gp.Step("val_b", ["pagesim", "validate"], 90, host_from=tmp_path / "val_a")
    assert gp.step_argv(step, lines.append) == ["pagesim", "validate"]
    assert lines and "val_a wrote no validation.json" in lines[0]
    (tmp_path / "val_a").mkdir()
    (tmp_path / "val_a" / "validation.json").write_text("{}")
    assert gp.step_argv(step, lines.append) == ["pagesim", "validate", "--host-from", str(tmp_path / "val_a")]
    assert gp.step_argv(gp.Step("x", ["a"], 1), lines.append) == ["a"] and len(lines) == 1
