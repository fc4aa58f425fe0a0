"""Adversarial review of history version 3 (the batch index) and the erasure and
retention that skip batches by it: what the data file holds afterwards, read by an
independent reader of docs/storage-format.md (`_history_scan`), against a plain
computation of the records that must remain.

Cases: ids 0 and 2**64 - 1, batches of exactly 16 and 17 users (the sorted filter's
last size and the Bloom filter's first), a batch whose only records are the purged
user's, records exactly at the retention cutoff, negative and extreme timestamps.
"""

from __future__ import annotations

import pytest

from tidal_actors import Config, ManualClock, TidalDb

from ._history_scan import data_bytes, history

TOP = 2**64 - 1
T0 = 10**18
MASK = 2**64 - 1


def _mix(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _bloom_holds(kind: int, data: bytes, user: int) -> bool:
    bits = 8 * len(data)
    z = _mix(user)
    h1, h2 = z >> 32, (z & 0xFFFFFFFF) | 1
    return all(data[p >> 3] >> (p & 7) & 1 for p in ((h1 + i * h2) % bits for i in range(kind)))


def _check_index(recs: list, index: dict) -> None:
    """A version 3 batch's index holds what its records say (docs: the index)."""
    if "ts_min" not in index:
        return
    users = sorted({r[1] for r in recs})
    assert index["ts_min"] == (min(r[4] for r in recs) if recs else 2**63 - 1)
    assert set(index["names"]) >= {r[0] for r in recs}
    if index["kind"] == 0:
        assert len(users) <= 16
        data = index["filter"]
        assert [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8)] == users
    else:
        assert len(users) > 16
        assert all(_bloom_holds(index["kind"], index["filter"], u) for u in users)


def _on_disk(path: str) -> list:
    out = []
    for recs, index in history(path).values():
        _check_index(recs, index)
        out.extend(recs)
    return sorted(out)


SECRET = 0x5A17_C0DE_9E3D_4B21  # the purged user's entity: its bytes are searched for


def _entity(i: int, user: int, purged: int) -> int:
    return SECRET if user == purged else 500 + i


def _users(n: int) -> list[int]:
    return [0, TOP, *range(1, n - 1)][:n]


@pytest.mark.parametrize("n", [1, 2, 16, 17, 40])
@pytest.mark.parametrize("purged", [0, TOP])
@pytest.mark.parametrize("merged", [True, False])
@pytest.mark.parametrize("layout", ["single", "shards"])
def test_no_purged_record_is_left_in_the_history_on_disk(
    tmp_path, n, purged, merged, layout
) -> None:
    """``merged``: compact() first merges the writes into one block of every user;
    else each write stays its own batch (the purged user's alone in theirs).
    ``layout``: `Config.store_layout` (the history in one environment or a ledger's)."""
    path = str(tmp_path / "s")
    cfg = Config(rematerialize_after_ms=None, ledger_shards=1, store_layout=layout)
    clock = ManualClock(T0 + 10**12)
    users = _users(n)
    if purged not in users:
        users = [purged]
    expected = []
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        for u in users:
            db.assign_cohort(u, "c")
        for i, u in enumerate(users):
            for j in range(2):
                ts = T0 + 1000 * i + j
                db.signal_with_context(u, _entity(i, u, purged), 1, 1.0, timestamp_ns=ts)
                for cohort in ("@community", "c"):
                    if u != purged:
                        expected.append((cohort, u, _entity(i, u, purged), 1, ts))
        if merged:
            db.compact()
        for cohort in ("c", "@community"):
            db.request_community_purge(purged, cohort)
            db.rematerialize(cohort)
    got = _on_disk(path)
    assert [r for r in got if r[1] == purged] == []
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        db.compact()
    assert _on_disk(path) == sorted(expected)
    data = data_bytes(path)
    # the columns are little-endian; the purge's manifest lists the entity (msgpack,
    # big-endian), as the caller got it
    assert SECRET.to_bytes(8, "little") not in data


CUTOFFS = [-(2**63) + 5, -5, 0, T0, 2**63 - 2]


