"""docs/design.md's "How to add a scheduling policy", carried out in a copy of the checkout: a
new policy (fewest preemptions first) as one file and one registry line runs, ordered as its
key says (``--check`` verifies the waiting queue after every step), and leaves every family's
compile key as it was (jit.sources_digest of the shared sources and of every cache group)."""

from __future__ import annotations

import json

from tests.sim.helpers import checkout_copy

KEYS = """
from pagesim.sim.core.compile import jit
print(jit.sources_digest(), *(jit.sources_digest(group=g) for g in sorted(jit._GROUP_FILES)))
"""


def test_a_new_policy_is_one_file_and_one_registry_line(tmp_path):
    copy, python = checkout_copy(tmp_path)
    before = python("-c", KEYS)
    # 1. the policy's file: sjf's, its key the requests' preemptions
    sjf = (copy / "sim/core/sched/policy_sjf.py").read_text()
    (copy / "sim/core/sched/policy_fpf.py").write_text(sjf.replace("s.prompt_tokens", "s.num_preemptions"))
    # 2. its registry line
    systems = (copy / "sim/systems.py").read_text()
    line = '    "sjf": Policy("policy_sjf",'
    assert line in systems
    (copy / "sim/systems.py").write_text(systems.replace(
        line, '    "fpf": Policy("policy_fpf", "fewest preemptions first"),\n' + line))
    out = python("-m", "pagesim.sim.cli", "simulate", "--workload", "sharegpt", "--rate", "40", "--num-requests",
                 "60", "--system", "vllm-v1", "--kv-gib", "2", "--scheduling-policy", "fpf", "--check",
                 "--no-progress", "--json")
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["completed"] == 60 and summary["num_preemptions"] > 0  # its victims rejoin by their key
    assert "fpf (fewest preemptions first)" in python("-m", "pagesim.sim.cli", "simulate", "--help")
    assert python("-c", KEYS) == before
