"""Adversarial checks of the ledger's key index (`key_state.KeyCode`) and columnar older
buckets (`older_buckets.OlderBuckets`) through `Aggregates`: ids on both sides of the
narrow/wide boundary (entity 2**44, type 64, cohort id 2**14), small and large
batches, late records in earlier buckets, landmark moves, retractions, snapshot round
trips and re-materialization, each read compared with a plain fold of the records
left."""

from __future__ import annotations

import math
import random
from typing import Any

import msgpack
import numpy as np
import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, TidalDb, UnknownCohort
from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.key_state import key_code, key_codes
from tidal_actors.core.retraction import Retraction
from tidal_actors.testing import ReferenceModel

from .conftest import SEC, T0

# half-life (ns) by type: type 63 tiny (landmark moves every few records)
HALF_LIVES = {0: 5_000, 63: 1, 64: 700, 2**64 - 1: 3_000}
ENTITIES = [0, 1, 2**44 - 1, 2**44, 2**63, 2**64 - 1, 12_345]
N_BUCKETS = 4
FILLER = 2**14  # cohorts made before the wide ones, so these get ids >= 2**14


def _hl(t: int) -> int:
    return HALF_LIVES[t]


Rec = tuple[int, str, int, int, float, int]  # (row, cohort, entity, type, weight, ts)


