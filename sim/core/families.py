"""The scheduler families: vLLM v0 and Orca, static batching, vLLM v1, SGLang. Each has a loop of
its own (``loop.loop_for``), and each family's loops are cached apart (``jit.py``), keyed by
the shared sources and the files only that family compiles: its scheduler's, which no other core
file imports (``tests/sim/core/test_jit_cache.py`` checks), so that an edit of them recompiles
their family alone."""

from __future__ import annotations

from pagesim.sim.core.state import CONTINUOUS, SGLANG, STATIC, V1

#: each family's name (its loops' cache folder, its extension module's name, ``loop.run_<name>``)
FAMILIES = {CONTINUOUS: "continuous", STATIC: "static", V1: "v1", SGLANG: "sglang"}
#: the files only one family's loops compile (the registry names the same per scheduler,
#: ``sim/systems.py``: tests/sim/test_systems.py checks)
FAMILY_FILES = {CONTINUOUS: ("scheduler_vllm.py", "scheduler_orca.py"), STATIC: ("static.py",),
                V1: ("scheduler_v1.py",), SGLANG: ("scheduler_sglang.py",)}
