"""Adversarial checks of a shard's part of a ``shards`` store (`storage.shard_part`)
and of a shard's own group commit (`runtime.ray_control.ControlCommits`), without
Ray: other shard counts, seeds and operations (compaction with retention, rebuilds
erasing history, a close's snapshot, reshards) than `test_shard_part.py`; each
shard's part is checked against the restore of the whole store as an open does it
(every shard built), which the restore and crash tests check against the
reference model."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidal_actors import Config, ManualClock, TidalDb
from tidal_actors._errors import StorageError
from tidal_actors.actors import messages as M
from tidal_actors.runtime.ray_control import ControlCommits
from tidal_actors.runtime.ray_stores import actor_store
from tidal_actors.runtime.restore import build_states
from tidal_actors.storage.format import Keyspace, Tag, encode_key
from tidal_actors.storage.format.snapshot import encode_ledger
from tidal_actors.storage.layout import COORDINATOR, ledger_env, membership_env
from tidal_actors.storage.shard_part import coordinator_part, ledger_part, own_part
from tidal_actors.storage.sharded import ShardedStore

from .conftest import T0

HOUR = 3_600_000_000_000


def _cfg(nm: int, nl: int, **kw: Any) -> Config:
    base: dict[str, Any] = {
        "membership_shards": nm,
        "ledger_shards": nl,
        "store_layout": "shards",
        "max_contribution_log_entries": 300,
        "rematerialize_after_ms": None,  # rebuilds run when the test says
    }
    return Config(**{**base, **kw})


def _workload(db: TidalDb, seed: int, steps: int, extras: bool) -> None:
    """Assigns, signals, unassigns, leaves, rejoins and purges drawn from ``seed``;
    with ``extras`` also rebuilds (which erase purged records from the history) and
    a compaction (which merges history batches, and drops old ones under
    retention)."""
    rng = random.Random(seed)
    cohorts = [f"k{k}" for k in range(9)]
    users = 30
    for u in range(users):
        for c in rng.sample(cohorts, rng.randint(1, 3)):
            db.assign_cohort(u, c)
    for step in range(steps):
        u = rng.randrange(users)
        db.signal_with_context(
            u, rng.randrange(20), rng.randint(1, 3), rng.uniform(0.5, 3), T0 + step * HOUR // 10
        )
        roll = rng.random()
        if roll < 0.03:
            db.request_community_purge(rng.randrange(users), rng.choice(cohorts))
        elif roll < 0.045:
            db.leave_community_layer(rng.randrange(users))
        elif roll < 0.06:
            db.rejoin_community_layer(rng.randrange(users))
        elif roll < 0.08:
            db.unassign_cohort(rng.randrange(users), rng.choice(cohorts))
        elif roll < 0.10:
            db.assign_cohort(rng.randrange(users), rng.choice(cohorts))
        if extras and step == steps // 2:
            db.flush()
            for c in cohorts[:3]:
                db.rematerialize(c)
            db.compact()
    db.flush()
    if extras:
        db.rematerialize(cohorts[3])


class _Poison:
    """Stands in for another shard's environment: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"another shard's environment was used ({name})")


def _alone(store: ShardedStore, keep: str, read: Any) -> Any:
    others = {n: e for n, e in store.envs.items() if n != keep}
    store.envs.update({n: _Poison() for n in others})
    try:
        return read()
    finally:
        store.envs.update(others)


def _check_parts(store: ShardedStore, cfg: Config) -> None:
    """Every shard's part restores what the whole store restores with every shard
    built (the open's restore)."""
    mstates, lstates, coord_state = build_states(cfg, store.load(), store)
    coord = coordinator_part(store)
    assert coord is not None
    for i in range(cfg.ledger_shards):
        part = _alone(
            store, ledger_env(i), lambda i=i: ledger_part(store, i, coord, cfg.ledger_shards)
        )
        assert part is not None
        got = build_states(cfg, part, store, ledgers=(i,))[1][i]
        assert got.batch_seq == lstates[i].batch_seq
        assert encode_ledger(got) == encode_ledger(lstates[i]), f"ledger {i}"
    for m in range(cfg.membership_shards):
        part = _alone(
            store, membership_env(m), lambda m=m: own_part(store, membership_env(m), coord)
        )
        got_m = build_states(cfg, part, None, ledgers=())[0][m]
        want = mstates[m]
        assert got_m.status == want.status and got_m.history == want.history
        assert got_m.cohorts == want.cohorts, f"membership {m}"
    part = _alone(store, COORDINATOR, lambda: own_part(store, COORDINATOR))
    got_c = build_states(cfg, part, None, ledgers=())[2]
    assert got_c.manifests == coord_state.manifests
    assert got_c.statuses == coord_state.statuses
    assert got_c.watermarks == coord_state.watermarks
    assert got_c.last_purge_id == coord_state.last_purge_id


