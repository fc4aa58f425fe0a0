"""A ledger's part of a ``shards`` store (`storage.shard_part`): what a ledger
restarting in place restores from (its own environment and the coordinator's
records), checked against the restore that reads the whole store, which the restore
and crash tests check against the reference model."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tidal_actors import Config, ManualClock, TidalDb
from tidal_actors.runtime.restore import build_states
from tidal_actors.storage.format import Keyspace, Tag, encode_key
from tidal_actors.storage.format.snapshot import encode_ledger
from tidal_actors.storage.layout import COORDINATOR, ledger_env
from tidal_actors.storage.shard_part import coordinator_part, ledger_part, self_contained

from .conftest import T0

HOUR = 3_600_000_000_000


def _cfg(**kw: Any) -> Config:
    base: dict[str, Any] = {
        "membership_shards": 2,
        "ledger_shards": 3,
        "store_layout": "shards",
        "max_contribution_log_entries": 400,  # evictions: watermarks to filter by
    }
    return Config(**{**base, **kw})


def _workload(db: TidalDb, seed: int) -> int:
    """Assigns, signals over 30 hours (bucket moves), leaves, rejoins and purges
    drawn from ``seed``; returns how many purges retracted something."""
    rng = random.Random(seed)
    cohorts = [f"c{k}" for k in range(7)]
    for u in range(40):
        for c in rng.sample(cohorts, rng.randint(1, 3)):
            db.assign_cohort(u, c)
    purged = 0
    for step in range(600):
        u = rng.randrange(40)
        db.signal_with_context(
            u, rng.randrange(30), rng.randint(1, 3), rng.uniform(0.5, 3), T0 + step * HOUR // 20
        )
        if step % 50 == 49:
            v = rng.randrange(40)
            _, manifest = db.request_community_purge(v, rng.choice(cohorts))
            purged += bool(manifest.entries)
        elif step % 70 == 69:
            db.leave_community_layer(rng.randrange(40))
        elif step % 90 == 89:
            db.rejoin_community_layer(rng.randrange(40))
    db.flush()
    return purged


class _Poison:
    """Stands in for another shard's environment: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"another shard's environment was used ({name})")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_ledgers_part_restores_what_the_whole_store_restores(tmp_path: Path, seed: int) -> None:
    """For every ledger, the state restored from its own environment and the
    coordinator's records is the one restored from the whole store (encoded as a
    snapshot, byte for byte), and no other shard's environment is touched."""
    cfg = _cfg()
    db = TidalDb.open(str(tmp_path / "db"), config=cfg, clock=ManualClock(T0))
    try:
        assert _workload(db, seed) > 0  # tombstones to filter by
        store = db._core.store
        whole = store.load()
        assert whole.tombstones and whole.eviction and whole.batches
        coord = coordinator_part(store)
        assert coord is not None and self_contained(coord, cfg.ledger_shards)
        # the manifests stay at the coordinator's process: a ledger restores nothing from them
        assert all(key[9] != Tag.PURGE_MANIFEST for key, _ in coord[Keyspace.ITEMS.value])
        for i in range(cfg.ledger_shards):
            expected = build_states(cfg, store.load(), store, ledgers=(i,))[1][i]
            others = {n: e for n, e in store.envs.items() if n not in (ledger_env(i),)}
            store.envs.update({n: _Poison() for n in others})
            try:
                part = ledger_part(store, i, coord, cfg.ledger_shards)
            finally:
                store.envs.update(others)
            assert part is not None
            assert {b.shard for b in part.batches} == {i}
            assert len(part.batches) == sum(b.shard == i for b in whole.batches)
            got = build_states(cfg, part, store, ledgers=(i,))[1][i]
            assert got.batch_seq == expected.batch_seq > 0
            assert encode_ledger(got) == encode_ledger(expected)
    finally:
        db.close()


def _history_ledgers(path: Path) -> Any:
    import lmdb

    env = lmdb.open(str(path / "shards" / COORDINATOR), max_dbs=8, readonly=True, lock=False)
    try:
        with env.begin(db=env.open_db(Keyspace.META.value.encode(), create=False)) as txn:
            raw = txn.get(encode_key(0, Tag.STORE_META))
    finally:
        env.close()
    return msgpack.unpackb(raw).get("history_ledgers")