@pytest.mark.parametrize("cutoff", CUTOFFS)
def test_retention_keeps_exactly_the_records_at_or_past_the_cutoff(tmp_path, cutoff) -> None:
    """Records one before, at and one past the cutoff (clipped to i64), and at both
    ends of i64: retention drops exactly those before the cutoff."""
    path = str(tmp_path / "s")
    now = min(max(cutoff + 10**9, 0), 2**63 - 1)
    retention = now - cutoff
    clock = ManualClock(now)
    cfg = Config(rematerialize_after_ms=None, ledger_shards=1, history_retention_ns=retention)
    stamps = sorted(
        {
            t
            for t in (cutoff - 1, cutoff, cutoff + 1, -(2**63), 2**63 - 1, 0, -1)
            if -(2**63) <= t < 2**63
        }
    )
    expected = []
    written = []
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        db.assign_cohort(7, "c")
        for i, ts in enumerate(stamps):
            try:
                db.signal_with_context(7, 100 + i, 1, 1.0, timestamp_ns=ts)
            except Exception:  # noqa: BLE001 - a stamp intake refuses is not stored
                continue
            written.append(ts)
            if ts >= clock.now_ns() - retention:
                expected += [(c, 7, 100 + i, 1, ts) for c in ("@community", "c")]
        assert written, "intake refused every stamp"
        db.compact()
    assert _on_disk(path) == sorted(expected)


@pytest.mark.parametrize("older", ["v1", "v2"])
@pytest.mark.parametrize("n", [16, 17, 40])
def test_a_purge_erases_older_batches_mixed_with_version_3(tmp_path, older, n) -> None:
    """Every other history batch rewritten in an older layout (no index), then more
    version 3 writes: a purge and its re-materialization leave none of the user's
    records, and compact() (which rewrites the older batches in version 3) leaves
    exactly the others'."""
    from .test_store_encoding import _history, _version_2
    from .test_store_safety import _rewrite, _version_1

    path = tmp_path / "s"
    cfg = Config(rematerialize_after_ms=None, ledger_shards=1)
    clock = ManualClock(T0 + 10**12)
    users = _users(n)
    expected = []

    def write(db: TidalDb, base: int) -> None:
        for i, u in enumerate(users):
            ts = T0 + base + i
            db.signal_with_context(u, 500 + i, 1, 1.0, timestamp_ns=ts)
            if i % 3 == 0:
                db.flush()  # batches of a few writes: some of them rewritten older
            if u not in (0, TOP):
                expected.extend((c, u, 500 + i, 1, ts) for c in ("@community", "c"))

    with TidalDb.open(str(path), config=cfg, clock=clock) as db:
        for u in users:
            db.assign_cohort(u, "c")
        write(db, 0)
        write(db, 10**6)
    rewrite = _version_1 if older == "v1" else _version_2
    _rewrite(path, [("history", k, rewrite(k, v)) for k, v in _history(path).items() if k[-1] % 2])
    assert any("ts_min" not in index for _, index in history(str(path)).values())  # older ones
    with TidalDb.open(str(path), config=cfg, clock=clock) as db:
        write(db, 2 * 10**6)
        for purged in (0, TOP):
            for cohort in ("c", "@community"):
                db.request_community_purge(purged, cohort)
                db.rematerialize(cohort)
    assert [r for r in _on_disk(str(path)) if r[1] in (0, TOP)] == []
    with TidalDb.open(str(path), config=cfg, clock=clock) as db:
        db.compact()
    assert _on_disk(str(path)) == sorted(expected)


CRASH_USERS = _users(20)  # a Bloom filter once merged


def _crash_child(path: str, point: int, pre: bool) -> None:
    """Signals of 20 users merged into one block, then purges of user 0 (each with its
    re-materialization) and a compact() with a retention: SIGKILL just before
    (``pre``) or after the store's commit number ``point`` of that second part, or
    just before the file's swap when there is no such commit."""
    import os
    import signal

    from tidal_actors.storage import lmdb_compact

    cfg = Config(rematerialize_after_ms=None, ledger_shards=1, history_retention_ns=10**12)
    db = TidalDb.open(path, config=cfg, clock=ManualClock(T0 + 10**12))
    for u in CRASH_USERS:
        db.assign_cohort(u, "c")
    for i, u in enumerate(CRASH_USERS):
        db.signal_with_context(u, 500 + i, 1, 1.0, timestamp_ns=T0 + i)
    db.flush()
    db.compact()
    store = db._core.store
    original = store.commit
    count = [0]

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def commit(ops):  # type: ignore[no-untyped-def]
        ops = list(ops)
        if count[0] == point and pre:
            die()
        original(ops)
        if count[0] == point and not pre:
            die()
        count[0] += 1

    store.commit = commit
    real_replace = os.replace

    def replace(src, dst):  # type: ignore[no-untyped-def]
        if point < 0:
            die()
        real_replace(src, dst)

    lmdb_compact.os.replace = replace  # type: ignore[attr-defined]
    for cohort in ("c", "@community"):
        db.request_community_purge(0, cohort)
        db.rematerialize(cohort)
    db.compact()
    die()


