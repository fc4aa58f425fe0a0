"""The ``shards`` store layout (`storage.layout`, `storage.sharded`): one LMDB
environment per shard, the same keys and values, the same restore.

Checked here: seeded workloads with reopens against the reference model; each key in
the environment its owner names (computed here from the spec's key layout and the
Fibonacci hash, not from the code's router); the format record; a store keeping its
layout whatever the config says; damage (a missing environment, a later format)
refused with nothing written; a commit spanning environments committing its parts in
order; a read-only open; more ledger shards at a reopen.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import lmdb
import msgpack
import pytest

from tidal_actors import Config, ManualClock, StorageError, TidalDb
from tidal_actors.storage.format import Keyspace, Tag, encode_key
from tidal_actors.storage.lmdb_env import LmdbStore
from tidal_actors.storage.sharded import ShardedStore, open_store
from tidal_actors.testing import ReferenceModel

from ._differential import assert_matches, random_op, rows_mismatch
from .conftest import SEC, T0
from .test_differential import MIX  # the differential suite's mix of operations, reopens too


def _config(m: int, lshards: int, cap: int = 40) -> Config:
    return Config(
        half_life_ns=30 * SEC,
        window_width_ns=10 * SEC,
        window_buckets=4,
        max_contribution_log_entries=cap,
        membership_shards=m,
        ledger_shards=lshards,
        rematerialize_after_ms=None,
        store_layout="shards",
    )


def _mshard(user: int, shards: int) -> int:
    """Membership shard of ``user``, by hand: Fibonacci hashing of the 64-bit id
    (DESIGN.md "Sharding"): the high 32 bits of ``user * 0x9E3779B97F4A7C15 mod 2**64``."""
    return (((user * 0x9E3779B97F4A7C15) % 2**64) >> 32) % shards


def _env_items(path: Path, name: str) -> dict[str, list[bytes]]:
    """Every key of each keyspace of environment ``name``, read with plain py-lmdb."""
    env = lmdb.open(str(path / "shards" / name), readonly=True, max_dbs=8, lock=False)
    try:
        out: dict[str, list[bytes]] = {}
        for ks in Keyspace:
            db = env.open_db(ks.value.encode(), create=False)
            with env.begin(db=db) as txn:
                out[ks.value] = [bytes(k) for k, _ in txn.cursor()]
        return out
    finally:
        env.close()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shards", [(2, 3), (3, 1)])
def test_a_seeded_workload_on_the_shards_layout_matches_the_reference(
    seed: int, shards: tuple[int, int], tmp_path: Path
) -> None:
    rng = random.Random(100 + seed)
    cfg = _config(*shards)
    clock, rclock = ManualClock(T0), ManualClock(T0)
    ref = ReferenceModel(cfg, rclock, history=True)
    path = tmp_path / "s"
    db = TidalDb.open(path, config=cfg, clock=clock)
    try:
        for step in range(300):
            if random_op(db, ref, rng, (clock, rclock), MIX) == "reopen":
                db.close()
                # a reopen whose config asks for the other layout: the store keeps its own
                again = cfg.replace(store_layout="single" if step % 2 else None)
                db = TidalDb.open(path, config=again, clock=clock)
            if step % 75 == 74:
                bad = rows_mismatch(db.aggregate_rows(), ref.aggregate_rows())
                assert bad is None, f"step {step}: {bad}"
        assert_matches(db, ref, range(6), ats=(None, T0 + 17 * SEC), exact_ids=False)
    finally:
        db.close()
    assert not (path / "data.mdb").exists()
    with TidalDb.open(path, config=cfg, clock=clock, read_only=True) as ro:
        assert_matches(ro, ref, range(6), ats=(None,), exact_ids=False)


def test_each_key_lives_in_the_environment_of_its_shard(tmp_path: Path) -> None:
    m, nl = 3, 2
    cfg = _config(m, nl)
    path = tmp_path / "s"
    users = list(range(1, 13))
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        for u in users:
            db.assign_cohort(u, f"c{u % 5}")
            db.signal_with_context(u, 7, 1, 1.0, T0)
        db.leave_community_layer(4)
        _, manifest = db.request_community_purge(5, "c0")
        assert len(manifest.entries) == 1  # user 5's one record in c0 (its only cohort)
        db.flush()
    names = sorted(p.name for p in (path / "shards").iterdir())
    assert names == ["coordinator", "ledger-0", "ledger-1", "membership-0", "membership-1",
                     "membership-2"]  # fmt: skip
    envs = {n: _env_items(path, n) for n in names}
    # users: each user's records in its membership shard's environment only
    for i in range(m):
        ids = {int.from_bytes(k[:8], "big") for k in envs[f"membership-{i}"]["users"]}
        assert ids == {u for u in users if _mshard(u, m) == i}
        for ks in ("items", "history"):
            assert envs[f"membership-{i}"][ks] == []
    # history: ledger j's batches (entity = shard j) in ledger-j's environment only
    total = 0
    for j in range(nl):
        keys = envs[f"ledger-{j}"]["history"]
        assert {int.from_bytes(k[:8], "big") for k in keys} <= {j}
        assert all(k[9] == Tag.CONTRIBUTION_BATCH for k in keys)
        total += len(keys)
        assert envs[f"ledger-{j}"]["users"] == envs[f"ledger-{j}"]["items"] == []
    assert total >= 1
    # the purge's manifest, tombstone and status, and its watermark, in the coordinator's
    items = envs["coordinator"]["items"]
    assert sorted({k[9] for k in items}) == [Tag.PURGE_MANIFEST, Tag.PURGE_TOMBSTONE,
                                             Tag.PURGE_STATUS]  # fmt: skip
    assert {int.from_bytes(k[:8], "big") for k in items} == {5}
    meta_tags = {k[9] for k in envs["coordinator"]["meta"]}
    assert {Tag.STORE_META, Tag.EVICTION_STATE, Tag.STORE_SETTINGS} <= meta_tags
    assert envs["coordinator"]["users"] == envs["coordinator"]["history"] == []
    # the format record: format 2, the layout, the counts
    env = lmdb.open(str(path / "shards" / "coordinator"), readonly=True, max_dbs=8, lock=False)
    with env.begin(db=env.open_db(b"meta", create=False)) as txn:
        record = msgpack.unpackb(txn.get(encode_key(0, Tag.STORE_META)))
    env.close()
    assert record == {
        "format": 2,
        "membership_shards": m,
        "layout": "shards",
        "ledger_envs": nl,
        "history_ledgers": nl,  # every history batch written under nl ledgers
    }


def test_a_snapshot_at_close_lands_in_the_ledgers_environments_with_its_mark_last(
    tmp_path: Path,
) -> None:
    cfg = _config(1, 2)
    path = tmp_path / "s"
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        for u in range(8):
            db.assign_cohort(u, f"c{u}")
            db.signal_with_context(u, 3, 1, 2.0, T0)
    for j in range(2):
        meta = _env_items(path, f"ledger-{j}")["meta"]
        assert meta and all(k[9] == Tag.SNAPSHOT_CHUNK and k[:8] == j.to_bytes(8, "big")
                            for k in meta if k[9] != Tag.LINK_STATE)  # fmt: skip
    assert Tag.SNAPSHOT_MARK in {k[9] for k in _env_items(path, "coordinator")["meta"]}
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        assert [db.read_decay_score(f"c{u}", 3, 1, T0) for u in range(8)] == [2.0] * 8


def test_a_missing_environment_is_refused_and_nothing_is_made(tmp_path: Path) -> None:
    cfg = _config(2, 2)
    path = tmp_path / "s"
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "a")
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    shutil.rmtree(path / "shards" / "membership-1")
    with pytest.raises(StorageError, match="no shards/membership-1 environment"):
        TidalDb.open(path, config=cfg)
    assert not (path / "shards" / "membership-1").exists()
    coordinator = tmp_path / "no-coordinator"
    shutil.copytree(copy, coordinator)
    shutil.rmtree(coordinator / "shards" / "coordinator")  # the format record's: the same
    with pytest.raises(StorageError, match="no shards/coordinator environment"):
        TidalDb.open(coordinator, config=cfg)
    assert not (coordinator / "shards" / "coordinator").exists()
    with pytest.raises(StorageError, match="no shards/coordinator environment"):
        TidalDb.open(coordinator, config=cfg, read_only=True)
    shutil.rmtree(copy / "shards" / "ledger-0")  # a ledger's the record names: the same
    (copy / "shards" / "ledger-0").mkdir()
    with pytest.raises(StorageError, match="no shards/ledger-0 environment"):
        TidalDb.open(copy, config=cfg)
    assert list((copy / "shards" / "ledger-0").iterdir()) == []


def test_a_later_format_and_a_single_environment_reader_are_refused(tmp_path: Path) -> None:
    cfg = _config(1, 1)
    path = tmp_path / "s"
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "a")
    # what a version without layouts does: open the directory as one environment
    with pytest.raises(StorageError, match="damaged"):
        LmdbStore(path, cfg).close()
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:  # still whole
        assert db.cohorts_of(1) == frozenset({"a"})
    store = ShardedStore(path, cfg)
    key = encode_key(0, Tag.STORE_META)
    record = msgpack.unpackb(store.raw_get(Keyspace.META, key))
    store.commit([(Keyspace.META.value, key, msgpack.packb({**record, "format": 3}))])
    store.close()
    with pytest.raises(StorageError, match="format 3, by a later version"):
        TidalDb.open(path, config=cfg)


def test_a_commit_over_environments_commits_its_parts_in_order(tmp_path: Path) -> None:
    cfg = _config(1, 2)
    store = ShardedStore(tmp_path / "s", cfg)
    try:
        first = (Keyspace.META.value, encode_key(1, Tag.SNAPSHOT_CHUNK, b"\0\0\0\0"), b"x")
        second = (Keyspace.META.value, encode_key(0, Tag.SNAPSHOT_MARK), b"\x80")

        def refuse(ops: list[object]) -> None:
            raise StorageError("refused by the test")

        store.envs["coordinator"].fault = refuse
        with pytest.raises(StorageError, match=r"coordinator; the parts for ledger-1 committed"):
            store.commit([first, second])
        assert store.raw_get(Keyspace.META, first[1]) == b"x"  # the first part stayed
        assert store.raw_get(Keyspace.META, second[1]) is None
        store.envs["coordinator"].fault = None
        store.commit([second, first])  # the other order: the mark's environment first
        assert store.raw_get(Keyspace.META, second[1]) == b"\x80"
    finally:
        store.close()


def test_more_ledger_shards_at_a_reopen_and_back(tmp_path: Path) -> None:
    path = tmp_path / "s"
    clock, rclock = ManualClock(T0), ManualClock(T0)
    cfg2 = _config(1, 2, cap=1_000)
    ref = ReferenceModel(cfg2, rclock, history=True)
    rng = random.Random(7)
    for ls, envs in ((2, 2), (4, 4), (2, 4)):  # a ledger's environment, once made, stays
        cfg = cfg2.replace(ledger_shards=ls)
        with TidalDb.open(path, config=cfg, clock=clock) as db:
            for _ in range(60):
                random_op(db, ref, rng, (clock, rclock), (*MIX[:-2], (1.0, "advance")))
            assert_matches(db, ref, range(6), ats=(None,), exact_ids=False)
        store = open_store(path, cfg)
        record = msgpack.unpackb(store.raw_get(Keyspace.META, encode_key(0, Tag.STORE_META)))
        store.close()
        assert record["ledger_envs"] == envs
        assert sorted(p.name for p in (path / "shards").glob("ledger-*")) == [
            f"ledger-{j}" for j in range(envs)
        ]
    with TidalDb.open(path, config=cfg2, clock=clock) as db:
        assert_matches(db, ref, range(6), ats=(None,), exact_ids=False)


def test_a_group_commit_commits_each_environment_and_retries_only_a_failed_ones_writes(
    tmp_path: Path,
) -> None:
    """`commit_writes` (the persistence actor's group commit): each environment's
    writes in one transaction, all at the same time; when one environment's
    transaction fails, only its writes are tried again one by one (each gets its own
    outcome), and a write whose environment committed is done: it is never retried
    nor reported failed (its writer would be told nothing changed while the store
    holds it)."""
    from tidal_actors import StorageFull

    cfg = _config(2, 2)
    store = ShardedStore(tmp_path / "s", cfg)
    try:
        users = [encode_key(u, Tag.COHORT_ASSIGNMENT) for u in range(1, 9)]
        assert {_mshard(u, 2) for u in range(1, 9)} == {0, 1}  # both membership shards
        chunks = [encode_key(j, Tag.SNAPSHOT_CHUNK, b"\0\0\0\1") for j in range(2)]
        status = encode_key(3, Tag.PURGE_STATUS, bytes(16))
        writes = [[(Keyspace.USERS.value, k, b"u")] for k in users]
        writes += [[(Keyspace.META.value, k, b"c")] for k in chunks]
        writes.append([(Keyspace.ITEMS.value, status, b"s")])
        assert store.commit_writes(writes) == [None] * len(writes)
        for ((ks, key, value),) in writes:
            assert store.raw_get(Keyspace(ks), key) == value
        calls: list[int] = []

        def full_once(ops: list[object]) -> None:
            calls.append(len(ops))
            if len(calls) == 1:  # the group's transaction here; its retries pass
                raise StorageFull("no room (test)")

        store.envs["ledger-1"].fault = full_once
        retried: list[int] = []

        def count(ops: list[object]) -> None:
            retried.append(len(ops))

        store.envs["membership-0"].fault = count
        deletes = [[(ks, key, None) for ks, key, _ in w] for w in writes]
        assert store.commit_writes(deletes) == [None] * len(deletes)
        assert calls == [1, 1]  # ledger-1: its one write failed in the group, then passed
        assert len(retried) == 1  # membership-0's group committed once, nothing retried
        assert all(store.raw_get(Keyspace(ks), key) is None for ((ks, key, _),) in writes)

        def always(ops: list[object]) -> None:
            raise StorageFull("no room (test)")

        store.envs["ledger-1"].fault = always
        out = store.commit_writes(writes)
        failed = [i for i, e in enumerate(out) if e is not None]
        assert failed == [9] and isinstance(out[9], StorageFull)  # ledger-1's chunk alone
        assert store.raw_get(Keyspace.META, chunks[1]) is None
        assert store.raw_get(Keyspace.META, chunks[0]) == b"c"
        assert all(store.raw_get(Keyspace.USERS, k) == b"u" for k in users)
    finally:
        store.close()


def test_the_database_says_which_layout_its_store_has(tmp_path: Path) -> None:
    with TidalDb.open(tmp_path / "a", config=Config(store_layout="shards")) as db:
        assert db.store_layout == "shards"
    with TidalDb.open(tmp_path / "a", config=Config(store_layout="single")) as db:
        assert db.store_layout == "shards"  # the store's own, not the config's
    with TidalDb.open(tmp_path / "a", read_only=True) as db:
        assert db.store_layout == "shards"
    with TidalDb.open(tmp_path / "b") as db:  # the pykka host's default
        assert db.store_layout == "single"
    with TidalDb.open(None) as db:
        assert db.store_layout is None
