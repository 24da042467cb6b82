"""The memory a run's tables will take, checked before anything is allocated.

A run holds per-request tables (the trace, the request table, the step table, the output frames)
and the memory manager's per-unit tables (one entry per paged block or vAttention page, one per
static slot). A configuration whose tables cannot fit in this machine's memory is refused in one
line that says what is too large, instead of a MemoryError (or the kernel's OOM killer) after
minutes of work.

The per-unit sizes were measured (peak RSS, and tracemalloc of a fresh manager):

* :data:`BYTES_PER_REQUEST`: a 200,000-request ShareGPT run took 3.9 KiB per request above a
  1,000-request run's peak (step rows, request rows, trace and frames included);
* :data:`BYTES_PER_BLOCK`: a paged manager of 2M blocks took 64 bytes per block (three int64
  arrays and the free list), and the core adds its int32 free-block stack;
* :data:`BYTES_PER_STATIC_SLOT`: a static manager of 1M slots took 40 bytes per slot.

The contiguous manager keeps one entry per sequence, not per slot, so its pool size costs nothing.
"""

from __future__ import annotations

import os

from pagesim.sim.errors import ConfigError
from pagesim.sim.specs.capacity import vattention_page_tokens

BYTES_PER_REQUEST = 4096
BYTES_PER_BLOCK = 68
BYTES_PER_STATIC_SLOT = 40


def physical_memory_bytes() -> int:
    """This machine's physical memory (a large stand-in where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover (not POSIX)
        return 1 << 40


def _gib(n: float) -> str:
    return f"{n / (1 << 30):,.1f} GiB" if n < 1 << 40 else f"{n / (1 << 40):,.3g} TiB"


def check_fits_in_memory(need_bytes: float, what: str, advice: str) -> None:
    """Refuse (ConfigError) when ``need_bytes`` exceed this machine's memory; ``what`` says which
    tables and why they are that large, ``advice`` which setting to change."""
    have = physical_memory_bytes()
    if need_bytes > have:
        raise ConfigError(f"{what} would need about {_gib(need_bytes)} of memory, more than this machine's "
                          f"{_gib(have)}: {advice}")


def check_synthetic_workload(rate: float, duration_s: float | None, num_requests: int | None, *,
                             what: str = "the workload",
                             advice: str = "use a lower --rate, a shorter --duration or fewer --num-requests") -> None:
    """Refuse a synthetic workload of ``rate`` req/s for ``duration_s`` (or ``num_requests``, the
    fewer when both are given) whose request tables do not fit in memory; ``what`` names the
    workload and ``advice`` which settings to change."""
    count, how = float("inf"), ""
    if duration_s is not None:
        count, how = rate * duration_s, f"{rate:g} req/s for {duration_s:g} s"
    if num_requests is not None and num_requests < count:
        count, how = num_requests, f"{num_requests} requests"
    check_fits_in_memory(count * BYTES_PER_REQUEST, f"{what} ({how}) means {count:.3g} requests, whose tables",
                         advice)


def check_pool(cfg, model, capacity_tokens: int, how: str) -> None:
    """Refuse a KV pool whose manager tables (see the module doc) do not fit in memory; ``cfg`` is
    the run's SimConfig, ``model`` its ModelSpec, ``how`` names what sized the pool."""
    if cfg.manager == "paged":
        units, name, per_unit = capacity_tokens // cfg.block_size, f"blocks of {cfg.block_size}", BYTES_PER_BLOCK
    elif cfg.manager == "vattention":
        page = vattention_page_tokens(model, cfg.vattention_page_kib * 1024, cfg.tensor_parallel)
        units, name, per_unit = capacity_tokens // page, f"pages of {page} tokens", BYTES_PER_BLOCK
    elif cfg.manager == "static":
        units, name, per_unit = capacity_tokens // model.max_seq_len, "static slots", BYTES_PER_STATIC_SLOT
    else:
        return
    check_fits_in_memory(units * per_unit, f"a KV pool of {capacity_tokens:.3g} tokens ({how}) in {units:.3g} "
                         f"{name}, whose tables", "use a smaller --kv-gib")