class Fold:
    """The records added and not retracted, and the reads computed from them."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.live: dict[int, Rec] = {}

    def keys(self) -> set[tuple[str, int, int]]:
        return {(c, e, t) for _r, c, e, t, _w, _ts in self.live.values()}

    def of(self, key: tuple[str, int, int]) -> list[Rec]:
        return [r for r in self.live.values() if (r[1], r[2], r[3]) == key]

    def score(self, key: tuple[str, int, int], at: int) -> float:
        h = HALF_LIVES[key[2]]
        return math.fsum(w * 2.0 ** (-(at - ts) / h) for *_, w, ts in self.of(key) if ts <= at)

    def window(self, key: tuple[str, int, int], at: int) -> tuple[int, float]:
        hi = at // self.width
        inside = [w for *_, w, ts in self.of(key) if hi - N_BUCKETS + 1 <= ts // self.width <= hi]
        return len(inside), math.fsum(inside)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-250)


def _check(agg: Aggregates, fold: Fold, ats: list[int]) -> None:
    keys = fold.keys()
    assert agg.key_count() == len(keys)
    for key in keys:
        assert agg.key_id(*key) is not None, key
        for at in ats:
            assert _close(agg.decay_score(*key, at), fold.score(key, at)), (key, at)
            n, w = agg.window(*key, at)
            n2, w2 = fold.window(key, at)
            assert n == n2 and _close(w, w2), (key, at, (n, w), (n2, w2))
    at = ats[-1]
    got = {(c, e, t): (s, n, w) for c, e, t, s, n, w in agg.rows(at)}
    assert got.keys() == keys
    for key, (s, n, w) in got.items():
        n2, w2 = fold.window(key, at)
        assert _close(s, fold.score(key, at)) and n == n2 and _close(w, w2), key
    for c in {k[0] for k in keys}:
        for t in HALF_LIVES:
            want = sorted(
                ((e, fold.score((c, e, t), at)) for cc, e, tt in keys if cc == c and tt == t),
                key=lambda p: (-p[1], p[0]),
            )
            # a score below 1e-250 is 0 or subnormal, depending on how it was rounded
            want = [p for p in want if p[1] > 1e-250]
            top = [p for p in agg.top(c, t, len(ENTITIES), at) if p[1] > 1e-250]
            assert [e for e, _ in top] == [e for e, _ in want], (c, t)
            assert all(_close(s, s2) for (_, s), (_, s2) in zip(top, want))


def _snapshot(agg: Aggregates, width: int) -> Aggregates:
    """``agg`` dumped, through msgpack as a snapshot file holds it, and loaded back."""
    out = Aggregates(_hl, width, N_BUCKETS)
    out.load(msgpack.unpackb(msgpack.packb(agg.dump()), strict_map_key=False))
    return out


def _rebuild(agg: Aggregates, fold: Fold, cohort: str, width: int) -> None:
    """Re-materialize ``cohort``: a fresh fold of its records installed (as `Rebuild`)."""
    other = Aggregates(_hl, width, N_BUCKETS)
    recs = sorted(r for r in fold.live.values() if r[1] == cohort)
    if recs:
        other.add_many([(0, r, 1, c, e, t, w, ts) for r, c, e, t, w, ts in recs])
    oks, ks = agg.live_key_ids(cohort, other)
    for ok, k in zip(oks.tolist(), ks.tolist()):  # each rebuilt key onto its live id
        _c, e, t = other.key(ok)
        assert agg.key(k) == (cohort, e, t)
    agg.install_cohort(cohort, other, ks)


def _run(seed: int, width: int, steps: int, filler: bool, origin: int = 1_000) -> None:
    rng = random.Random(seed)
    agg = Aggregates(_hl, width, N_BUCKETS)
    fold = Fold(width)
    row = 0
    cohorts = ["a", "b"]
    if filler:  # 2**14 cohorts of one record each, then retracted: ids stay taken
        filler_recs = [(0, i, 1, f"f{i}", i, 0, 1.0, 10) for i in range(FILLER)]
        agg.add_many(filler_recs)
        assert agg.retract_rows(list(range(FILLER))) == FILLER
        row = FILLER
        cohorts += ["w1", "w2"]
    types = list(HALF_LIVES)
    pool = [(c, e, t) for c in cohorts for e in ENTITIES for t in types]
    rng.shuffle(pool)
    pool = pool[:24]
    now = origin
    for _step in range(steps):
        op = rng.random()
        if op < 0.55:
            n = rng.choice([1, 2, 5, 8, 9, 20, 60])
            recs = []
            for _ in range(n):
                c, e, t = rng.choice(pool)
                now += rng.choice([0, 1, 3, width // 2 + 1, width, 3 * width, 400])
                ts = now - rng.choice([0, 0, 0, width, 5 * width, 20 * width])
                ts = max(ts, min(origin, 0))
                w = float(np.float32(rng.choice([0.5, 1.0, 3.25, 1e-3, 1e6])))
                recs.append((0, row, 7, c, e, t, w, ts))
                fold.live[row] = (row, c, e, t, w, ts)
                row += 1
            got = agg.add_many(recs)
            assert list(got) == [r[1] for r in recs]
        elif op < 0.75 and fold.live:
            rows = rng.sample(sorted(fold.live), min(len(fold.live), rng.choice([1, 3, 10])))
            assert agg.retract_rows(rows) == len(rows)
            for r in rows:
                del fold.live[r]
        elif op < 0.85:
            agg = _snapshot(agg, width)
        elif fold.live:
            _rebuild(agg, fold, rng.choice(cohorts), width)
    ts_all = [r[5] for r in fold.live.values()] or [0]
    last = max(ts_all)
    ats = sorted({last, last + 3 * width, last - 2 * width, rng.choice(ts_all)})
    _check(agg, fold, ats)
    _check(_snapshot(agg, width), fold, ats)
    _check(_replayed(fold, width, filler), fold, ats)


def _replayed(fold: Fold, width: int, filler: bool) -> Aggregates:
    """The records left, replayed into fresh aggregates with `load_columns` (a
    restore from the history), after the filler cohorts when ``filler``."""
    out = Aggregates(_hl, width, N_BUCKETS)
    if filler:
        for i in range(FILLER):
            out.cohort_id_for(f"f{i}")
    recs = sorted(fold.live.values())
    names = sorted({r[1] for r in recs})
    if recs:
        rows, cs, es, ts_, ws, tss = zip(*recs)
        n = len(recs)
        out.load_columns(
            np.zeros(n, np.uint8),
            np.array(rows, np.int64),
            np.full(n, 7, np.uint64),
            np.array([names.index(c) for c in cs], np.int64),
            names,
            np.array(es, np.uint64),
            np.array(ts_, np.uint64),
            np.array(ws, np.float32),
            np.array(tss, np.int64),
        )
    return out


@pytest.mark.parametrize("seed", range(12))
def test_narrow_and_wide_keys_under_adds_retractions_snapshots_and_rebuilds(seed: int) -> None:
    _run(seed, width=100, steps=60, filler=False)


@pytest.mark.parametrize("seed", range(3))
def test_cohort_ids_past_the_narrow_field(seed: int) -> None:
    _run(seed, width=100, steps=60, filler=True)


@pytest.mark.parametrize("seed", range(4))
def test_one_ns_buckets(seed: int) -> None:
    _run(seed, width=1, steps=60, filler=False)


@pytest.mark.parametrize("seed", range(4))
def test_runtime_with_boundary_ids_matches_the_reference(seed: int, tmp_path: Any) -> None:
    """TidalDb (persistent on odd seeds: closed and reopened) against the reference
    model with entities and types on both sides of the narrow field, a type whose
    half-life is a few ns (landmark moves), late signals, purges and rebuilds."""
    rng = random.Random(seed)
    cfg = Config(
        half_life_ns=30 * SEC,
        half_life_ns_by_type={63: 7, 64: 5 * SEC},
        window_width_ns=10 * SEC,
        window_buckets=4,
        max_contribution_log_entries=rng.choice([7, 5_000_000]),
        membership_shards=rng.choice([1, 2]),
        ledger_shards=rng.choice([1, 2]),
        rematerialize_after_ms=None,
    )
    clock, rclock = ManualClock(T0), ManualClock(T0)
    path = str(tmp_path / "s") if seed % 2 else None
    ref = ReferenceModel(cfg, rclock, history=path is not None)
    db = TidalDb.open(path, config=cfg, clock=clock)
    cohorts = ["a", "b"]
    types = [0, 63, 64, 2**64 - 1]
    try:
        for step in range(300):
            op = rng.random()
            u = rng.randrange(5)
            if op < 0.6:
                args = (
                    u,
                    rng.choice(ENTITIES),
                    rng.choice(types),
                    rng.choice([0.5, 1.0, 2.0]),
                    T0 + rng.randrange(-5, 60) * SEC + rng.randrange(0, 50),
                )
                db.signal_with_context(*args)
                ref.signal_with_context(*args)
            elif op < 0.72:
                c = rng.choice(cohorts)
                db.assign_cohort(u, c)
                ref.assign_cohort(u, c)
            elif op < 0.76:
                c = rng.choice(cohorts)
                db.unassign_cohort(u, c)
                ref.unassign_cohort(u, c)
            elif op < 0.86:
                c = rng.choice([*cohorts, COMMUNITY])
                _, m = db.request_community_purge(u, c)
                _, rm = ref.request_community_purge(u, c)
                assert m.entries == rm.entries
            elif op < 0.9:
                c = rng.choice([*cohorts, COMMUNITY])
                try:
                    ref.rematerialize(c)
                except UnknownCohort:
                    with pytest.raises(UnknownCohort):
                        db.rematerialize(c)
                else:
                    db.rematerialize(c)
            elif op < 0.97:
                d = rng.randrange(0, 8) * SEC + rng.randrange(0, 30)
                clock.advance(d)
                rclock.advance(d)
            elif path is not None:
                db.close()
                db = TidalDb.open(path, config=cfg, clock=clock)
            if step % 60 == 0:
                _compare_rows(db, ref, clock.now_ns())
        for at in (clock.now_ns(), T0 + 17 * SEC, T0 + 17 * SEC + 3):
            _compare_rows(db, ref, at)
    finally:
        db.close()


def _compare_rows(db: Any, ref: ReferenceModel, at: int) -> None:
    rows, expect = db.aggregate_rows(at), ref.aggregate_rows(at)
    assert [r[:3] for r in rows] == [r[:3] for r in expect]
    for got, want in zip(rows, expect):
        assert _close(got[3], want[3]), (got, want)
        assert got[4] == want[4] and _close(got[5], want[5]), (got, want)


def test_refolds_of_a_growing_key_do_not_leave_its_old_segments_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key that gains a bucket, then has a dwarfing contribution purged (each purge
    sums it again, `_refold`, which gives it a segment of its bucket count) holds
    room for its buckets, not every segment size it went through."""
    agg = Aggregates(_hl, 10, N_BUCKETS)
    fold = Fold(10)
    row = 0
    refolds = []
    refold = Retraction._refold

    def counted(self: Retraction, ks: list[int]) -> None:
        refolds.append(ks)
        refold(self, ks)

    monkeypatch.setattr(Retraction, "_refold", counted)
    n = 300
    for i in range(n):
        agg.add_many([(0, row, 1, "c", 1, 0, 1.0, i * 10 + 5)])
        fold.live[row] = (row, "c", 1, 0, 1.0, i * 10 + 5)
        agg.add_many([(0, row + 1, 1, "c", 1, 0, 1e30, i * 10 + 5)])
        assert agg.retract_rows([row + 1]) == 1
        row += 2
    assert len(refolds) == n  # every purge summed the key again
    _check(agg, fold, [n * 10 + 5, n * 10 - 20])
    older = agg.older
    per_key = older.start.nbytes + older.length.nbytes + older.cap.nbytes
    # 40 bytes a bucket, a segment at most twice the buckets, the free ones at most
    # as much again, the columns at most 1.5 times what is handed out or 1024 rows
    bound = per_key + max(1.5 * 4 * 40 * (n - 1), 1024 * 40)
    assert agg.memory()["older_buckets"] <= bound


