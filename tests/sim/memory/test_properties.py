"""Property tests: random allocate / append / append_batch / fork / free sequences, every manager.

After every operation: ``check()`` (no slot owned twice, refcounts == table references and >= 0,
free + used == total, incremental counters == recomputed), the six categories sum to capacity;
``blocks_needed_for_append_batch`` is exactly what ``append_batch`` consumes; freeing everything
restores a fresh manager's usage.
"""

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagesim.sim.memory import (Admit, ContiguousManager, PagedManager, SeqSpec, StaticManager, TokenManager,
                        VAttentionManager)

MSL = 24
MAKERS = {
    "static": lambda: StaticManager(100, MSL),
    "orca-max-buddy": lambda: ContiguousManager(100, MSL, "max", "buddy"),
    "orca-pow2-buddy": lambda: ContiguousManager(100, MSL, "pow2", "buddy"),
    "orca-oracle-ff": lambda: ContiguousManager(100, MSL, "oracle", "first-fit"),
    "orca-pred-bf": lambda: ContiguousManager(100, MSL, "predicted", "best-fit", predictor_error=0.6),
    "orca-pred-buddy": lambda: ContiguousManager(100, MSL, "predicted", "buddy", predictor_error=0.6),
    "paged4": lambda: PagedManager(100, MSL, block_size=4, watermark=0.05),
    "paged4-prefix": lambda: PagedManager(64, MSL, block_size=4, watermark=0, prefix_caching=True),
    "paged3-prefix": lambda: PagedManager(64, MSL, block_size=3, watermark=0, prefix_caching=True),
    "token-prefix": lambda: TokenManager(40, MSL, watermark=0, prefix_caching=True),
    "vattention": lambda: VAttentionManager(100, MSL, page_tokens=5, watermark=0),
}

op = st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, MSL), st.integers(0, MSL), st.lists(st.sampled_from("abc"), max_size=6)),
    st.tuples(st.just("append"), st.integers(0, 50), st.integers(1, 6)),
    st.tuples(st.just("batch"), st.lists(st.integers(0, 50), max_size=8)),
    st.tuples(st.just("fork"), st.integers(0, 50), st.integers(-3, 6)),
    st.tuples(st.just("free"), st.integers(0, 50)),
)


def canonical(snap):
    """A block-table snapshot with physical ids renamed by first appearance (layout up to renaming)."""
    names: dict[int, int] = {}
    tables = {s: [names.setdefault(b, len(names)) for b in t] for s, t in sorted(snap.tables.items())}
    return tables, snap.context_lens, {names[b]: r for b, r in snap.refcounts.items()}