@pytest.mark.parametrize(
    ("nm", "nl", "seed", "extras", "retention"),
    [
        (1, 1, 11, True, None),
        (3, 4, 12, True, 30 * HOUR),
        (2, 5, 13, False, None),
        (4, 2, 14, True, None),
    ],
)
def test_every_shards_part_restores_what_the_open_restores(
    tmp_path: Path, nm: int, nl: int, seed: int, extras: bool, retention: int | None
) -> None:
    cfg = _cfg(nm, nl, history_retention_ns=retention)
    path = str(tmp_path / "db")
    db = TidalDb.open(path, config=cfg, clock=ManualClock(T0 + 200 * HOUR))
    try:
        _workload(db, seed, 400, extras)
        _check_parts(db._core.store, cfg)
    finally:
        db.close()
    # after a close (a snapshot written) and a reopen (the snapshot read and deleted)
    db = TidalDb.open(path, config=cfg, clock=ManualClock(T0 + 200 * HOUR))
    try:
        _workload(db, seed + 100, 100, False)
        _check_parts(db._core.store, cfg)
    finally:
        db.close()


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    nm=st.integers(1, 3),
    nl=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_parts_on_drawn_shapes(tmp_path_factory: Any, nm: int, nl: int, seed: int) -> None:
    cfg = _cfg(nm, nl)
    path = str(tmp_path_factory.mktemp("db") / "db")
    db = TidalDb.open(path, config=cfg, clock=ManualClock(T0))
    try:
        _workload(db, seed, 150, False)
        _check_parts(db._core.store, cfg)
    finally:
        db.close()


def _history_ledgers(store: ShardedStore) -> Any:
    import msgpack

    raw = store.raw_get(Keyspace.META, encode_key(0, Tag.STORE_META))
    assert raw is not None
    return msgpack.unpackb(raw).get("history_ledgers")


def test_a_read_only_open_under_another_count_keeps_the_record_and_a_reshard_back_does_not_restore_it(
    tmp_path: Path,
) -> None:
    """A read-only open under another ledger count writes nothing (the record keeps
    saying 3, and the history is still the ledgers' own); a writer's open under 2
    sets it to 0; reopening under 3, and an actor process's open (a `ShardedStore`
    without the directory lock), leave it 0."""
    path = tmp_path / "db"
    cfg = _cfg(2, 3)
    with TidalDb.open(str(path), config=cfg, clock=ManualClock(T0)) as db:
        _workload(db, 5, 60, False)
    ro = ShardedStore(path, cfg.replace(ledger_shards=2), read_only=True)
    try:
        assert _history_ledgers(ro) == 3
    finally:
        ro.close()
    with TidalDb.open(str(path), config=cfg, clock=ManualClock(T0)) as db:
        assert _history_ledgers(db._core.store) == 3
    with TidalDb.open(str(path), config=cfg.replace(ledger_shards=2), clock=ManualClock(T0)) as db:
        _workload(db, 6, 60, False)  # batches of a cohort in another ledger's environment
        assert _history_ledgers(db._core.store) == 0
    actor = actor_store(str(path), cfg, writer=True)  # as an actor's process opens it
    try:
        assert _history_ledgers(actor) == 0
    finally:
        actor.close()
    with TidalDb.open(str(path), config=cfg, clock=ManualClock(T0)) as db:
        store = db._core.store
        assert _history_ledgers(store) == 0
        coord = coordinator_part(store)
        assert coord is not None
        assert all(ledger_part(store, i, coord, 3) is None for i in range(3))


# -- a shard's own group commit (`ControlCommits`) ----------------------------------


class _Told:
    """The `Committed` answers a `ControlCommits` gives, by token."""

    def __init__(self) -> None:
        self.got: dict[Any, BaseException | None] = {}
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)

    def __call__(self, address: M.Address, msg: object) -> None:
        assert isinstance(msg, M.Committed)
        with self.lock:
            for token in (msg.token, *msg.more):
                assert token not in self.got, f"token {token} answered twice"
                self.got[token] = msg.error
            self.done.notify_all()