def test_memory_counts_the_older_buckets_columns_as_allocated() -> None:
    """`Aggregates.memory` counts the older buckets' columns as allocated (as the
    key columns), not only the rows handed out to segments: numpy holds them all."""
    agg = Aggregates(_hl, 10, N_BUCKETS)
    row = 0
    for i in range(4):  # 1,500 keys with 3 earlier buckets each: segments of 2, then 4
        agg.add_many([(0, row + j, 1, "c", j, 0, 1.0, i * 10 + 5) for j in range(1_500)])
        row += 1_500
    # one more key with 3 earlier buckets: its segment of 4 makes the columns grow by half
    agg.add_many([(0, row + i, 1, "d", 0, 0, 1.0, i * 10 + 5) for i in range(4)])
    older = agg.older
    held = sum(
        getattr(older, name).nbytes
        for name in ("b", "count", "wsum", "fd", "tmax", "start", "length", "cap")
    )
    assert len(older.b) > 1_500 * (2 + 4) + 4  # more rows than handed out to segments
    assert agg.memory()["older_buckets"] == held


_CRASH_CHILD = """
import json, os, sys
from tidal_actors import Config, ManualClock, TidalDb
path, cfg, ops = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
cfg["half_life_ns_by_type"] = {int(t): h for t, h in cfg["half_life_ns_by_type"].items()}
clock = ManualClock(ops[0][1])
db = TidalDb.open(path, config=Config(**cfg), clock=clock)
for name, now, args in ops:
    clock.set(now)
    getattr(db, name)(*args)
db.flush()
os._exit(0)  # no close: the store is left as a crash leaves it
"""


