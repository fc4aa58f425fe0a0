"""The published view (`core.published`, built by `core.publisher`): every answer it
gives equals, bit for bit, the shard's own read (`Aggregates`) on the state it was
published from, after adds, retractions and dropped keys; a read it cannot answer
that way says so (None) instead of answering."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.key_state import DEAD
from tidal_actors.core.published import LayeredMap
from tidal_actors.core.publisher import KEEP_MAX, Publisher

WIDTH = 1000
HALF = {1: 500, 2: 50_000, 3: 7}  # type 3 renormalizes often
COHORTS = ["a", "b", "@community"]


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


def _retract(a: Aggregates, pub: Publisher, rows: list[int]) -> None:
    dk = a.view("row_key")
    ks = np.unique(dk[np.array(rows, dtype=np.int64) - a.row_base]).astype(np.int64)
    del dk
    ks = ks[ks != DEAD]
    names = {k: a.key(k) for k in ks.tolist()}
    a.retract_rows(rows)
    pub.publish(ks, names)


def _check(a: Aggregates, pub: Publisher, entities: int, times: list[int]) -> tuple[int, int]:
    """Compare every key's score and window, and top-k, at ``times``; returns how
    many reads the view answered and how many it left to the shard."""
    v = pub.view
    answered = deferred = 0
    for at in times:
        for c in COHORTS:
            for t in HALF:
                for e in range(entities):
                    s = v.score(c, e, t, at)
                    if s is None:
                        deferred += 1
                    else:
                        answered += 1
                        assert s == a.decay_score(c, e, t, at), (c, e, t, at)
                    wv = v.window(c, e, t, at)
                    if wv is None:
                        deferred += 1
                    else:
                        answered += 1
                        assert wv == a.window(c, e, t, at), (c, e, t, at)
                for k in (1, 3, 10, 100):
                    got = v.top(c, t, k, at)
                    if got is None:
                        deferred += 1
                    else:
                        answered += 1
                        assert got == a.top(c, t, k, at), (c, t, k, at)
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


@settings(max_examples=60, deadline=None)
@given(st.lists(records, min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_view_equals_shard_reads(batches: list[list[tuple]], rnd: random.Random) -> None:  # type: ignore[type-arg]
    a = _agg()
    pub = Publisher(a)
    pub.publish_all()
    rseq = 0
    for raw in batches:
        rows = _add(a, raw, rseq)
        rseq += len(raw)
        pub.publish(_keys_of(a, rows))
        _check(a, pub, 6, [0, 5_000, 12_000, 20_000, 10**6])
        held = [r for r in range(a.row_base, a.row_end) if a.row_key[r - a.phys_base] != DEAD]
        if held and rnd.random() < 0.6:
            _retract(a, pub, rnd.sample(held, rnd.randint(1, len(held))))
            _check(a, pub, 6, [0, 12_000, 10**6])
    # a fresh publication gives the same answers
    fresh = Publisher(a)
    fresh.publish_all()
    _check(a, fresh, 6, [12_000, 10**6])


def test_top_k_many_keys_and_near_ties() -> None:
    """Groups larger than the view lists, with equal scores (ties by entity) and
    landmarks far apart; retractions shrink the best keys below the kept minimum."""
    rnd = random.Random(7)
    a = _agg()
    pub = Publisher(a)
    pub.publish_all()
    rseq = 0
    for step in range(30):
        raw = []
        for _ in range(200):
            e = rnd.randrange(300)
            w = rnd.choice([1.0, 1.0, 2.0, 0.5])  # many exact ties
            ts = step * 400 + rnd.randrange(400)
            raw.append((rnd.choice(COHORTS), e, rnd.choice([1, 2]), w, ts))
        rows = _add(a, raw, rseq)
        rseq += len(raw)
        pub.publish(_keys_of(a, rows))
        if step % 5 == 4:
            answered, _ = _check(a, pub, 300, [step * 400 + 400, 10**5])
            assert answered
    assert max(len(g.best) for _k, g in pub.groups.items()) <= KEEP_MAX
    # retract most rows of the best entities: the groups are ranked again
    for c in COHORTS:
        for t in (1, 2):
            best = [e for e, _s in a.top(c, t, 40, 12_000)]
            rows = [
                r
                for r in range(a.row_base, a.row_end)
                if a.row_key[r - a.phys_base] != DEAD
                and a.key(a.row_key[r - a.phys_base])[0] == c
                and a.key(a.row_key[r - a.phys_base])[1] in best
                and a.key(a.row_key[r - a.phys_base])[2] == t
            ]
            _retract(a, pub, rows)
    answered, _ = _check(a, pub, 300, [12_000, 10**5])
    assert answered


def test_layered_map_keeps_every_version() -> None:
    """Each map returned by `updated` keeps its own contents (deletions included),
    whatever merges later updates make."""
    rnd = random.Random(3)
    maps = [LayeredMap()]
    truth: list[dict[int, int]] = [{}]
    for _ in range(300):
        cur = dict(truth[-1])
        ch: dict[int, int | None] = {}
        for _ in range(rnd.randint(1, 20)):
            k = rnd.randrange(200)
            if rnd.random() < 0.2:
                ch[k] = None
                cur.pop(k, None)
            else:
                ch[k] = cur[k] = rnd.randrange(10**6)
        maps.append(maps[-1].updated(ch))
        truth.append(cur)
    for m, t in zip(maps, truth):
        assert dict(m.items()) == t
        assert all(m.get(k) == t.get(k) for k in range(200))
    assert len(maps[-1].layers) <= 6
