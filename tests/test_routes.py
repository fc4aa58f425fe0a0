"""The membership shard's columnar fan-out (`RouteTable`, `MembershipShard._on_signals`)
against the per-record loop it replaced: the same records, rseqs, ledgers and contexts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors import COMMUNITY, Config
from tidal_actors._clock import ManualClock
from tidal_actors._types import MembershipStatus
from tidal_actors.actors import membership_fanout
from tidal_actors.actors import messages as M
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.core.contrib_log import LogRecord
from tidal_actors.core.routes import COMMUNITY_ONLY, GATED, RouteTable
from tidal_actors.core.states import MembershipState
from tidal_actors.storage.format import ledger_shard_of


@dataclass
class _Ctx:
    config: Config
    clock: ManualClock = field(default_factory=lambda: ManualClock(0))
    durable: bool = False
    sent: list[tuple[M.Address, object]] = field(default_factory=list)

    def tell(self, address: M.Address, message: object) -> None:
        self.sent.append((address, message))


def test_route_table_by_hand() -> None:
    t = RouteTable(lambda c: {"a": 0, "b": 1, COMMUNITY: 1}[c])
    ab = t.route_of(("a", "b"))
    assert (t.route_of(()), t.route_of(("a", "b")), t.route_of(("b",))) == (
        COMMUNITY_ONLY,
        ab,
        ab + 1,
    )
    assert t.cohorts(GATED) == () and t.cohorts(ab) == ("a", "b", COMMUNITY)
    # signals routed: gated, (a, b, @community), @community alone, (b, @community)
    sig, entry = t.expand(np.array([GATED, ab, COMMUNITY_ONLY, ab + 1]))
    assert sig.tolist() == [1, 1, 1, 2, 3, 3]
    assert [t.names[c] for c in t.entry_cohort[entry]] == [
        "a",
        "b",
        COMMUNITY,
        COMMUNITY,
        "b",
        COMMUNITY,
    ]
    assert t.entry_ledger[entry].tolist() == [0, 1, 1, 1, 1, 1]
    sig, entry = t.expand(np.array([GATED, GATED], dtype=np.int64))
    assert len(sig) == len(entry) == 0


def _naive(
    state: MembershipState, left: set[int], index: int, shards: int, signals: list[tuple[Any, ...]]
) -> dict[int, tuple[list[LogRecord], dict[int, Any]]]:
    """The per-record loop: each forwarded signal to the user's cohorts (in assignment
    order), then @community; rseqs numbered in that order across ledgers."""
    out: dict[int, tuple[list[LogRecord], dict[int, Any]]] = {}
    r = state.next_rseq
    for u, e, t, w, ts, cx in signals:
        if u in left:
            continue
        for c in (*state.cohorts.get(u, ()), COMMUNITY):
            recs, ctxs = out.setdefault(ledger_shard_of(c, shards), ([], {}))
            if cx is not None:
                ctxs[len(recs)] = cx
            recs.append(LogRecord(index, r, u, c, e, t, w, ts))
            r += 1
    return out


users = st.integers(0, 12)
cohort_lists = st.lists(
    st.sampled_from(["red", "blue", "green", "x" * 40, "y"]), max_size=4, unique=True
)


@settings(max_examples=150, deadline=None)
@given(
    shards=st.integers(1, 4),
    cohorts=st.dictionaries(users, cohort_lists),
    left=st.sets(users),
    first_rseq=st.integers(0, 2**40),
    signals=st.lists(
        st.tuples(
            users,
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**64 - 1),
            st.floats(0, 1e6, width=32),
            st.integers(0, 2**63 - 1),
            st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.integers())),
        ),
        max_size=40,
    ),
    few=st.sampled_from([0, 10**6]),
)
def test_fan_out_equals_the_per_record_loop(
    shards, cohorts, left, first_rseq, signals, few
) -> None:  # type: ignore[no-untyped-def]
    """Both layouts (numpy's, and plain Python's for a few signals: ``few`` the
    threshold, 0 or above any batch here) give the loop's records, column types kept
    (numpy's dtypes; lists of Python ints and floats for a few signals)."""
    state = MembershipState()
    state.cohorts = {u: tuple(cs) for u, cs in cohorts.items() if cs}
    state.status = {u: (MembershipStatus.Left, 1) for u in left}
    state.next_rseq = first_rseq
    ctx = _Ctx(Config(ledger_shards=shards, membership_shards=3))
    shard = MembershipShard(ctx, 2, state)  # routes derived from the restored state
    expected = _naive(state, left, 2, shards, signals)
    was = membership_fanout.FEW_SIGNALS
    membership_fanout.FEW_SIGNALS = few
    try:
        shard.receive(M.SignalBatch(list(signals)))
    finally:
        membership_fanout.FEW_SIGNALS = was
    assert shard.handler_errors == 0
    got = {}
    for (kind, li), msg in ctx.sent:
        assert kind == M.LEDGER and isinstance(msg, M.Attribute) and li not in got
        got[li] = (msg.records, msg.contexts or {})
        ints = [msg.rseqs, msg.users, msg.entities, msg.types, msg.timestamps]
        if few:  # plain Python throughout
            assert all(type(c) is list for c in [*ints, msg.weights])
            assert {type(x) for c in ints for x in c} <= {int}
            assert {type(x) for x in msg.weights} <= {float}
        else:
            assert [c.dtype for c in ints] == [  # type: ignore[union-attr]
                np.int64,
                np.uint64,
                np.uint64,
                np.uint64,
                np.int64,
            ]
            assert msg.weights.dtype == np.float64  # type: ignore[union-attr]
    assert got == expected
    forwarded = sum(1 for s in signals if s[0] not in left)
    assert (shard.signals, shard.forwarded, shard.gated) == (
        len(signals),
        forwarded,
        len(signals) - forwarded,
    )
    assert state.next_rseq == first_rseq + sum(len(r) for r, _ in expected.values())


def test_routes_follow_assign_leave_and_rejoin() -> None:
    ctx = _Ctx(Config(ledger_shards=2, membership_shards=1))
    shard = MembershipShard(ctx, 0)
    shard._set_cohorts(7, ("a", "b"))
    shard.left.add(7)
    shard._update_route(7)
    shard.receive(M.SignalBatch([(7, 1, 1, 1.0, 5, None)]))
    assert ctx.sent == [] and shard.gated == 1
    shard.left.discard(7)
    shard._update_route(7)
    shard._set_cohorts(7, ("b",))
    shard.receive(M.SignalBatch([(7, 1, 1, 1.0, 5, None)]))
    recs = sorted(r for _, m in ctx.sent for r in m.records)  # type: ignore[attr-defined]
    assert [(r.rseq, r.cohort) for r in recs] == [(0, "b"), (1, COMMUNITY)]


def test_attribute_of_records_round_trips() -> None:
    recs = [
        LogRecord(1, 5, 2**64 - 1, "a", 3, 2**63, 0.5, 2**63 - 1),
        LogRecord(1, 6, 0, "b", 0, 0, 0.0, 0),
    ]
    assert M.Attribute.of_records(recs, {1: {"k": 1}}).records == recs


def test_route_table_is_rebuilt_when_most_routes_are_unused() -> None:
    ctx = _Ctx(Config(ledger_shards=2, membership_shards=1))
    shard = MembershipShard(ctx, 0)
    shard._set_cohorts(8, ("keep", "me"))
    for i in range(500):  # user 7 goes through 500 cohort lists, each used once
        shard._set_cohorts(7, (f"c{i}", "x"))
        assert len(shard.routes) <= 4 * 2 + 64 + 1
    shard.receive(
        M.SignalBatch([(7, 1, 1, 1.0, 5, None), (8, 1, 1, 1.0, 5, None), (9, 1, 1, 1.0, 5, None)])
    )
    recs = sorted(r for _, m in ctx.sent for r in m.records)  # type: ignore[attr-defined]
    assert [(r.user, r.cohort) for r in recs] == [
        (7, "c499"),
        (7, "x"),
        (7, COMMUNITY),
        (8, "keep"),
        (8, "me"),
        (8, COMMUNITY),
        (9, COMMUNITY),
    ]
    assert [r.rseq for r in recs] == list(range(7))
