"""The registry (sim/systems.py) is where the systems are stated: the docs' table, the command
line's choices, the configuration's presets and the core's scheduler kind all read it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pagesim.sim import systems
from pagesim.sim.cli import build_parser
from pagesim.sim.config import SimConfig
from pagesim.sim.errors import ConfigError
from pagesim.sim.core import state
from pagesim.sim.run import initial_state

from tests.sim.helpers import rand_trace

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_systems_table_is_the_registrys():
    assert systems.markdown_table() in (ROOT / "docs/guide/simulate.md").read_text()
    assert systems.settings_table() in (ROOT / "docs/guide/simulate.md").read_text()


def simulate_choices(dest: str) -> tuple:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["simulate"]
    return tuple(next(a for a in sub._actions if a.dest == dest).choices)


def test_the_command_line_offers_the_registrys_names():
    assert simulate_choices("system") == tuple(systems.SYSTEMS)
    assert simulate_choices("scheduler") == tuple(systems.SCHEDULERS)
    assert simulate_choices("manager") == tuple(systems.MANAGERS)
    assert simulate_choices("scheduling_policy") == tuple(systems.SCHEDULING_POLICIES)


@pytest.mark.parametrize("name", list(systems.SYSTEMS))
def test_each_system_runs_its_registered_scheduler_and_presets(name):
    entry = systems.SYSTEMS[name]
    cfg = SimConfig.for_system(name, model="opt-13b", max_seq_len=512)
    for key, value in entry.settings().items():
        assert getattr(cfg, key) == value
    s = initial_state(cfg, rand_trace(0, n=4, max_len=64))
    assert s.config[state.SCHEDULER_KIND] == entry.family


@pytest.mark.parametrize("name, settings, family", [
    ("vllm", {}, state.CONTINUOUS), ("vattention", {}, state.CONTINUOUS),
    ("orca-max", {}, state.CONTINUOUS_CONTIGUOUS), ("orca-max", dict(manager="paged"), state.CONTINUOUS),
    ("vllm", dict(manager="contiguous"), state.CONTINUOUS_CONTIGUOUS),
    ("static", {}, state.STATIC), ("vllm-v1", {}, state.V1), ("sglang", {}, state.SGLANG)])
def test_the_family_by_hand(name, settings, family):
    """vLLM v0's and Orca's scheduler is two families, one a manager: over contiguous extents its
    own (sim/core/compile/families.py)."""
    cfg = SimConfig.for_system(name, model="opt-13b", max_seq_len=512, **settings)
    assert cfg.family == family
    assert initial_state(cfg, rand_trace(0, n=4, max_len=64)).config[state.SCHEDULER_KIND] == family


@pytest.mark.parametrize("system, settings, words", [
    ("vllm", dict(manager="static"), "scheduler 'vllm' needs manager one of 'contiguous', 'paged', 'vattention'"),
    ("static", dict(manager="paged"), "scheduler 'static' needs manager 'static', got 'paged'"),
    ("static", dict(preemption="swap"), "static batching never preempts"),
    ("sglang", dict(prefix_caching=True), "radix tree, always"),
    ("vllm-v1", dict(max_num_batched_tokens=100, max_num_seqs=128),
     "max_num_batched_tokens=100 must be >= max_num_seqs=128"),
    # SGLang's own check (validation_hook.py:244): a chunk below a page was never scheduled
    ("sglang", dict(block_size=16, chunk_budget=8),
     "--chunk-budget 8 (its chunked_prefill_size) must be a multiple of --page-size 16"),
    ("sglang", dict(block_size=16, chunk_budget=40), "--chunk-budget 40"),
])
def test_what_a_scheduler_cannot_run_is_refused_in_its_registry_line(system, settings, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        SimConfig.for_system(system, **settings)


def test_a_chunk_of_whole_pages_runs_with_sglang():
    assert SimConfig.for_system("sglang", block_size=16, chunk_budget=32).chunk_budget == 32


def test_where_a_setting_applies_is_read_from_its_owner():
    cfg = SimConfig.for_system("orca-max")
    assert systems.applies(cfg, "reservation") and not systems.applies(cfg, "block_size")
    assert systems.applies(cfg, "max_num_seqs")  # named by nobody: applies everywhere
    # swap space: the schedulers that swap (a request of several sequences under recompute too)
    assert systems.applies(cfg, "swap_gib") and not systems.applies(SimConfig.for_system("vllm-v1"), "swap_gib")
    assert systems.where_it_applies("block_size") == "the paged manager (--system vllm, token, vllm-v1, sglang)"


def test_each_familys_own_files_are_its_schedulers_files():
    """The core caches each family apart by its scheduler files (sim/core/compile/families.py); the
    registry names the same files per scheduler."""
    from pagesim.sim.core.compile import families

    files: dict[int, set[str]] = {}
    for scheduler in systems.SCHEDULERS.values():
        for manager in scheduler.managers:  # the static scheduler's: "static"
            family = families.family_of(scheduler.core_kind, manager)
            files.setdefault(family, set()).update(f.strip() for f in scheduler.files.split(","))
    assert files == {kind: set(names) for kind, names in families.FAMILY_FILES.items()}


@pytest.mark.parametrize("name", sorted(systems.SCHEDULERS))
def test_what_a_family_does_is_what_the_registry_declares(name):
    """The core branches on a family's traits (sim/core/compile/families.py), the layers above on
    the registry's entry: each says the same of every family the scheduler runs as."""
    from pagesim.sim.core.compile import families

    entry = systems.SCHEDULERS[name]
    for manager in entry.managers:
        traits = families.TRAITS[families.family_of(entry.core_kind, manager)]

        def has(trait):
            return bool(traits & trait)

        assert has(families.EXTENTS) == (manager in ("contiguous", "static"))
        assert has(families.RADIX_TREE) == entry.radix_cache
        assert has(families.BLOCK_TABLE) == (manager not in ("contiguous", "static") and not entry.radix_cache)
        assert has(families.KV_GROUPS) == entry.kv_groups
        assert has(families.DISAGGREGATES) == entry.disaggregates
        assert has(families.HOST_COPIES) == entry.host_tier_pages
        assert has(families.HOST_LOADS) == ("kv_offload_gib" in entry.exclusive and not entry.host_tier_pages)
        assert has(families.SPECULATES) == ("num_speculative_tokens" in entry.exclusive)
        assert has(families.WHOLE_BATCHES) == (manager == "static")
