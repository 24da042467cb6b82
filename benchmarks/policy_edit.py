"""A scheduling policy is a plug-in (issue 83): editing one policy's file, or adding a new one
(its file and its line in ``sim.systems.SCHEDULING_POLICIES``), recompiles that policy's
entries alone. In a copy of this checkout with its own caches, each step a fresh process of
``pagesim simulate --system vllm-v1 --scheduling-policy P`` (200 ShareGPT requests), its CPU
seconds measured by ``wait4``:

1. warm: the first run of ``sjf`` (compiles vLLM v1's family, its extension module and sjf's
   entries), then the same run again (the baseline: nothing to compile);
2. an edit of ``policy_sjf.py``, then the sjf run (its entries recompiled);
3. a new policy, ``fpf`` (fewest preemptions first: sjf's file with its key the requests'
   preemptions), one file and one registry line, then its run (its entries compiled);
beside each, whether any family's compile key (``jit.sources_digest`` of the shared sources and
of every cache group) or the engine's extension module changed, and whether the run loaded the
module (``engine: core``). Target: each recompile <= 10 s of CPU, no key changed. Prints;
asserts nothing.

    python benchmarks/policy_edit.py
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from _measure import measured

ROOT = Path(__file__).resolve().parent.parent

KEYS = """
from pagesim.sim.core.compile import aot, jit
from pagesim.sim.core.events import loop
print(jit.sources_digest(), *(jit.sources_digest(group=g) for g in sorted(jit._GROUP_FILES)),
      *sorted(p.name for p in aot.cache_dir().glob("pagesim_core_*")))
"""


def cpu_of(argv: list[str], env: dict, cwd: Path) -> tuple[float, str]:
    """(CPU seconds of a fresh process, its standard output)."""
    run = measured(argv, env=env, cwd=cwd, keep_output=True)
    return run.cpu_s, run.out


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp, "pagesim")
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__", ".git", "site", "out", "*.egg-info",
                                                                  ".pytest_cache", ".hypothesis", "results"))
        env = dict(os.environ, PYTHONPATH=tmp, PAGESIM_AOT_WAIT="1")  # `import pagesim` is the copy
        env.pop("NUMBA_CACHE_DIR", None)  # the copy's own cache, in its sim/core/__pycache__

        def run(policy: str) -> tuple[float, str]:
            cpu, out = cpu_of([sys.executable, "-m", "pagesim.sim.cli", "simulate", "--workload", "sharegpt",
                               "--rate", "30", "--num-requests", "200", "--system", "vllm-v1", "--kv-gib", "2",
                               "--scheduling-policy", policy, "--no-progress", "--json"], env, copy)
            return cpu, json.loads(out.strip().splitlines()[-1])["engine"]

        def keys() -> str:
            return cpu_of([sys.executable, "-c", KEYS], env, copy)[1]

        first, _ = run("sjf")
        warm, engine = run("sjf")
        before = keys()
        print(f"first sjf run (vLLM v1's family, its module, sjf's entries compiled): {first:6.1f} s of CPU")
        print(f"the same run again (the baseline):                                  {warm:6.1f} s of CPU ({engine})")
        with open(copy / "sim/core/sched/policy_sjf.py", "a") as f:
            f.write("# an edit\n")
        edited, engine = run("sjf")
        same = keys() == before
        print(f"policy_sjf.py edited, its run:                                      {edited:6.1f} s of CPU ({engine}): "
              f"its recompile {edited - warm:.1f} s; every family's key and module {'unchanged' if same else 'CHANGED'}")
        sjf = (copy / "sim/core/sched/policy_sjf.py").read_text()
        (copy / "sim/core/sched/policy_fpf.py").write_text(
            sjf.replace('"""Shortest prompt first', '"""Fewest preemptions first (a benchmark\'s)')
               .replace("s.prompt_tokens", "s.num_preemptions"))
        systems = (copy / "sim/systems.py").read_text()
        line = '    "sjf": Policy("policy_sjf",'
        (copy / "sim/systems.py").write_text(systems.replace(
            line, '    "fpf": Policy("policy_fpf", "fewest preemptions first"),\n' + line))
        added, engine = run("fpf")
        same = keys() == before
        print(f"a new policy (one file, one registry line), its run:                {added:6.1f} s of CPU ({engine}): "
              f"its compile {added - warm:.1f} s; every family's key and module {'unchanged' if same else 'CHANGED'}")
    print("target (#83): a policy's edit or addition recompiles <= 10 s of CPU, no other family's compiled key changes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
