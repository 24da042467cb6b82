"""The run cache (experiments/run_cache.py): keys follow the contents of the files a run reads,
writes are atomic and idempotent under concurrent writers, damaged entries are recomputed, write
errors name the file."""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing as mp

import pandas as pd
import pytest

from pagesim.experiments import run_cache as C
from pagesim.experiments.run_cache import RunOutput
from pagesim.experiments.run_spec import CACHE_FORMAT, RunSpec, canonical_json
from pagesim.experiments.sweep import run_sweep
from pagesim.sim.cli import main
from tests.experiments import fakes
from tests.experiments.fakes import fake_run

LLAMA_LIKE = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
              "max_position_embeddings": 8192}


def spec_for(**sim) -> RunSpec:
    return RunSpec(system="vllm", workload="sharegpt", rate=1.0, duration_s=60, sim={"kv_gib": 12, **sim})


# --------------------------------------------------------------------------------------------
# keys


@pytest.mark.parametrize("setting", ["model", "profile"])
def test_key_follows_the_contents_of_a_named_file(tmp_path, setting):
    """Same path, new contents: a new key (the stale run is not returned); same contents at
    another path with another name in the spec: the spec differs, so the key differs too."""
    f = tmp_path / "file.json"
    f.write_text(json.dumps(LLAMA_LIKE))
    before = spec_for(**{setting: str(f)}).key(salt="s")
    assert spec_for(**{setting: str(f)}).key(salt="s") == before  # deterministic
    f.write_text(json.dumps({**LLAMA_LIKE, "num_hidden_layers": 16}))
    assert spec_for(**{setting: str(f)}).key(salt="s") != before


def test_preset_names_keep_their_keys(tmp_path, monkeypatch):
    """A preset name is not a file: nothing is added to the key (existing caches stay valid)."""
    monkeypatch.chdir(tmp_path)
    spec = spec_for(model="opt-13b")
    payload = {"spec": spec.canonical(), "salt": "s", "format": CACHE_FORMAT}
    assert spec.key(salt="s") == hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def test_plan_reruns_after_the_model_file_changes(tmp_path, capsys):
    """The issue's case through the command line: edit the model's config.json between two plans
    with the same cache; the second plan must simulate again (not reuse the first answer)."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA_LIKE))
    argv = ["plan", "--model", str(cfg), "--gpu", "h100-80gb", "--duration", "20", "--slo-ttft-p99", "5",
            "--max-rate", "4", "--start-rate", "2", "--rtol", "0.5", "--workers", "1", "--no-progress",
            "--no-steady-check", "--no-error-band", "--cache-dir", str(tmp_path / "cache"), "--json"]
    entries = lambda: len(list((tmp_path / "cache").rglob(C.MANIFEST)))  # noqa: E731
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    stored = entries()
    offline = len(first["answers"])  # each answer's requests at once (its saturation: plan.cap_at_saturation)
    assert stored == len(first["points"]) + offline > offline
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["points"] == first["points"] and entries() == stored  # cache hits
    cfg.write_text(json.dumps({**LLAMA_LIKE, "num_hidden_layers": 16}))
    assert main(argv) == 0
    third = json.loads(capsys.readouterr().out)
    assert entries() == stored + len(third["points"]) + offline  # every probe simulated again
    # half the layers: half the KV bytes per token, twice the tokens in about the same pool
    kv1 = first["points"][0]["kv_capacity_tokens"]
    assert third["points"][0]["kv_capacity_tokens"] > 1.9 * kv1


# --------------------------------------------------------------------------------------------
# concurrent writers (../shared/repro/r_cache_race.py)

KEY = "ab" + "0" * 62


def _writer(cache_dir: str, times: int, queue) -> None:
    out = RunOutput(summary={"x": 1}, steps=pd.DataFrame({"a": range(1000)}),
                    requests=pd.DataFrame({"b": range(1000)}))
    failures = []
    for _ in range(times):
        try:
            C.write_cache(cache_dir, KEY, RunSpec(), out)
        except OSError as e:
            failures.append(repr(e))
    queue.put(failures)


@pytest.mark.timeout(120)
def test_concurrent_writers_of_one_entry_all_succeed(tmp_path):
    """Four processes storing the same entry 40 times each: before, 40-50 % of the writes failed
    with "Directory not empty"; now every write succeeds and one complete entry remains."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), 40, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    failures = [f for _ in procs for f in queue.get(timeout=100)]
    for p in procs:
        p.join()
    assert failures == []
    assert C.read_cached_summary(tmp_path, KEY) == {"x": 1}
    assert [p.name for p in (tmp_path / "ab").iterdir()] == [KEY]  # no temporary or set-aside folders left


def test_a_writer_that_loses_the_race_accepts_the_complete_entry(tmp_path, monkeypatch):
    """The rename fails because the entry appeared meanwhile: a complete entry is success and
    stays as it was (same key, same run); with replace=True it is replaced."""
    first = RunOutput(summary={"who": "first"})
    C.write_cache(tmp_path, KEY, RunSpec(), first)
    C.write_cache(tmp_path, KEY, RunSpec(), RunOutput(summary={"who": "second"}))
    assert C.read_cached_summary(tmp_path, KEY) == {"who": "first"}
    C.write_cache(tmp_path, KEY, RunSpec(), RunOutput(summary={"who": "third"}), replace=True)
    assert C.read_cached_summary(tmp_path, KEY) == {"who": "third"}


