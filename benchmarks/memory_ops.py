"""Operations per second of every KV-cache manager (informational; nothing is asserted).

    python benchmarks/memory_ops.py [--seqs 256] [--steps 400] [--churn 20000]

churn   allocate (prompt) + prefill append + free of random requests, ops = allocate+free pairs / s
decode  one token for each of ``--seqs`` sequences per step: ``append_batch`` (vectorized) vs a
        per-sequence ``append`` loop on an identical manager, measured in the same run; ratio printed
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pagesim.sim.memory import (Admit, ContiguousManager, PagedManager, SeqSpec, StaticManager, TokenManager,
                        VAttentionManager)

MSL = 2048


def makers(capacity: int):
    return {
        "static": lambda: StaticManager(capacity, MSL),
        "orca-max/buddy": lambda: ContiguousManager(capacity, MSL, "max", "buddy"),
        "orca-pow2/buddy": lambda: ContiguousManager(capacity, MSL, "pow2", "buddy"),
        "orca-oracle/first-fit": lambda: ContiguousManager(capacity, MSL, "oracle", "first-fit"),
        "paged/16": lambda: PagedManager(capacity, MSL, 16),
        "paged/16+prefix": lambda: PagedManager(capacity, MSL, 16, prefix_caching=True),
        "token": lambda: TokenManager(capacity, MSL),
        "vattention/102": lambda: VAttentionManager(capacity, MSL, 102),
    }


def churn(make, n: int, rng: np.random.Generator) -> float:
    m = make()
    P = rng.integers(1, 1024, n)
    O = rng.integers(1, 1024, n)
    live: list[int] = []
    t = time.perf_counter()
    done = 0
    for i in range(n):
        spec = SeqSpec(i, int(P[i]), int(P[i] + O[i]))
        while m.can_allocate(spec) is not Admit.OK:
            m.free(live.pop(0))
            done += 1
        m.allocate(spec)
        m.append(i, spec.prompt_len)
        live.append(i)
    for s in live:
        m.free(s)
    done += len(live)
    return (n + done) / 2 / (time.perf_counter() - t)


def decode(make, seqs: int, steps: int, batch: bool) -> float:
    m = make()
    for s in range(seqs):
        m.allocate(SeqSpec(s, 100, 100 + steps + 1))
        m.append(s, 100)
    ids = np.arange(seqs)
    lst = ids.tolist()
    t = time.perf_counter()
    for _ in range(steps):
        if batch:
            assert m.can_append_batch(ids)
            m.append_batch(ids)
        else:
            for s in lst:
                assert m.can_append(s, 1)
                m.append(s, 1)
    dt = time.perf_counter() - t
    m.check()
    return seqs * steps / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--churn", type=int, default=5000)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    cap_decode = a.seqs * MSL  # static needs a full slot per sequence
    print(f"{'manager':24s} {'churn alloc+free/s':>18s} {'decode tok/s batch':>19s} "
          f"{'tok/s loop':>11s} {'ratio':>6s}")
    for name, make in makers(cap_decode).items():
        c = churn(makers(15728 * 4)[name], a.churn, rng)
        b = decode(make, a.seqs, a.steps, True)
        lp = decode(make, a.seqs, a.steps, False)
        print(f"{name:24s} {c:18,.0f} {b:19,.0f} {lp:11,.0f} {b / lp:6.1f}x")


if __name__ == "__main__":
    main()