@pytest.mark.parametrize("point", [-1, *range(8)])
@pytest.mark.parametrize("pre", [True, False])
def test_a_crash_during_erasure_or_compaction_leaves_a_purged_or_an_intact_history(
    tmp_path, point, pre
) -> None:
    """After the SIGKILL: the other users' records all there, user 0's too in each
    cohort without a purge recorded; a re-materialization of each cohort and
    compact() then leave none of user 0's records in a cohort whose purge is
    recorded (the erasure is the re-materialization's: a purge recorded before the
    crash still gets it), and all of them in the others."""
    from ._crash_worker import forkserver

    path = str(tmp_path / "s")
    mp = forkserver()
    p = mp.Process(target=_crash_child, args=(path, point, pre))
    p.start()
    p.join(60)
    assert p.exitcode == -9, p.exitcode
    every = sorted(
        (c, u, 500 + i, 1, T0 + i) for i, u in enumerate(CRASH_USERS) for c in ("@community", "c")
    )
    cfg = Config(rematerialize_after_ms=None, ledger_shards=1, history_retention_ns=10**12)
    clock = ManualClock(T0 + 10**12)
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        purged = {m.cohort for m in db.list_purge_manifests(0)}
    got = _on_disk(path)
    assert [r for r in got if r[1] != 0] == [r for r in every if r[1] != 0]
    assert [r for r in got if r[1] == 0 and r[0] not in purged] == [
        r for r in every if r[1] == 0 and r[0] not in purged
    ]
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        for cohort in ("c", "@community"):
            db.rematerialize(cohort)
        db.compact()
    assert _on_disk(path) == [r for r in every if not (r[1] == 0 and r[0] in purged)]
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        for cohort in ("c", "@community"):
            db.request_community_purge(0, cohort)
            db.rematerialize(cohort)
        db.compact()
    assert _on_disk(path) == [r for r in every if r[1] != 0]


@pytest.mark.parametrize("membership_shards", [1, 3])
@pytest.mark.parametrize("ledger_shards", [1, 2])
@pytest.mark.parametrize("n", [2, 17, 40])
def test_a_purge_keeps_the_records_signalled_after_it(
    tmp_path, membership_shards, ledger_shards, n
) -> None:
    """Each user signals, user 0 and 2**64 - 1 are purged, everyone signals again:
    the re-materialization's erasure (which reads ``r`` against the purge's bound,
    ``r`` coded per membership shard in a merged block) drops exactly the records
    from before the purge, before and after compact() merges the history."""
    path = str(tmp_path / "s")
    cfg = Config(
        rematerialize_after_ms=None,
        ledger_shards=ledger_shards,
        membership_shards=membership_shards,
    )
    clock = ManualClock(T0 + 10**12)
    users = _users(n)
    kept = []

    def write(db: TidalDb, base: int, after: bool) -> None:
        for i, u in enumerate(users):
            for j in range(3):
                ts = T0 + base + 10 * i + j
                db.signal_with_context(u, 500 + i, 1 + j, 1.0, timestamp_ns=ts)
                if after or u not in (0, TOP):
                    kept.extend((c, u, 500 + i, 1 + j, ts) for c in ("@community", "c"))

    with TidalDb.open(path, config=cfg, clock=clock) as db:
        for u in users:
            db.assign_cohort(u, "c")
        write(db, 0, False)
        db.compact()
        write(db, 10**6, False)
        for purged in (0, TOP):
            for cohort in ("c", "@community"):
                db.request_community_purge(purged, cohort)
        write(db, 2 * 10**6, True)
        for cohort in ("c", "@community"):
            db.rematerialize(cohort)
    assert _on_disk(path) == sorted(kept)
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        db.compact()
    assert _on_disk(path) == sorted(kept)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("compacted", [False, True])
