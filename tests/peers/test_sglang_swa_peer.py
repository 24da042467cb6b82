"""SGLang 0.5.23's hybrid sliding-window pool and unified radix cache, on CPU: the rules
docs/notes/sglang-swa.md states, read off SGLang's own code through its worked example
(sglang_swa.py).

Skipped unless ``python -m tests.peers.fetch`` has put SGLang 0.5.23 in the cache folder and its
SWA allocator and unified radix cache import here (torch and msgspec are needed).
"""

from __future__ import annotations

import pytest

from tests.peers.importing import driver_or_skip

pytestmark = pytest.mark.peers
sglang_swa = driver_or_skip("0.5.23", "tests.peers.sglang_swa")


def run(**options) -> list[str]:
    lines: list[str] = []
    sglang_swa.worked_example(lines.append, **options)
    return lines


def after(lines: list[str], event: str) -> str:
    """The pools line printed after ``event``."""
    return lines[lines.index(event) + 1]


def test_the_radix_cache_frees_a_prompts_out_of_window_swa_at_its_checkpoint():
    lines = run()
    # chunk 1 of A (16 tokens): both pools lose 16, the SWA pool gets back tokens [0,7)
    assert "full free 24/40  swa free 23/32" in after(lines, "A prefilled tokens [0,16)")
    # chunk 2 frees none: [7,16) is the tree's, evictable, not the request's to free
    assert "full free 16/40  swa free 15/32  evictable full  0 swa  9" in after(
        lines, "A prefilled tokens [16,24)")
    # decode frees nothing before SGLANG_SWA_EVICTION_INTERVAL (128) tokens leave the window
    assert "swa free 12/32" in after(lines, "A decoded: token 26 has a slot")
    assert any(line.startswith("B admitted? True: hit 20 of 24") for line in lines)
    # C's prefix lost its last window's SWA to D's pressure: a miss despite 8 tokens of full KV
    assert any(line.startswith("C admitted? True: hit 0 of 24 (full KV matched 8)") for line in lines)
    assert all(len(line) <= 100 for line in lines)


def test_without_the_radix_cache_the_request_frees_its_own_swa():
    lines = run(radix=False, interval=4)
    # the second chunk frees [0,8) before it allocates (overlap scheduling off)
    assert "full free 16/40  swa free 16/32" in after(lines, "A prefilled tokens [16,24)")
    # the first decode step frees [8,16): 24 - 8 >= 8 + 4
    assert "full free 15/40  swa free 23/32" in after(lines, "A decoded: token 24 has a slot")
    assert "full free 40/40  swa free 32/32" in after(lines, "A finished")
