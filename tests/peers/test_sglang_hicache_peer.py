"""SGLang 0.5.23's hierarchical cache (GPU and host tiers), on CPU: the rules
docs/notes/sglang-hicache.md states, read off SGLang's own code through its worked example
(sglang_hicache.py).

Skipped unless ``python -m tests.peers.fetch`` has put SGLang 0.5.23 in the cache folder and its
unified radix cache imports here (torch and msgspec are needed).
"""

from __future__ import annotations

import pytest

from tests.peers.importing import driver_or_skip

pytestmark = pytest.mark.peers
sglang_hicache = driver_or_skip("0.5.23", "tests.peers.sglang_hicache")


def run(**options) -> list[str]:
    lines: list[str] = []
    sglang_hicache.worked_example(lines.append, **options)
    return lines


def after(lines: list[str], event: str, skip: int = 1) -> list[str]:
    """The lines printed after the ``skip``-th ``event``, up to the next event."""
    start = -1
    for _ in range(skip):
        start = lines.index(event, start + 1)
    end = next((k for k in range(start + 1, len(lines)) if not lines[k].startswith(" ")), len(lines))
    return lines[start + 1:end]


def test_write_through_backs_up_at_insert_and_eviction_keeps_the_host_copy():
    lines = run()
    # the default host pool: ratio 2 of 24 device slots, plus SGLang's padding page
    assert lines[0] == "page 1, device 24 slots, --hicache-ratio 2.0: host 49 slots, write_through"
    # A's release writes its new leaves to the host at once; they stay locked until the ack
    finished = after(lines, "A finished")
    assert "host free 32/49  evictable  0  protected 17" in finished[0]
    assert finished[1].endswith("lock 1 hits 1 writing")
    acked = after(lines, "check_hicache_events: writes and loads acknowledged")
    assert "evictable 17  protected  0  written 17" in acked[0]
    # D's allocation evicts A's nodes from the GPU; their host copies stay (host only)
    assert after(lines, "D prefilled tokens [0,16)")[1] == (
        "    [0,16) ids 1..104: host only, host 0-15, lock 0 hits 1")
    # B: a 12-token host hit (the host node split at 12), loaded back at admission
    assert "B matched: GPU 0, host 12 of 16; init_load_back loaded 12 (load submitted: True)" in lines
    assert after(lines, "B matched: GPU 0, host 12 of 16; init_load_back loaded 12"
                        " (load submitted: True)")[1].startswith("    [0,12) ids 1..12: GPU+host")
    # C: an 8-token host hit is under load_back_threshold (10): not loaded, recomputed
    assert "C matched: GPU 0, host 8 of 12; init_load_back loaded 0 (load submitted: False)" in lines
    # E's write-through needs host room: whole host leaves go, least recently used first
    assert not any("ids 1..12" in line for line in after(lines, "E finished"))
    assert all(len(line) <= 100 for line in lines)


def test_write_back_writes_at_eviction_and_selective_waits_for_a_second_hit():
    back = run(policy="write_back")
    assert "written 0" in after(back, "A finished")[0]
    assert after(back, "D prefilled tokens [0,16)")[1].endswith("host only, host 1-16, lock 0 hits 0")
    selective = run(policy="write_through_selective")
    # one hit: no backup, so GPU eviction deletes the node and B finds nothing
    assert "B matched: GPU 0, host 0 of 16" in selective
    assert "host free 49/49" in after(selective, "E finished")[0]
