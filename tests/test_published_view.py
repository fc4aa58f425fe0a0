"""The published view (`core.published`, built by `core.publisher`): every answer it
gives equals, bit for bit, the shard's own read (`Aggregates`) on the state it was
published from, after adds, retractions and dropped keys, also once later
publications reused retired views' buffers; a view a reader still holds is never
written; a read it cannot answer that way says so (None) instead of answering."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.key_state import DEAD
from tidal_actors.core.published import PublishedView
from tidal_actors.core.publisher import Publisher

WIDTH = 1000
HALF = {1: 500, 2: 50_000, 3: 7}  # type 3 renormalizes often
COHORTS = ["a", "b", "@community"]
TOPS = (1, 3, 10, 100)


def _agg() -> Aggregates:
    return Aggregates(HALF.__getitem__, WIDTH, 4)


def _add(a: Aggregates, raw: list[tuple[str, int, int, float, int]], rseq0: int) -> range:
    recs = [(0, rseq0 + i, 100 + e, c, e, t, w, ts) for i, (c, e, t, w, ts) in enumerate(raw)]
    return a.add_many(recs)


def _keys_of(a: Aggregates, rows: range) -> np.ndarray:
    dk = a.view("row_key")
    ks = dk[rows.start - a.row_base : rows.stop - a.row_base].astype(np.int64)
    del dk
    return np.unique(ks)


def _retract(a: Aggregates, pub: Publisher, rows: list[int]) -> PublishedView:
    dk = a.view("row_key")
    ks = np.unique(dk[np.array(rows, dtype=np.int64) - a.row_base]).astype(np.int64)
    del dk
    a.retract_rows(rows)
    return pub.publish(ks[ks != DEAD])


def _truth(a: Aggregates, entities: int, times: list[int]) -> dict[tuple[Any, ...], Any]:
    """The shard's own answer to every read (computed by `Aggregates`)."""
    out: dict[tuple[Any, ...], Any] = {}
    for at in times:
        for c in COHORTS:
            for t in HALF:
                for e in range(entities):
                    out["score", c, e, t, at] = a.decay_score(c, e, t, at)
                    out["window", c, e, t, at] = a.window(c, e, t, at)
                for k in TOPS:
                    out["top", c, t, k, at] = a.top(c, t, k, at)
    return out


def _check(v: PublishedView, truth: dict[tuple[Any, ...], Any]) -> tuple[int, int]:
    """Every answer of ``v`` equals ``truth``'s or is None; returns how many reads
    it answered and how many it left to the shard."""
    answered = deferred = 0
    for key, want in truth.items():
        got = getattr(v, key[0])(*key[1:])
        if got is None:
            deferred += 1
        else:
            answered += 1
            assert got == want, (key, got, want)
    return answered, deferred


records = st.lists(
    st.tuples(
        st.sampled_from(COHORTS),
        st.integers(0, 5),
        st.sampled_from([1, 2, 3]),
        st.sampled_from([0.0, 0.5, 1.0, 3.0, 0.10000000149011612]),
        st.integers(0, 12_000),
    ),
    min_size=1,
    max_size=40,
)
TIMES = [0, 5_000, 12_000, 20_000, 10**6]