def test_an_empty_table_is_kept_as_its_columns_not_a_file(tmp_path):
    """A run that records no steps (most of a sweep's runs): its empty step table is named in
    meta.json with its columns' dtypes, no file is written, and a read gives back the same empty
    table; a table with rows is still a file."""
    spec = spec_for()
    key = spec.key(runner=C.runner_name(None))
    empty = pd.DataFrame({"step": pd.Series(dtype="int64"), "start_s": pd.Series(dtype="float64")})
    d = C.write_cache(tmp_path, key, spec, RunOutput(summary={"x": 1}, steps=empty, meta={"label": "a"}))
    assert sorted(p.name for p in d.iterdir()) == ["manifest.json", "meta.json", "spec.json", "summary.json"]
    assert json.loads((d / "meta.json").read_text()) == {
        "empty_tables": {"steps": [["step", "int64"], ["start_s", "float64"]]}, "label": "a"}
    out = C.load_cached(spec, tmp_path)
    assert out.summary == {"x": 1} and out.requests is None
    pd.testing.assert_frame_equal(out.steps, empty)
    rows = pd.DataFrame({"step": [0, 1], "start_s": [0.0, 0.5]})
    d = C.write_cache(tmp_path, key, spec, RunOutput(summary={"x": 1}, steps=rows), replace=True)
    assert (d / "steps.feather").exists() and "empty_tables" not in json.loads((d / "meta.json").read_text())
    pd.testing.assert_frame_equal(C.load_cached(spec, tmp_path).steps, rows)


# --------------------------------------------------------------------------------------------
# damaged entries


def _entry(tmp_path, spec):
    return C.cache_path(tmp_path, spec.key(runner=C.runner_name(fake_run)))


def _damage_truncate(d):
    p = d / "steps.feather"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _damage_garbage(d):
    p = d / "steps.feather"
    p.write_bytes(b"\x00garbage" * (p.stat().st_size // 8 + 1))


def _damage_missing(d):
    (d / "steps.feather").unlink()


def _damage_empty_summary(d):
    (d / "summary.json").write_text("{}")


def _damage_no_manifest(d):
    (d / C.MANIFEST).unlink()


@pytest.mark.parametrize("damage", [_damage_truncate, _damage_garbage, _damage_missing, _damage_empty_summary,
                                    _damage_no_manifest])
def test_damaged_entries_are_recomputed(tmp_path, damage):
    """A truncated or garbage steps.feather, a missing one, summary.json = {} or a missing
    manifest: a miss (not a pyarrow traceback, not a summary without its steps, not an empty
    hit), the run is redone, and the entry is whole again."""
    spec = spec_for()
    good = run_sweep([spec], workers=1, cache_dir=tmp_path, progress=False, run_fn=fake_run)
    damage(_entry(tmp_path, spec))
    assert C.load_cached(spec, tmp_path, run_fn=fake_run) is None
    fakes.CALLS.clear()
    again = run_sweep([spec], workers=1, cache_dir=tmp_path, progress=False, run_fn=fake_run)
    assert len(fakes.CALLS) == 1 and again == good
    out = C.load_cached(spec, tmp_path, run_fn=fake_run)
    assert out is not None and len(out.steps) == 200


def test_reproduce_recomputes_a_run_whose_steps_went_missing(tmp_path, fake_opts):
    """Before, fig2 read the summary as a hit and fell back to whole-run averages when the steps
    were gone ('measured_over' run): fig2.csv changed silently. Now the run is redone."""
    from pagesim.experiments.figures import fig2
    first = fig2.run(fake_opts, quick=True)
    for steps in (tmp_path / "cache").rglob("steps.feather"):
        steps.unlink()
    fake_opts.use_cache = True
    again = fig2.run(fake_opts, quick=True)
    assert (again["measured_over"] == "steady").all()
    pd.testing.assert_frame_equal(first, again)


# --------------------------------------------------------------------------------------------
# full disk


def test_full_disk_names_the_file(tmp_path, monkeypatch, capsys):
    """ENOSPC comes without a file name; the error line names the file being written."""
    def full(self, path, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_feather", full)
    with pytest.raises(OSError) as e:
        C.write_cache(tmp_path, KEY, RunSpec(), RunOutput(summary={}, steps=pd.DataFrame({"a": [1]})))
    assert e.value.filename.endswith("steps.feather") and e.value.errno == errno.ENOSPC
    assert not (tmp_path / "ab" / KEY).exists() and list((tmp_path / "ab").iterdir()) == []


def test_an_entry_is_hashed_once_per_process_until_a_file_changes(tmp_path, monkeypatch):
    """A figure reads a run's summary, then its steps: the entry's files are hashed once; a file
    rewritten since (another size, mtime or inode) is hashed again and found damaged."""
    spec = spec_for()
    run_sweep([spec], workers=1, cache_dir=tmp_path, progress=False, run_fn=fake_run)
    d = _entry(tmp_path, spec)
    hashed = []
    real = C.file_digest
    monkeypatch.setattr(C, "file_digest", lambda p: hashed.append(p.name) or real(p))
    assert C.entry_is_complete(d) and C.entry_is_complete(d)
    assert sorted(hashed) == sorted(p.name for p in d.iterdir() if p.name != C.MANIFEST)  # once each
    _damage_garbage(d)
    assert not C.entry_is_complete(d)
