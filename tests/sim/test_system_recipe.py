"""docs/design.md's "How to add a system", carried out in a copy of the checkout: a new system
(vLLM v1 without async scheduling) as one registry line runs as its scheduler and manager with
its presets (the same records as ``--system vllm-v1 --no-async-scheduling``), is listed by
``--help``, and leaves every family's compile key as it was."""

from __future__ import annotations

import json

from tests.sim.core.test_policy_recipe import KEYS
from tests.sim.helpers import checkout_copy


def test_a_new_system_is_one_registry_line(tmp_path):
    copy, python = checkout_copy(tmp_path)
    before = python("-c", KEYS)
    systems = (copy / "sim/systems.py").read_text()
    line = '    # SGLang: page_size 1 (server_args.py)'
    assert line in systems
    (copy / "sim/systems.py").write_text(systems.replace(line, (
        '    System("vllm-v1-sync", "paged", "vllm-v1", dict(block_size=16, prefix_caching=True, watermark=0.0,\n'
        '           async_scheduling=False), "paged, block 16, prefix caching on", "on demand, chunk by chunk"),\n')
        + line))

    def simulate(*flags: str) -> tuple[dict, str]:
        out = tmp_path / "out" / "-".join(flags)
        summary = python("-m", "pagesim.sim.cli", "simulate", "--workload", "sharegpt", "--rate", "40",
                         "--num-requests", "60", "--kv-gib", "2", "--no-progress", "--json", "--out", str(out),
                         *flags)
        return json.loads(summary.strip().splitlines()[-1]), (out / "requests.csv").read_text()

    new, new_requests = simulate("--system", "vllm-v1-sync")
    old, old_requests = simulate("--system", "vllm-v1", "--no-async-scheduling")
    assert new["completed"] == 60
    assert new_requests == old_requests  # its presets, run by vLLM v1's scheduler over paged memory
    asynchronous, asynchronous_requests = simulate("--system", "vllm-v1")
    assert asynchronous_requests != new_requests  # (the preset is not vLLM v1's default)
    assert "vllm-v1-sync" in python("-m", "pagesim.sim.cli", "simulate", "--help")
    assert python("-c", KEYS) == before
