"""The GPU programme's dry run (benchmarks/gpu_programme.py --dry-run): every step of the four
phases on the CPU, with what the device would send back checked against its limits."""

from __future__ import annotations

import json
import re
import sys
import tarfile
from pathlib import Path

import pytest

from pagesim.sim.config import SimConfig
from pagesim.sim.run import run_simulation
from pagesim.traces.synth import make_workload

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_programme as gp  # noqa: E402

NAME = re.compile(r"^[A-Za-z0-9._-]+$")


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    work = tmp_path_factory.mktemp("work")
    # numba's first compile of the core (minutes on a loaded 2-core CI machine) is paid here, not
    # against the programme's deadlines, which are the device's (its warm_core step then loads it)
    run_simulation(SimConfig(), make_workload("sharegpt", rate=2.0, num_requests=8))
    rc = gp.main(["all", "--dry-run", "--out", str(out), "--work", str(work)])
    return rc, out, work


def test_dry_run_every_step_passes(dry):
    rc, out, _ = dry
    assert rc == 0
    (tag,) = [p.name for p in out.iterdir()]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d-cpu-dry-run", tag)
    for phase in (1, 2, 3, 4):
        text = (out / tag / f"summary{phase}.txt").read_text()
        steps = re.findall(r"^(\S+)\s+rc=(\d+)", text, re.M)
        assert steps and all(r == "0" for _, r in steps), text
        assert not re.search(r"^\S+\s+skipped: \d+ s left", text, re.M), text
    s1 = (out / tag / "summary1.txt").read_text()
    assert "compute-sanitizer memcheck/racecheck skipped: dry run" in s1
    # 40 attention (2 dtypes x 5 head dims x 4 heads) + 2 reduce + 4 reshape_and_cache + 2 copy_blocks
    # + 8 fused (2 dtypes x (norm, silu, rotary with int and long long slots)) + 10 tensor-core
    # attention (2 dtypes x 5 head dims)
    assert "listed 66 instantiations with --std=c++14 -lineinfo" in s1
    assert re.search(r"\d+ tests? collected", s1), s1  # the GPU tests collect
    s2 = (out / tag / "summary2.txt").read_text()  # the sweep's summary against the targets runs
    assert re.search(r"^summary\s+rc=0 ", s2, re.M) and "kernel sweep: no point with >= 256 MiB" in s2, s2
    s4 = (out / tag / "summary4.txt").read_text()  # the decode paths' command line works (its cases listed)
    assert re.search(r"^decode_paths\s+rc=0 ", s4, re.M) and "dry run: 3 paths" in s4, s4
    for phase in (3, 4):  # numba's compile of the core is a step of its own, before the validations
        text = (out / tag / f"summary{phase}.txt").read_text()
        assert re.search(r"^warm_core\s+rc=0 ", text, re.M) and "core compiled or loaded from numba's cache" in text
        assert text.index("warm_core") < text.index("val_")


def test_what_comes_back_fits_the_device_limits(dry):
    _, out, _ = dry
    files = [p for p in out.rglob("*") if p.is_file()]
    # one call returns one phase: 2 files, at most 2 folders deep under $OUT, plain names, small
    for phase in (1, 2, 3, 4):
        per_call = [p for p in files if p.name in (f"summary{phase}.txt", f"phase{phase}.tgz")]
        assert len(per_call) == 2
    assert len(files) == 8
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
    assert b"component" in _member(out, 2, "profile_llama-3-8b.csv")
    for m in gp.MODELS:
        v = json.loads(_member(out, 3, f"val_{m}/validation.json"))
        assert v["step_error_model"] == "table" and v["profile"].endswith(f"profile_{m}.csv")
    cow = json.loads(_member(out, 3, "val_cow_swap/validation.json"))
    assert cow["executor_copies"] > 0 and cow["real_num_preemptions"] > 0  # copy-on-write and swaps ran
    steps = _member(out, 3, "val_cow_swap/steps.csv").decode().splitlines()
    cols = steps[0].split(",")
    i, o = cols.index("swap_in_tokens"), cols.index("swap_out_tokens")
    assert sum(int(r.split(",")[i]) + int(r.split(",")[o]) for r in steps[1:]) > 0
    scaling = json.loads(_member(out, 4, "layer_scaling.json"))
    assert set(scaling["runs"]) == {"4", "32"}


def test_planned_device_time_fits_the_budget():
    assert all(hi < 600 for _, hi in gp.PHASES.values())  # each call under 10 minutes
    assert sum(hi for _, hi in gp.PHASES.values()) <= 24 * 60  # + a machine start, <= 25 minutes
    for p in (1, 2, 3, 4):  # no step alone is longer than its phase
        assert all(st.timeout_s <= gp.PHASES[p][1] for st in gp.steps_for(p, Path("w"), False, "h200", Path("p")))


def test_a_phase_past_its_deadline_skips_steps_and_says_so(tmp_path):
    rc = gp.main(["2", "--dry-run", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w"),
                  "--limit-s", "20"])
    (summary,) = (tmp_path / "o").rglob("summary2.txt")
    text = summary.read_text()
    assert rc == 5 and re.search(r"calibrate_llama-3-8b\s+skipped: \d+ s left", text), text
    assert list((tmp_path / "o").rglob("phase2.tgz"))

