"""Issue 8: a full LMDB map, and the LMDB field cases around it.

* The map starts small and doubles (up to ``max_map_size_bytes``) when a transaction
  does not fit; the whole transaction is retried, so after a restart every record
  of the batch is there exactly once.
* Past the maximum the caller of a control operation gets `StorageFull` and nothing
  changed; failed signal history writes are reported by ``flush()`` (as StorageFull).
* ``set_mapsize`` invalidates read transactions open at that moment: growth never
  overlaps the store's own reads.
* A read transaction left open keeps freed pages from being reused (the file grows
  although the live size is flat); the store leaves none open.
* Reader slots of killed processes are freed at open (``reader_check``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import threading

import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, Signal, StorageError, StorageFull, TidalDb
from tidal_actors.storage.stores import LmdbStore

from . import _crash_worker as W
from .conftest import T0

KIB = 1024


def _export(db, users, at=T0):
    return (
        db.aggregate_rows(at),
        [
            (
                db.community_layer_status(u),
                db.community_leave_history(u),
                db.cohorts_of(u),
                db.list_purge_manifests(u),
            )
            for u in users
        ],
    )


def _count(db, cohort, entities, at=T0):
    return sum(db.read_window(cohort, e, 1, at).count for e in range(entities))


def test_map_doubles_and_a_retried_batch_is_there_exactly_once(pdb_path):
    cfg = Config(map_size_bytes=64 * KIB, max_map_size_bytes=16 * 1024 * KIB, ledger_shards=2)
    n = 50_000
    rng = random.Random(1)
    weights = [rng.random() * 1000 for _ in range(n)]  # 4 bytes a record that LZ4 keeps
    clock = ManualClock(T0)
    with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
        store = db._core.store
        seen = [store.map_size]
        grow = store._grow

        def watch():
            grow()
            seen.append(store.map_size)

        store._grow = watch
        db.assign_cohort(1, "c")
        # one call: the persistence actor takes these writes in few large transactions,
        # each hits MapFullError mid-way, is rolled back whole, and retried after growth
        db.signal_batch([Signal(1, i % 50, 1, weights[i], T0) for i in range(n)])
        db.flush()
        assert seen[0] == 64 * KIB and len(seen) >= 4
        assert all(b == 2 * a for a, b in itertools.pairwise(seen)), seen
        assert store.env.info()["map_size"] == seen[-1]
        assert _count(db, "c", 50) == n
    # a different ledger shard count makes the reopen replay the history (no snapshot)
    with TidalDb.open(pdb_path, config=cfg.replace(ledger_shards=3), clock=clock) as db:
        assert _count(db, "c", 50) == n and _count(db, COMMUNITY, 50) == n
    with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
        assert _count(db, "c", 50) == n


def _fill_until_full(db, batch=200):
    """Signals of user 1 (cohort c) in flushed batches until a flush reports StorageFull."""
    ok = 0
    for _ in range(10_000):
        db.signal_batch([Signal(1, i % 10, 1, 1.0, T0) for i in range(batch)])
        try:
            db.flush()
        except StorageFull as exc:
            assert isinstance(exc.__cause__, StorageFull)
            return ok
        ok += batch
    raise AssertionError("the map never filled")


def test_past_the_maximum_control_ops_raise_storage_full_and_change_nothing(pdb_path):
    cfg = Config(map_size_bytes=64 * KIB, max_map_size_bytes=256 * KIB)
    clock = ManualClock(T0)
    db = TidalDb.open(pdb_path, config=cfg, clock=clock)
    try:
        db.assign_cohort(1, "c")
        flushed = _fill_until_full(db)
        assert flushed > 0 and db._core.store.map_size == 256 * KIB
        db.flush()  # the failure was reported once
        before = _export(db, [1, 2])
        # a purge of thousands of records needs a manifest that cannot fit
        with pytest.raises(StorageFull):
            db.request_community_purge(1, "c")
        assert _export(db, [1, 2]) == before
        # cohort lists grow with each assign until one does not fit
        acknowledged = set()
        with pytest.raises(StorageFull):
            for i in range(1000):
                name = f"cohort-{i:04d}-" + "x" * 180
                db.assign_cohort(2, name)
                acknowledged.add(name)
        assert db.cohorts_of(2) == acknowledged
        full = _export(db, [1, 2])
        with pytest.raises(StorageFull):
            db.assign_cohort(2, "y" * 200)
        assert _export(db, [1, 2]) == full
    finally:
        with contextlib.suppress(StorageError):  # see test_close_on_a_full_store_does_not_raise
            db.close()
    # with room to grow, the store holds exactly what was acknowledged
    with TidalDb.open(
        pdb_path, config=cfg.replace(max_map_size_bytes=8 * 1024 * KIB), clock=clock
    ) as db:
        assert db.cohorts_of(2) == acknowledged
        assert db.list_purge_manifests(1) == []
        c = _count(db, "c", 10)
        assert c in (flushed, flushed + 200)  # the batch whose write failed: all or nothing
        _, manifest = db.request_community_purge(1, "c")
        assert len(manifest.entries) == c and _count(db, "c", 10) == 0


def test_close_on_a_full_store_does_not_raise(pdb_path):
    cfg = Config(map_size_bytes=64 * KIB, max_map_size_bytes=256 * KIB)
    db = TidalDb.open(pdb_path, config=cfg, clock=ManualClock(T0))
    _fill_until_full(db)
    db.close()


def test_growth_never_invalidates_a_concurrent_read(pdb_path):
    """``set_mapsize`` invalidates read transactions open at that moment; growth and
    the store's reads from other threads (``raw_get``) are serialized."""
    from tidal_actors.storage.format import Keyspace, Tag, encode_key

    cfg = Config(map_size_bytes=64 * KIB, max_map_size_bytes=64 * 1024 * KIB)
    store = LmdbStore(pdb_path, cfg)
    try:
        key = encode_key(1, Tag.COHORT_ASSIGNMENT)
        store.commit([(Keyspace.USERS.value, key, b"v")])
        stop = threading.Event()
        errors: list[BaseException] = []

        def reader():
            while not stop.is_set():
                try:
                    assert store.raw_get(Keyspace.USERS, key) == b"v"
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        for i in range(60):
            store.commit(
                [
                    (
                        Keyspace.HISTORY.value,
                        encode_key(0, Tag.CONTRIBUTION_BATCH, i.to_bytes(8, "big")),
                        os.urandom(64 * KIB),
                    )
                ]
            )
        stop.set()
        for t in threads:
            t.join()
        assert store.map_size > 64 * KIB
        assert errors == []
    finally:
        store.close()