def test_an_erasure_reads_rseq_coded_per_membership_shard(seed, compacted) -> None:
    """Records of two membership shards whose rseqs are 2**40 apart: the erasure
    (which decodes only some columns to decide) drops exactly the covered records,
    and retention exactly those before its cutoff, against a plain computation;
    negative and extreme timestamps, ids 0 and 2**64 - 1, 16 and 17 users."""
    import random

    from tidal_actors.storage.format import batch_key, encode_history_columns, seal, unseal
    from tidal_actors.storage.history_compact import compact_history_ops
    from tidal_actors.storage.history_rewrite import erase_history_ops, retention_ops
    from tidal_actors.storage.stores import MemoryStore

    from ._history_scan import decode

    rng = random.Random(seed)
    users = _users(rng.choice([1, 16, 17, 30]))
    nxt = {0: 2**40, 1: 5}
    everything = []
    store = MemoryStore()
    for seq in range(rng.randrange(1, 5)):
        recs = []
        for _ in range(rng.randrange(1, 40)):
            m = rng.randrange(2)
            nxt[m] += rng.randrange(1, 3)
            ts = rng.choice([-(2**63), -1, 0, T0, 2**63 - 1, rng.randrange(-100, 100)])
            u = rng.choice(users)
            recs.append((m, nxt[m], u, rng.choice(["a", "b"]), 9, 1, 1.0, ts))
        everything += recs
        key = batch_key(0, seq)
        store.commit([("history", key, seal(key, encode_history_columns(tuple(zip(*recs)), None)))])
    if compacted:
        store.commit(compact_history_ops(store.history_items())[0])

    def on_store() -> list:
        return sorted(
            (c, u, e, t, ts)
            for k, v in store.history_items()
            for c, u, e, t, ts in decode(bytes(unseal(bytes(v), "history", k)))[0]
        )

    chosen = rng.sample(users, min(len(users), 3))
    covered = {u: rng.choice([0, 6, 2**40 + 10, 2**41]) for u in chosen}
    kept = [r for r in everything if not (r[3] == "a" and r[2] in covered and r[1] < covered[r[2]])]
    ops, erased = erase_history_ops(store.history_items(), "a", covered)
    assert erased == len(everything) - len(kept)
    store.commit(ops)
    assert on_store() == sorted((r[3], r[2], r[4], r[5], r[7]) for r in kept)
    cutoff = rng.choice([-(2**63), -1, 0, 1, T0, 2**63 - 1])
    store.commit(retention_ops(store.history_items(), cutoff))
    assert on_store() == sorted((r[3], r[2], r[4], r[5], r[7]) for r in kept if r[7] >= cutoff)


@pytest.mark.parametrize("level", [0, 1])
def test_an_erasure_of_a_batch_whose_rseq_is_coded_per_membership_shard(level) -> None:
    """Membership shard 0 climbs by ones past 1,000 while shard 1 sits near 100:
    consecutive rseqs jump by about 900 (2 bytes a delta), per shard by 1, so ``r``
    is coded per membership shard (transform 2, read by the layout). The erasure's
    decision decodes ``r`` without ``m`` unless it asks for it: covered records go,
    exactly."""
    from tidal_actors.storage.format import batch_key, seal
    from tidal_actors.storage.format.columns_encode import encode_columnar
    from tidal_actors.storage.history_rewrite import erase_history_ops
    from tidal_actors.storage.stores import MemoryStore

    from ._history_scan import transforms

    recs = [(0, 0, 5), (1, 100, 0)]  # (m, r, user)
    recs += [(0, r, TOP if r % 3 else 5) for r in range(1, 1200)]
    recs += [(1, 101 + i, 0 if i % 2 else TOP) for i in range(40)]
    cols = {
        "m": [m for m, _, _ in recs],
        "r": [r for _, r, _ in recs],
        "u": [u for _, _, u in recs],
        "e": [7] * len(recs),
        "t": [1] * len(recs),
        "w": [1.0] * len(recs),
        "ts": list(range(len(recs))),
    }
    key = batch_key(0, 0)
    payload = encode_columnar(["a"], [0] * len(recs), cols, None, level)
    assert transforms(payload)[2] == 2
    store = MemoryStore()
    store.commit([("history", key, seal(key, payload))])
    covered = {0: 120, TOP: 600}
    kept = sorted(
        ("a", u, 7, 1, i)
        for i, (m, r, u) in enumerate(recs)
        if not (u in covered and r < covered[u])
    )
    ops, erased = erase_history_ops(store.history_items(), "a", covered)
    assert erased == len(recs) - len(kept)
    store.commit(ops)
    assert _records(store) == kept


