"""Which peer engines a run requires, and how much of the peers' suite it runs.

``PAGESIM_PEERS_REQUIRED``: ``1`` (every engine) or a comma-separated list of the engines
(``vllm``, ``sglang``, ``nano-vllm``: the cache folder's names, ``fetch.py``, less the version)
whose peer tests fail, rather than skip, where the engine is not fetched or its code does not
import (torch, msgspec missing; a module the driver's stubs do not cover). Unset, every peer
test skips without its engine, so that README's test command passes on a machine that never
fetched them. ``.ci/run`` sets it: a harness that breaks fails CI.

``PAGESIM_PEERS_FULL=1``: the full suite, the workloads at the sizes README's tables state
(the Mooncake trace's first ``compare.py`` requests, the drawn seeds ``compare`` counts), where
the default is a fixed sample of each (every engine and feature, within CI's time).
"""

from __future__ import annotations

import os


def full() -> bool:
    return os.environ.get("PAGESIM_PEERS_FULL", "") not in ("", "0")


def engine(folder_name: str) -> str:
    """The engine a cache folder holds: ``vllm-0.33.0`` -> ``vllm``, ``nano-vllm-bb823b3`` -> ``nano-vllm``."""
    return folder_name.rsplit("-", 1)[0]


def required(folder_name: str) -> bool:
    """Whether a missing peer in cache folder ``folder_name`` is a failure (module docstring)."""
    setting = os.environ.get("PAGESIM_PEERS_REQUIRED", "").strip()
    if setting in ("", "0"):
        return False
    return setting == "1" or engine(folder_name) in {name.strip() for name in setting.split(",")}


def sample(ci, whole):
    """``ci`` (the default's fixed sample) or, under ``PAGESIM_PEERS_FULL``, ``whole``."""
    return whole if full() else ci


def cases(names, known: dict) -> list:
    """One pytest parameter per workload in ``names``; one in ``known`` (workload -> why it
    diverges, citing the engine's lines) a strict xfail, so that its mending is seen."""
    import pytest

    return [pytest.param(name, id=name, marks=[pytest.mark.xfail(strict=True, raises=AssertionError,
                                                                 reason=known[name])] if name in known else [])
            for name in names]
