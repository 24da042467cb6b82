"""A setting given where it does nothing is refused (a flag) or warned about (a --config file's
leftover): the registry (``sim/systems.py``) states once where each applies. Each "does nothing"
is checked here by running the simulation with two values of the setting where it does not
apply: the records are the same. A stale entry (a setting that came to matter there) fails this
test. A scheduler's exclusive settings are refused elsewhere from Python too (checked below)."""

from __future__ import annotations

import pytest

from pagesim.sim import systems
from pagesim.sim.cli import main
from pagesim.sim.config import SimConfig
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import run_simulation
from pagesim.traces.synth import make_workload

#: per setting: configurations where it does not apply, with two values to run each with
CASES = [
    ("block_size", "orca-oracle", {}, (8, 64)), ("block_size", "static", {}, (8, 64)),
    ("block_size", "vattention", {}, (8, 64)),
    ("reservation", "vllm", {}, ("max", "oracle")), ("reservation", "static", {}, ("max", "oracle")),
    ("placement", "vllm-v1", {}, ("buddy", "first-fit")),
    ("predictor_error", "orca-max", {}, (0.1, 0.6)),
    ("prefix_caching", "orca-oracle", {}, (False, True)), ("prefix_caching", "vattention", {}, (False, True)),
    ("static_batch_size", "vllm", {}, (2, 8)),
    ("vattention_page_kib", "vllm", {}, (64, 2048)),
    ("swap_gib", "vllm-v1", {}, (0.05, 8.0)),
    ("chunked_prefill", "vllm-v1", {"chunk_budget": 256}, (False, True)),
    ("chunked_prefill", "static", {"chunk_budget": 256}, (False, True)),
    ("chunk_budget", "vllm", {}, (256, 1024)), ("chunk_budget", "vllm-v1", {"chunked_prefill": True}, (256, 1024)),
    ("schedule_policy", "vllm", {}, ("fcfs", "lpm")),
    ("schedule_conservativeness", "vllm-v1", {}, (0.3, 2.0)), ("ignore_eos", "vllm", {}, (False, True)),
    # speculative decoding's settings without drafts (num_speculative_tokens 0)
    ("speculative_method", "vllm-v1", {}, ("ngram", "eagle")),
    ("spec_acceptance_rate", "vllm-v1", {}, (0.1, 0.9)),
    ("draft_model", "vllm-v1", {"speculative_method": "draft-model"}, ("llama-2-7b", "opt-125m")),
]
KEYS = ("completed", "duration_s", "mean_ttft_ms", "mean_tpot_ms", "mem_token_states", "mem_external_frag",
        "num_preemptions")


@pytest.fixture(scope="module")
def trace():
    return make_workload("sharegpt", rate=16.0, duration_s=30, seed=1)  # preempts in a 2 GiB pool


#: a scheduler's exclusive settings, each with a value another scheduler refuses
EXCLUSIVE = [("async_scheduling", "vllm", True), ("client_timeout_s", "sglang", 5.0),
             ("scheduling_policy", "orca-max", "priority"), ("num_speculative_tokens", "vllm", 3),
             ("kv_offload_gib", "vllm", 8.0),  # (vllm-v1's and sglang's host tiers)
             ("expert_parallel", "sglang", True)]


#: settings whose value where they do nothing cannot even be given: refused by the configuration
#: itself (a rate per draft position, with no drafts)
REFUSED = [("spec_acceptance_rates", "vllm-v1", "0.5", "takes 0 comma-separated rates")]


def test_every_setting_the_registry_places_is_checked_here():
    checked = {name for name, *_ in CASES} | {name for name, *_ in EXCLUSIVE} | {name for name, *_ in REFUSED}
    assert checked == set(systems.placed_settings())


@pytest.mark.parametrize("name, system, value, why", REFUSED)
def test_a_setting_that_cannot_apply_is_refused_by_the_configuration(name, system, value, why):
    assert not systems.applies(SimConfig.for_system(system), name)
    with pytest.raises(ConfigError, match=why):
        SimConfig.for_system(system, **{name: value})


@pytest.mark.parametrize("name, system, value", EXCLUSIVE)
def test_an_exclusive_setting_is_refused_elsewhere_from_python(name, system, value):
    assert not systems.applies(SimConfig.for_system(system), name)
    with pytest.raises(ConfigError, match=f"{name}=.* applies to the vllm-v1( or sglang)? scheduler .* alone; "
                                          f"scheduler '{SimConfig.for_system(system).scheduler}' has none"):
        SimConfig.for_system(system, **{name: value})
    SimConfig.for_system("vllm-v1", **{name: value})  # where it applies, taken


@pytest.mark.parametrize("name, system, extra, values", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_setting_does_nothing_where_the_table_says_so(trace, name, system, extra, values):
    configs = [SimConfig.for_system(system, kv_gib=2, max_seq_len=2048, **extra, **{name: v}) for v in values]
    assert not any(systems.applies(cfg, name) for cfg in configs)
    first, second = ([run_simulation(cfg, trace).summary[k] for k in KEYS] for cfg in configs)
    assert first == second


def test_where_it_applies_it_changes_the_run(trace):
    # the other side of the same rule, once: block size on vllm, swap space under swap preemption
    for name, system, extra, values in [("block_size", "vllm", {}, (8, 64)),
                                        ("swap_gib", "vllm", {"preemption": "swap"}, (0.05, 8.0))]:
        configs = [SimConfig.for_system(system, kv_gib=2, max_seq_len=2048, **extra, **{name: v}) for v in values]
        assert all(systems.applies(cfg, name) for cfg in configs)
        first, second = ([run_simulation(cfg, trace).summary[k] for k in KEYS] for cfg in configs)
        assert first != second, name


def test_a_flag_that_does_nothing_is_refused_in_one_line(capsys):
    argv = ["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "10", "--no-progress"]
    assert main([*argv, "--system", "vllm", "--schedule-policy", "lpm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("pagesim: error: --schedule-policy does nothing for system 'vllm' (manager paged, scheduler "
                   "vllm): it applies to the sglang scheduler (--system sglang); drop it")
    assert main([*argv, "--system", "sglang", "--schedule-policy", "lpm"]) == 0
    assert main([*argv, "--system", "vllm", "--preemption", "swap", "--swap-gib", "8"]) == 0