@pytest.mark.parametrize("level", [0, 1])
def test_an_erasure_of_a_cohort_past_the_256th_name(level) -> None:
    """A batch of 300 cohorts (``ci`` in 4 bytes): a purge of the 290th name drops its
    covered records only."""
    from tidal_actors.storage.format import batch_key, seal
    from tidal_actors.storage.format.columns_encode import encode_columnar
    from tidal_actors.storage.history_rewrite import erase_history_ops
    from tidal_actors.storage.stores import MemoryStore

    names = sorted(f"c{i:03d}" for i in range(300))
    recs = [(ci, u) for ci in range(300) for u in (0, TOP, 3)]
    cols = {
        "m": [0] * len(recs),
        "r": list(range(len(recs))),
        "u": [u for _, u in recs],
        "e": [7] * len(recs),
        "t": [1] * len(recs),
        "w": [1.0] * len(recs),
        "ts": [5] * len(recs),
    }
    key = batch_key(0, 0)
    store = MemoryStore()
    payload = encode_columnar(names, [c for c, _ in recs], cols, None, level)
    store.commit([("history", key, seal(key, payload))])
    covered = {0: 10**6, TOP: 10**6}
    kept = sorted(
        (names[c], u, 7, 1, 5) for c, u in recs if not (names[c] == "c290" and u in covered)
    )
    ops, erased = erase_history_ops(store.history_items(), "c290", covered)
    assert erased == 2
    store.commit(ops)
    assert _records(store) == kept


def test_an_erasure_through_a_bloom_false_positive_changes_nothing_it_should_not() -> None:
    """A user whose positions (computed here from the layout) all fall on bits that
    17 other users set: the batch of those 17 passes that user's probe and is
    decoded, and stays as it was; the user's own batch loses the covered records."""
    from tidal_actors.storage.format import batch_key, seal, unseal
    from tidal_actors.storage.format.columns_encode import encode_columnar
    from tidal_actors.storage.format.user_filter import UserProbe
    from tidal_actors.storage.history_rewrite import erase_history_ops
    from tidal_actors.storage.stores import MemoryStore

    from ._history_scan import decode

    held = [0, TOP, *range(1, 16)]  # 17 users: a Bloom filter of 256 bits
    payload = _payload(encode_columnar, held, 0)
    index = _index_of(payload)
    assert index["kind"] == 7 and len(index["filter"]) == 32
    ghost = next(
        u for u in range(10**6, 10**7) if _bloom_holds(7, index["filter"], u) and u not in held
    )
    assert UserProbe([ghost]).may_hold(7, index["filter"])  # the package agrees
    store = MemoryStore()
    keys = [batch_key(0, 0), batch_key(0, 1)]
    store.commit([("history", keys[0], seal(keys[0], payload))])
    own = _payload(encode_columnar, [ghost, 5], 100)
    store.commit([("history", keys[1], seal(keys[1], own))])
    before = dict(store.history_items())
    ops, erased = erase_history_ops(store.history_items(), "a", {ghost: 10**6})
    assert erased == 1 and [k for _, k, _ in ops] == [keys[1]]
    store.commit(ops)
    after = dict(store.history_items())
    assert after[keys[0]] == before[keys[0]]
    assert [r[1] for r in decode(bytes(unseal(after[keys[1]], "history", keys[1])))[0]] == [5]


def _records(store) -> list:  # type: ignore[no-untyped-def]
    """Every record of a store's history batches, read by the independent reader, sorted."""
    from tidal_actors.storage.format import unseal

    from ._history_scan import decode

    return sorted(
        rec
        for k, v in store.history_items()
        for rec in decode(bytes(unseal(bytes(v), "history", k)))[0]
    )