def _crash_ops(rng: random.Random, start: int, n: int) -> list[tuple[str, int, list[Any]]]:
    """A seeded workload with boundary ids: ``(method, clock now, args)``."""
    ops: list[tuple[str, int, list[Any]]] = []
    now = start
    for _ in range(n):
        now += rng.randrange(0, 3) * SEC + rng.randrange(0, 20)
        u = rng.randrange(4)
        op = rng.random()
        if op < 0.7:
            e, t = rng.choice(ENTITIES), rng.choice([0, 63, 64, 2**64 - 1])
            ts = now - rng.randrange(0, 40) * SEC
            ops.append(("signal_with_context", now, [u, e, t, rng.choice([0.5, 2.0]), ts]))
        elif op < 0.85:
            ops.append(("assign_cohort", now, [u, rng.choice(["a", "b"])]))
        else:
            ops.append(("request_community_purge", now, [u, rng.choice(["a", "b", COMMUNITY])]))
    return ops


@pytest.mark.parametrize("seed", range(2))
def test_restore_after_a_crash_with_boundary_ids(seed: int, tmp_path: Any) -> None:
    """A child process works on a persistent store with boundary ids and exits without
    closing it, twice; each reopen (history replay into `load_columns`) reads as the
    reference model."""
    import json
    import subprocess
    import sys

    cfg = {
        "half_life_ns": 30 * SEC,
        "half_life_ns_by_type": {63: 7, 64: 5 * SEC},
        "window_width_ns": 10 * SEC,
        "window_buckets": 4,
        "ledger_shards": 2,
        "rematerialize_after_ms": None,
    }
    rng = random.Random(seed)
    path = str(tmp_path / "s")
    rclock = ManualClock(T0)
    ref = ReferenceModel(Config(**cfg), rclock, history=True)  # type: ignore[arg-type]
    start = T0
    for _round in range(2):
        ops = _crash_ops(rng, start, 150)
        child = [sys.executable, "-c", _CRASH_CHILD, path, json.dumps(cfg), json.dumps(ops)]
        done = subprocess.run(child, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        for name, now, args in ops:
            rclock.set(now)
            getattr(ref, name)(*args)
        start = ops[-1][1]
        db = TidalDb.open(path, config=Config(**cfg), clock=ManualClock(start))  # type: ignore[arg-type]
        try:
            for at in (start, start - 25 * SEC, start + 60 * SEC):
                _compare_rows(db, ref, at)
        finally:
            db.close()


@pytest.mark.parametrize("seed", range(3))
def test_a_snapshot_with_older_buckets_in_any_order_loads(seed: int) -> None:
    """The snapshot layout is the previous one: ``older_keys`` (int64 key ids) and
    ``older`` (five values a bucket), in the order the previous writer's dicts gave
    (keys by first earlier bucket, buckets by insertion, late ones after later ones).
    Loaded in a shuffled order, the state reads as the fold."""
    rng = random.Random(seed)
    agg = Aggregates(_hl, 100, N_BUCKETS)
    fold = Fold(100)
    recs = []
    for row in range(400):
        c, e, t = rng.choice("ab"), rng.choice(ENTITIES), rng.choice([0, 64, 2**64 - 1])
        ts = 1_000 + 25 * row - rng.choice([0, 0, 300, 2_000])  # late ones: earlier buckets
        w = float(np.float32(rng.choice([0.5, 2.0])))
        recs.append((0, row, 7, c, e, t, w, ts))
        fold.live[row] = (row, c, e, t, w, ts)
    for i in range(0, len(recs), 37):
        agg.add_many(recs[i : i + 37])
    state = agg.dump()
    keys = np.frombuffer(state["older_keys"], dtype=np.int64).tolist()
    assert len(keys) > 100  # earlier buckets of many keys
    groups = [(k, state["older"][5 * i : 5 * i + 5]) for i, k in enumerate(keys)]
    rng.shuffle(groups)
    state["older_keys"] = np.array([k for k, _ in groups], dtype=np.int64).tobytes()
    state["older"] = [v for _, g in groups for v in g]
    out = Aggregates(_hl, 100, N_BUCKETS)
    out.load(msgpack.unpackb(msgpack.packb(state), strict_map_key=False))
    last = max(r[5] for r in fold.live.values())
    _check(out, fold, [last - 1_500, last - 450, last, last + 300])
    assert out.older == agg.older


@pytest.mark.parametrize("wide_every", [1, 3, 0])
def test_key_codes_of_all_wide_mixed_and_all_narrow_batches(wide_every: int) -> None:
    """`key_codes` gives `key_code` of each key whether every key of the batch is wide
    (64-bit hashed entity ids), some are, or none."""
    rng = np.random.default_rng(wide_every)
    n = 500
    es = rng.integers(0, 2**44, n, dtype=np.uint64)
    if wide_every:
        es[::wide_every] = rng.integers(2**44, 2**64 - 1, len(es[::wide_every]), dtype=np.uint64)
    cids = rng.integers(0, 2**14 + 5, n).astype(np.int64) if wide_every else np.zeros(n, np.int64)
    types = rng.choice(np.array([0, 63, 64, 2**64 - 1], dtype=np.uint64), n)
    if not wide_every:
        types = types % np.uint64(64)
    got = key_codes(cids, es, types)
    want = [key_code(c, e, t) for c, e, t in zip(cids.tolist(), es.tolist(), types.tolist())]
    assert got == want
    assert all(type(a) is type(b) for a, b in zip(got, want))
    assert all(isinstance(x, int) for code in got if isinstance(code, tuple) for x in code)