@settings(max_examples=60, deadline=None)
@given(st.lists(records, min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_view_equals_shard_reads(batches: list[list[tuple]], rnd: random.Random) -> None:  # type: ignore[type-arg]
    """The newest view after each change answers as the shard; views a reader kept
    answer as the shard did when they were published, after later publications."""
    a = _agg()
    pub = Publisher(a)
    kept: list[tuple[PublishedView, dict[tuple[Any, ...], Any]]] = []
    pub.publish(None)
    rseq = 0
    for raw in batches:
        rows = _add(a, raw, rseq)
        rseq += len(raw)
        v = pub.publish(_keys_of(a, rows))
        truth = _truth(a, 6, TIMES)
        _check(v, truth)
        if rnd.random() < 0.3:
            kept.append((v, truth))  # a reader holds it
        del v
        held = [r for r in range(a.row_base, a.row_end) if a.row_key[r - a.phys_base] != DEAD]
        if held and rnd.random() < 0.6:
            v = _retract(a, pub, rnd.sample(held, rnd.randint(1, len(held))))
            _check(v, _truth(a, 6, TIMES))
            del v
    for v, truth in kept:
        _check(v, truth)
    # a publisher starting afresh gives the same answers
    _check(Publisher(a).publish(None), _truth(a, 6, TIMES))


def test_buffers_of_views_nobody_holds_are_reused_and_exact() -> None:
    """Many publications of a few changed keys each: retired views' buffers are
    written row by row (far fewer rows copied than a copy of every key each time),
    and every view answers as the shard."""
    rnd = random.Random(5)
    a = _agg()
    pub = Publisher(a)
    rows = _add(a, [(c, e, 1, 1.0, 10) for c in COHORTS for e in range(400)], 0)
    pub.publish(None)
    rseq = len(rows)
    keys = a.key_total
    for step in range(40):
        raw = [(rnd.choice(COHORTS), rnd.randrange(400), 1, 2.0, 20 + step) for _ in range(5)]
        rows = _add(a, raw, rseq)
        rseq += len(raw)
        v = pub.publish(_keys_of(a, rows))
        if step % 8 == 0:
            _check(v, _truth(a, 400, [100]))
        del v
    assert pub.rows_written < 40 * keys / 4
    _check(pub.publish(np.zeros(0, np.int64)), _truth(a, 400, [100, 10**6]))


def test_a_dropped_key_is_left_to_the_shard_by_older_views() -> None:
    """A view published before a key was dropped does not answer 0 for it from the
    shared index (the shard's answer at that view's state was not 0)."""
    a = _agg()
    pub = Publisher(a)
    rows = _add(a, [("a", 1, 1, 1.0, 10), ("a", 2, 1, 1.0, 10)], 0)
    old = pub.publish(None)
    assert old.score("a", 1, 1, 100) == a.decay_score("a", 1, 1, 100) > 0.0
    new = _retract(a, pub, [rows.start])
    assert a.decay_score("a", 1, 1, 100) == 0.0 == new.score("a", 1, 1, 100)
    assert old.score("a", 1, 1, 100) is None
    # top-k reads the view's own columns: both keys, as before the drop
    s = 1.0 * 2.0 ** (-(100 - 10) / 500)
    assert old.top("a", 1, 5, 100) == [(1, s), (2, s)]
    assert new.top("a", 1, 5, 100) == a.top("a", 1, 5, 100) == [(2, s)]


def test_top_k_many_keys_and_near_ties() -> None:
    """Groups far larger than the keys a view orders, with equal scores (ties by
    entity) and landmarks far apart; retractions of the best keys."""
    rnd = random.Random(7)
    a = _agg()
    pub = Publisher(a)
    pub.publish(None)
    rseq = 0
    v = None
    for step in range(30):
        raw = []
        for _ in range(200):
            e = rnd.randrange(300)
            w = rnd.choice([1.0, 1.0, 2.0, 0.5])  # many exact ties
            ts = step * 400 + rnd.randrange(400)
            raw.append((rnd.choice(COHORTS), e, rnd.choice([1, 2]), w, ts))
        rows = _add(a, raw, rseq)
        rseq += len(raw)
        v = pub.publish(_keys_of(a, rows))
        if step % 5 == 4:
            answered, _ = _check(v, _truth(a, 300, [step * 400 + 400, 10**5]))
            assert answered
    for c in COHORTS:
        for t in (1, 2):
            best = [e for e, _s in a.top(c, t, 40, 12_000)]
            rows2 = [
                r
                for r in range(a.row_base, a.row_end)
                if a.row_key[r - a.phys_base] != DEAD
                and a.key(a.row_key[r - a.phys_base])[0] == c
                and a.key(a.row_key[r - a.phys_base])[1] in best
                and a.key(a.row_key[r - a.phys_base])[2] == t
            ]
            v = _retract(a, pub, rows2)
    assert v is not None
    answered, _ = _check(v, _truth(a, 300, [12_000, 10**5]))
    assert answered


def test_top_k_orders_are_repaired_from_earlier_views(monkeypatch: Any) -> None:
    """A group of 2,000 keys, a few changing between publications (adds raising
    ranks, retractions lowering them and dropping keys): each view's top-k equals the
    shard's, and only the first is ranked from all the group's keys; the others
    repair an earlier view's order with the keys changed since."""
    rnd = random.Random(11)
    a = _agg()
    pub = Publisher(a)
    rows = _add(a, [("a", e, 1, 0.5 + (e % 7), 10 + e % 50) for e in range(2000)], 0)
    rseq = len(rows)
    full = []
    monkeypatch.setattr(
        PublishedView,
        "_order",
        lambda self, g, want, _o=PublishedView._order: full.append(g) or _o(self, g, want),
    )
    v = pub.publish(None)
    for step in range(60):
        if step % 3 == 2:
            held = [r for r in range(a.row_base, a.row_end) if a.row_key[r - a.phys_base] != DEAD]
            best = {e for e, _s in a.top("a", 1, 20, 5_000)}
            mine = [r for r in held if int(a.key(a.row_key[r - a.phys_base])[1]) in best]
            v = _retract(a, pub, rnd.sample(mine, 3))
        else:
            raw = [
                ("a", rnd.randrange(2000), 1, rnd.choice([1.0, 4.0]), 60 + step) for _ in range(4)
            ]
            rows = _add(a, raw, rseq)
            rseq += len(raw)
            v = pub.publish(_keys_of(a, rows))
        for k in (1, 10, 30):
            assert v.top("a", 1, k, 5_000) == a.top("a", 1, k, 5_000)
    assert len(full) == 1
