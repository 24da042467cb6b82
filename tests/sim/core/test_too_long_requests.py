"""A request longer than max_seq_len (prompt + output; a DataFrame handed to run_simulation
skips the trace loaders' max-len policy) can never be served by any manager: it is rejected
with a reason naming max_seq_len, and the request behind it is served."""

from __future__ import annotations

import pytest

from pagesim.sim.run import run_simulation
from tests.sim.helpers import cfg_for


@pytest.mark.parametrize("system", ["static", "orca-pow2", "orca-oracle", "vllm", "token", "vattention"])
def test_a_request_longer_than_max_seq_len_is_rejected_with_its_reason(tiny_trace, system):
    # 64 slots; r0: 4 + 13 = 17 > 16 tokens; r1: 4 + 2 = 6
    cfg = cfg_for(system, slots=64, max_seq_len=16, **({"vattention_page_kib": 64} if system == "vattention" else {}))
    result = run_simulation(cfg, tiny_trace((0.0, 4, 13), (0.0, 4, 2)))
    requests = result.requests
    assert requests["status"].tolist() == ["rejected", "finished"]
    assert "max_seq_len" in requests["reject_reason"][0]
    assert result.summary["unfinished"] == 0