def _user_op(user: int, value: bytes) -> tuple[str, bytes, bytes | None]:
    return (Keyspace.USERS.value, encode_key(user, Tag.COHORT_ASSIGNMENT), value)


def test_a_failed_own_commit_tells_each_writer_and_the_shard_goes_on(tmp_path: Path) -> None:
    """Writes of a membership shard's environment handed to its own commit thread:
    an injected failure of one write fails only its writer (its record is not in the
    environment), the others commit and are answered once each; later writes commit;
    ``close`` commits and answers what is queued before it returns."""
    cfg = _cfg(1, 1)
    store = ShardedStore(tmp_path / "db", cfg)
    told = _Told()
    bad = encode_key(7, Tag.COHORT_ASSIGNMENT)

    def fault(ops: list[Any]) -> None:
        if any(op[1] == bad for op in ops):
            raise StorageError("injected")

    store.fault = fault
    commits = ControlCommits(store.commit_writes, told, "m0", "membership[0]")
    address = (M.MEMBERSHIP, 0)
    try:
        for token, user in enumerate([1, 2, 7, 3]):
            commits.put(M.Write([_user_op(user, b"v%d" % user)], (address, token), ahead=True))
        commits.drain()
        assert told.got.keys() == {0, 1, 2, 3}
        assert [told.got[t] is None for t in range(4)] == [True, True, False, True]
        got = dict(store.envs[membership_env(0)].scan(Keyspace.USERS))
        assert bad not in got
        assert {got[encode_key(u, Tag.COHORT_ASSIGNMENT)] for u in (1, 2, 3)} == {
            b"v1",
            b"v2",
            b"v3",
        }
        store.fault = None
        for token in range(4, 40):
            commits.put(M.Write([_user_op(token, b"w")], (address, token), ahead=True))
    finally:
        commits.close()
    assert all(told.got[t] is None for t in range(4, 40)) and len(told.got) == 40
    assert len(store.envs[membership_env(0)].scan(Keyspace.USERS)) == 3 + 36
    store.close()


def test_a_commit_on_a_closed_store_fails_its_writers(tmp_path: Path) -> None:
    """The store closed under the commit thread: each writer is told the error."""
    cfg = _cfg(1, 1)
    store = ShardedStore(tmp_path / "db", cfg)
    store.close()
    told = _Told()
    commits = ControlCommits(store.commit_writes, told, "m0", "membership[0]")
    try:
        commits.put(M.Write([_user_op(1, b"x")], ((M.MEMBERSHIP, 0), 1), ahead=True))
        commits.drain()
    finally:
        commits.close()
    assert told.got.keys() == {1} and told.got[1] is not None


def test_an_own_commit_that_does_not_fit_fails_only_its_writer(tmp_path: Path) -> None:
    """A membership shard's environment at its largest map: a write too large for it
    is refused with `StorageFull` (nothing of it written) while the small writes
    committed with it in one group are each committed and answered; the shard's
    commits go on after."""
    from tidal_actors import StorageFull

    cfg = _cfg(1, 1, map_size_bytes=64 * 1024, max_map_size_bytes=256 * 1024)
    store = ShardedStore(tmp_path / "db", cfg)
    told = _Told()
    commits = ControlCommits(store.commit_writes, told, "m0", "membership[0]")
    address = (M.MEMBERSHIP, 0)
    big = random.Random(1).randbytes(400 * 1024)  # incompressible, past the largest map
    try:
        commits.put(M.Write([_user_op(1, b"a")], (address, 1), ahead=True))
        commits.put(M.Write([_user_op(2, big)], (address, 2), ahead=True))
        commits.put(M.Write([_user_op(3, b"c")], (address, 3), ahead=True))
        commits.drain()
        assert told.got[1] is None and told.got[3] is None
        assert isinstance(told.got[2], StorageFull), told.got[2]
        commits.put(M.Write([_user_op(4, b"d")], (address, 4), ahead=True))
    finally:
        commits.close()
    assert told.got[4] is None
    got = dict(store.envs[membership_env(0)].scan(Keyspace.USERS))
    assert sorted(got.values()) == [b"a", b"c", b"d"]
    store.close()