def _index_of(payload: bytes) -> dict:
    from ._history_scan import decode

    return decode(payload)[1]


def _payload(encode_columnar, users: list[int], r0: int) -> bytes:  # type: ignore[no-untyped-def]
    n = len(users)
    cols = {
        "m": [0] * n,
        "r": list(range(r0, r0 + n)),
        "u": users,
        "e": [7] * n,
        "t": [1] * n,
        "w": [1.0] * n,
        "ts": [5] * n,
    }
    return encode_columnar(["a"], [0] * n, cols, None, 0)  # type: ignore[no-any-return]


@pytest.mark.parametrize("chunk", [1, 2, 3, 256])
def test_an_erasure_and_retention_across_decode_chunks_of_mixed_versions(
    monkeypatch, chunk
) -> None:
    """Forty batches of versions 1, 2 and 3 in turn, decoded ``chunk`` at a time:
    exactly the covered records go, then exactly those before the cutoff."""
    import random

    from tidal_actors.storage import history_rewrite
    from tidal_actors.storage.format import batch_key, encode_history_columns, seal
    from tidal_actors.storage.history_rewrite import erase_history_ops, retention_ops
    from tidal_actors.storage.stores import MemoryStore

    from ._history_v1 import encode_batch

    monkeypatch.setattr(history_rewrite, "DECODE_CHUNK", chunk)
    rng = random.Random(chunk)
    users = _users(20)
    store = MemoryStore()
    everything = []
    r = 0
    for seq in range(40):
        recs = []
        for _ in range(rng.randrange(1, 6)):
            r += 1
            recs.append(
                (0, r, rng.choice(users), rng.choice(["a", "b"]), 7, 1, 1.0, rng.randrange(-50, 50))
            )
        everything += recs
        key = batch_key(0, seq)
        version = (1, 2, 3)[seq % 3]
        payload = (
            encode_batch(recs, None)
            if version == 1
            else encode_history_columns(tuple(zip(*recs)), None, version=version)
        )
        store.commit([("history", key, seal(key, payload))])

    def on_store() -> list:
        return _records(store)

    covered = {0: r // 2, TOP: r, 7: 10**9}
    kept = [x for x in everything if not (x[3] == "a" and x[2] in covered and x[1] < covered[x[2]])]
    ops, erased = erase_history_ops(store.history_items(), "a", covered)
    assert erased == len(everything) - len(kept)
    store.commit(ops)
    assert on_store() == sorted((x[3], x[2], x[4], x[5], x[7]) for x in kept)
    store.commit(retention_ops(store.history_items(), 0))
    assert on_store() == sorted((x[3], x[2], x[4], x[5], x[7]) for x in kept if x[7] >= 0)


def test_a_purged_records_context_leaves_the_history_and_the_others_stay(tmp_path) -> None:
    """Every signal carries a context naming its user; the purged user's contexts
    are gone from data.mdb's bytes after the re-materialization and compact(), and
    every other record still carries its own (read by the independent reader)."""
    path = str(tmp_path / "s")
    cfg = Config(rematerialize_after_ms=None, ledger_shards=1)
    clock = ManualClock(T0 + 10**12)
    users = _users(20)
    secret = "PURGED-CONTEXT-7f3a9c"
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        for u in users:
            db.assign_cohort(u, "c")
        for i, u in enumerate(users):
            note = secret if u == 0 else f"note of {u}"
            db.signal_with_context(u, 500 + i, 1, 1.0, timestamp_ns=T0 + i, context={"n": note})
            if i % 4 == 0:
                db.flush()
        db.compact()
        db.signal_with_context(0, 9, 1, 1.0, timestamp_ns=T0, context={"n": secret})
        for cohort in ("c", "@community"):
            db.request_community_purge(0, cohort)
            db.rematerialize(cohort)
        db.compact()
    assert secret.encode() not in (tmp_path / "s" / "data.mdb").read_bytes()
    got = []
    for recs, index in history(path).values():
        for i, rec in enumerate(recs):
            got.append((rec[1], index["contexts"].get(i)))
    assert sorted(got) == sorted(
        (u, {"n": f"note of {u}"}) for u in users if u != 0 for _ in ("c", "@community")
    )