def run(m, ops, mirror=None, exact=True):
    """Apply ``ops`` to ``m`` (and identically to ``mirror``), checking invariants after each."""
    live: list[int] = []
    nxt = 0
    final: dict[int, int] = {}

    def both(f):
        r = f(m)
        if mirror is not None:
            assert f(mirror) == r
        return r

    for o in ops:
        kind = o[0]
        if kind == "alloc":
            P = o[1]
            F = min(MSL, P + o[2])
            spec = SeqSpec(nxt, P, F, prefix_hashes=tuple(o[3]) or None, hash_block_tokens=4)
            if both(lambda x: x.can_allocate(spec)) is Admit.OK:
                cached = both(lambda x: x.allocate(spec))
                assert 0 <= cached < P
                live.append(nxt)
                final[nxt] = F
                nxt += 1
        elif live and kind == "append":
            s = live[o[1] % len(live)]
            n = min(o[2], MSL - m.num_tokens(s))
            if n > 0 and both(lambda x: x.can_append(s, n)):
                L = m.num_tokens(s)
                both(lambda x: x.append(s, n))
                assert m.num_tokens(s) == L + n
        elif live and kind == "batch":
            ids = sorted({live[i % len(live)] for i in o[1]})
            ids = [s for s in ids if m.num_tokens(s) < MSL]
            if both(lambda x: x.can_append_batch(ids)):
                before = [m.num_tokens(s) for s in ids]
                if isinstance(m, PagedManager):
                    need = m.blocks_needed_for_append_batch(ids)
                    free = m.num_free_blocks()
                both(lambda x: x.append_batch(np.asarray(ids)))
                assert [m.num_tokens(s) for s in ids] == [b + 1 for b in before]
                if isinstance(m, PagedManager):
                    assert free - m.num_free_blocks() == need
        elif live and kind == "fork":
            p = live[o[1] % len(live)]
            L = m.num_tokens(p)
            Fc = None if o[2] < 0 else min(MSL, max(L, final[p] + o[2] - 3))
            if both(lambda x: x.can_fork(p, Fc)):
                cow = m.stats().get("cow_copies", 0)
                both(lambda x: x.fork(p, nxt, Fc))
                assert m.num_tokens(nxt) == L and m.stats().get("cow_copies", 0) == cow
                live.append(nxt)
                final[nxt] = final[p] if Fc is None else Fc
                nxt += 1
        elif live and kind == "free":
            s = live.pop(o[1] % len(live))
            both(lambda x: x.free(s))
        m.check()
        for dw in (False, True):
            u = m.usage(dw)
            assert u.total == m.capacity and min(u.as_tuple()) >= 0
            if mirror is not None:
                assert mirror.usage(dw) == u
        if mirror is not None:
            if exact:
                assert mirror.export() == m.export()
            else:
                assert canonical(mirror.export()) == canonical(m.export())
    for s in live:
        both(lambda x: x.free(s))
    m.check()
    return m


SETTINGS = settings(max_examples=int(os.environ.get("PAGESIM_HYPOTHESIS_EXAMPLES", 40)), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_test(name):
    @SETTINGS
    @given(st.lists(op, max_size=40))
    def test(ops):
        m = run(MAKERS[name](), ops)
        fresh = MAKERS[name]()
        assert m.usage() == fresh.usage() and m.usage(True) == fresh.usage(True)
        if isinstance(m, PagedManager):
            assert m.num_free_blocks() == m.num_blocks and not m.export().tables
        else:
            assert not m.export().extents

    test.__name__ = f"test_random_ops_{name}"
    return test


for _name in MAKERS:
    globals()[f"test_random_ops_{_name.replace('-', '_')}"] = make_test(_name)


@SETTINGS
@given(st.lists(op, max_size=40))
def test_token_manager_equals_paged_block1(ops):
    run(TokenManager(40, MSL, watermark=0.05, prefix_caching=True),
        ops, mirror=PagedManager(40, MSL, block_size=1, watermark=0.05, prefix_caching=True))


@SETTINGS
@given(st.lists(op, max_size=40))
def test_batch_equals_per_sequence_appends(ops):
    """append_batch's vectorized paths leave the state a per-sequence loop leaves (up to block ids:
    the batch serves boundary crossings before copy-on-write ones, so physical ids may differ)."""

    class Looping(PagedManager):
        def append_batch(self, seq_ids):
            for s in seq_ids:
                self.append(int(s), 1)

    run(PagedManager(64, MSL, block_size=2, watermark=0, prefix_caching=True), ops,
        mirror=Looping(64, MSL, block_size=2, watermark=0, prefix_caching=True), exact=False)


@SETTINGS
@given(st.integers(1, 20), st.integers(0, 20), st.integers(1, 5), st.lists(st.integers(0, 5), max_size=12))
def test_cow_exactly_once_per_write_to_shared_block(P, out, forks, writers):
    m = PagedManager(400, 64, block_size=4, watermark=0)
    m.allocate(SeqSpec(0, P, P + out + 20))
    m.append(0, P)
    for c in range(1, forks + 1):
        m.fork(0, c)
    for w in writers:
        s = w % (forks + 1)
        tbl = m.block_table(s)
        i = m.num_tokens(s) // 4
        shared = i < len(tbl) and m.export().refcounts[tbl[i]] > 1
        before = m.stats()["cow_copies"]
        m.append(s, 1)
        assert m.stats()["cow_copies"] - before == (1 if shared else 0)
        m.check()