# -- a read transaction left open --------------------------------------------------------


def _churn(store, rounds, size=16 * KIB):
    """Rewrite and delete the same few keys: the live size stays flat."""
    from tidal_actors.storage.format import Keyspace, Tag, encode_key

    for i in range(rounds):
        key = encode_key(i % 4, Tag.CONTRIBUTION_BATCH, b"\x00" * 8)
        store.commit([(Keyspace.HISTORY.value, key, os.urandom(size))])
        store.commit([(Keyspace.HISTORY.value, key, None)])


def test_a_read_transaction_left_open_grows_the_store_until_full(tmp_path):
    """The field case: freed pages are not reused while an older reader is open."""
    cfg = Config(map_size_bytes=2048 * KIB, max_map_size_bytes=2048 * KIB)
    store = LmdbStore(tmp_path / "a", cfg)
    try:
        _churn(store, 30)
        flat = store.env.info()["last_pgno"]
        _churn(store, 30)
        assert store.env.info()["last_pgno"] <= flat + 8  # freed pages are reused
        leaked = store.env.begin()  # what a forgotten reader does
        with pytest.raises(StorageFull):
            _churn(store, 1000)
        leaked.abort()
        _churn(store, 30)  # the reader gone, the same space serves again
    finally:
        store.close()


def _active_readers(env):
    """Reader-table rows holding a snapshot (an inactive slot shows txnid ``-``)."""
    rows = env.readers().splitlines()[1:]
    return [r for r in rows if r.split() and r.split()[-1] != "-"]


def test_the_database_leaves_no_read_transaction_open(pdb_path):
    """Through every kind of write and delete (assign/unassign, purge and its
    re-materialization that erases history, snapshot deleted at open and written at
    close), no read transaction is open when the persistence actor commits, so freed
    pages can always be reused."""
    cfg = Config(
        map_size_bytes=256 * KIB, max_map_size_bytes=64 * 1024 * KIB, rematerialize_after_ms=0
    )
    clock = ManualClock(T0)
    checked = [0]
    for _ in range(3):
        with TidalDb.open(pdb_path, config=cfg, clock=clock) as db:
            store = db._core.store
            commit = store.commit

            def checking(ops, commit=commit, env=store.env, lock=store._env_lock):
                # under the environment's lock, as the commit itself: the ledgers'
                # short reads of the history (re-materialization, reads inside
                # settled buckets) take it too, so none is open while a commit runs
                with lock:
                    assert _active_readers(env) == [], env.readers()
                    checked[0] += 1
                    commit(ops)

            store.commit = checking
            for i in range(30):
                db.assign_cohort(i % 5, "c")
                db.signal_batch([Signal(i % 5, e, 1, 1.0, T0) for e in range(20)])
                db.request_community_purge(i % 5, "c")
                db.unassign_cohort(i % 5, "c")
                clock.advance(1)
            db.rematerialize("c")
            db.flush()
            assert db.stats()["handler_errors"] == 0
            assert _active_readers(store.env) == []
    assert checked[0] > 100


# -- reader slots of killed processes -------------------------------------------------------


def test_reader_slots_of_killed_processes_are_freed_at_open(pdb_path):
    """While another process keeps the environment open, LMDB does not reset its
    reader table, so slots of a process killed inside read transactions stay taken.
    Each open frees them (``reader_check``): five kills leaving 40 slots each would
    exhaust the 126 slots otherwise."""
    ctx = W.forkserver()
    TidalDb.open(pdb_path).close()
    ready = ctx.Event()
    holder = ctx.Process(target=W.hold_env_open, args=(pdb_path, ready), daemon=True)
    holder.start()
    try:
        assert ready.wait(30)
        for _ in range(5):
            ready = ctx.Event()
            p = ctx.Process(target=W.die_holding_readers, args=(pdb_path, 40, ready), daemon=True)
            p.start()
            assert ready.wait(30)
            p.kill()
            p.join()
            with TidalDb.open(pdb_path) as db:
                assert db._core.store.stale_readers == 40
                db.assign_cohort(1, "c")
                assert db.cohorts_of(1) == {"c"}
    finally:
        holder.kill()
        holder.join()