def test_a_store_opened_under_another_ledger_count_is_not_self_contained(tmp_path: Path) -> None:
    """The format record says the ledger count every history batch was written
    under (3 here); once the store opens under 2, batches of a cohort may lie in
    another ledger's environment: 0 from then on, also after a reopen under 3, and
    a ledger's part is refused (None: the restart reads the whole store)."""
    path = tmp_path / "db"
    db = TidalDb.open(str(path), config=_cfg(), clock=ManualClock(T0))
    db.assign_cohort(1, "red")
    db.signal_with_context(1, 7, 1, 2.0, T0)
    db.close()
    assert _history_ledgers(path) == 3
    for ledgers in (2, 3):
        db = TidalDb.open(str(path), config=_cfg(ledger_shards=ledgers), clock=ManualClock(T0))
        assert db.read_decay_score("red", 7, 1, T0) == 2.0  # reshard: the record is read
        store = db._core.store
        coord = coordinator_part(store)
        assert coord is not None and not self_contained(coord, ledgers)
        assert ledger_part(store, 0, coord, ledgers) is None
        db.close()
        assert _history_ledgers(path) == 0


def test_the_coordinator_part_of_a_single_store_is_none(tmp_path: Path) -> None:
    db = TidalDb.open(
        str(tmp_path / "db"), config=_cfg(store_layout="single"), clock=ManualClock(T0)
    )
    try:
        assert coordinator_part(db._core.store) is None
    finally:
        db.close()


def test_a_membership_shards_and_the_coordinators_parts_restore_what_the_whole_store_restores(
    tmp_path: Path,
) -> None:
    """A membership shard's part (its environment and the coordinator's records)
    restores its users' memberships, leave epochs and cohorts as the whole store
    does, without another shard's environment; it numbers records above the
    eviction state and the tombstones, and the ledgers' answers (what they hold,
    here the history's highest rseq of the shard) raise it to the whole store's.
    The coordinator's own environment restores its whole state (watermarks, drained
    records, purge statuses, manifests, the last purge id)."""
    from tidal_actors.storage.layout import membership_env
    from tidal_actors.storage.shard_part import own_part

    cfg = _cfg()
    db = TidalDb.open(str(tmp_path / "db"), config=cfg, clock=ManualClock(T0))
    try:
        _workload(db, 4)
        store = db._core.store
        whole_restored = store.load()
        coord = coordinator_part(store)
        assert coord is not None
        for i in range(cfg.membership_shards):
            whole = build_states(cfg, store.load(), None, ledgers=())[0][i]
            keep = (membership_env(i),)
            others = {n: e for n, e in store.envs.items() if n not in keep}
            store.envs.update({n: _Poison() for n in others})
            try:
                part = own_part(store, membership_env(i), coord)
            finally:
                store.envs.update(others)
            assert not part.batches
            got = build_states(cfg, part, None, ledgers=())[0][i]
            assert got.status == whole.status and len(got.status) > 0
            assert got.history == whole.history and got.cohorts == whole.cohorts
            held = max(int(r) for b in whole_restored.batches for m, r in zip(b.m, b.r) if m == i)
            assert got.next_rseq <= whole.next_rseq == max(got.next_rseq, held + 1)
        want = build_states(cfg, store.load(), None, ledgers=())[2]
        others = {n: e for n, e in store.envs.items() if n != COORDINATOR}
        store.envs.update({n: _Poison() for n in others})
        try:
            part = own_part(store, COORDINATOR)
        finally:
            store.envs.update(others)
        got_c = build_states(cfg, part, None, ledgers=())[2]
        assert got_c.manifests == want.manifests and len(got_c.manifests) > 0
        assert got_c.statuses == want.statuses and got_c.last_purge_id == want.last_purge_id > 0
        assert got_c.watermarks == want.watermarks and any(got_c.watermarks)
        assert [d.tolist() for d in got_c.drained] == [d.tolist() for d in want.drained]
    finally:
        db.close()
