"""Adversarial checks of the ``shards`` store layout (`storage.sharded`): reads
beside a writer in another process, damage, and refusals that must change nothing.

Each test states the value it expects and where it comes from (by hand, or the
reference model)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import pytest

from tidal_actors import COMMUNITY, Config, InvalidArgument, ManualClock, StorageError, TidalDb
from tidal_actors.storage.format import Keyspace, Tag, encode_key
from tidal_actors.storage.lmdb_env import LmdbStore
from tidal_actors.storage.lmdb_reader import SnapshotStore
from tidal_actors.storage.sharded import ShardedStore

from . import _crash_worker as W
from .conftest import T0


def _cfg(**kw: Any) -> Config:
    base: dict[str, Any] = {"membership_shards": 2, "ledger_shards": 2, "store_layout": "shards"}
    return Config(**{**base, **kw})


@pytest.fixture(scope="module")
def mp() -> Any:
    return W.forkserver()


def close_on_cue(path: str, ready: Any, go: Any, closed: Any, scale: float = 1.0) -> None:
    """Open ``path`` (shards), write users 0..7 (cohort c<u>, one signal of weight
    (u + 1) * scale at T0), flush, then close when told to (its snapshot at close)."""
    db = TidalDb.open(path, config=_cfg(), clock=ManualClock(T0))
    for u in range(8):
        db.assign_cohort(u, f"c{u}")
        db.signal_with_context(u, 3, 1, float(u + 1) * scale, T0)
    db.flush()
    ready.set()
    go.wait(60)
    db.close()
    closed.set()
    closed.wait()  # the parent reads; the process ends when killed


def die_deleting_the_snapshot(path: str) -> None:
    """Open ``path``, and die inside the open's deletion of the snapshot it loads:
    after the mark's part (the coordinator's environment) committed, before the
    chunks' parts (the ledgers')."""
    import os
    import signal

    from tidal_actors.storage.format import Tag
    from tidal_actors.storage.lmdb_env import LmdbStore

    original = LmdbStore.commit

    def commit(self: LmdbStore, ops: Any) -> None:
        ops = list(ops)
        if any(len(k) >= 10 and k[9] == Tag.SNAPSHOT_CHUNK and v is None for _, k, v in ops):
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, ops)

    LmdbStore.commit = commit  # type: ignore[method-assign]
    TidalDb.open(path, config=_cfg(), clock=ManualClock(T0))


def _straddled_read(
    mp: Any, path: str, scale: float, monkeypatch: pytest.MonkeyPatch
) -> list[float]:
    """Each c<u>'s decayed score at T0 as a read-only open reads it while a writer
    (`close_on_cue`, adding weight (u + 1) * scale) closes between the open's read of
    the ledgers' environments and its read of the coordinator's."""
    ready, go, closed = mp.Event(), mp.Event(), mp.Event()
    p = mp.Process(target=close_on_cue, args=(path, ready, go, closed, scale))
    p.start()
    try:
        assert ready.wait(60)
        original = SnapshotStore.reading

        def reading(self: SnapshotStore) -> Any:
            if self.path.name == "coordinator" and not go.is_set():
                go.set()  # the ledgers' read transactions are begun: the writer closes now
                assert closed.wait(60)
            return original(self)

        with monkeypatch.context() as patch:
            patch.setattr(SnapshotStore, "reading", reading)
            with TidalDb.open(path, config=_cfg(), clock=ManualClock(T0), read_only=True) as ro:
                got = [ro.read_decay_score(f"c{u}", 3, 1, T0) for u in range(8)]
        assert go.is_set()
        return got
    finally:
        p.kill()
        p.join(30)


def test_a_read_only_open_straddling_the_writers_close_reads_a_whole_store(
    mp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only open begins its read of the ledgers' environments, then (before it
    begins the coordinator's) the writer in another process closes: its snapshot's
    chunks land in the ledgers' environments, then its mark in the coordinator's.
    The reader must still read a whole store (it used to fail: the mark without its
    chunks): each cohort c<u> holds user u's one signal, weight u + 1 (by hand)."""
    got = _straddled_read(mp, str(tmp_path / "s"), 1.0, monkeypatch)
    assert got == [float(u + 1) for u in range(8)]


def test_a_crash_inside_the_snapshots_deletion_leaves_no_chunks_a_later_mark_adopts(
    mp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session 1 writes weight u + 1 to each c<u> and closes (a snapshot); session 2
    dies inside its open's deletion of that snapshot, after the mark's part, so the
    chunks stay (no mark); session 3 adds weight 2 * (u + 1) and closes while a
    read-only open straddles its close (as above). The reader must read session 3's
    store, 3 * (u + 1) in c<u> (by hand: all at T0, no decay), not session 1's
    chunks under session 3's mark."""
    path = str(tmp_path / "s")
    events = (mp.Event(), mp.Event(), mp.Event())  # kept here until the child has them
    events[1].set()  # closes at once
    first = mp.Process(target=close_on_cue, args=(path, *events))
    first.start()
    first.join(60)
    assert first.exitcode == 0, first.exitcode
    p = mp.Process(target=die_deleting_the_snapshot, args=(path,))
    p.start()
    p.join(60)
    assert p.exitcode == -9, p.exitcode
    got = _straddled_read(mp, path, 2.0, monkeypatch)
    assert got == [3.0 * (u + 1) for u in range(8)]
    with TidalDb.open(path, config=_cfg(), clock=ManualClock(T0)) as db:
        assert [db.read_decay_score(f"c{u}", 3, 1, T0) for u in range(8)] == got


def _seeded(path: Path) -> None:
    """A store of 2 membership and 2 ledger shards: users 0..7, cohort c<u>, weight 1."""
    with TidalDb.open(path, config=_cfg(), clock=ManualClock(T0)) as db:
        for u in range(8):
            db.assign_cohort(u, f"c{u}")
            db.signal_with_context(u, 3, 1, 1.0, T0)


def _record(path: Path) -> dict[str, Any]:
    """The format record, read with plain py-lmdb from the coordinator's environment."""
    env = lmdb.open(str(path / "shards" / "coordinator"), readonly=True, max_dbs=8, lock=False)
    try:
        with env.begin(db=env.open_db(b"meta", create=False)) as txn:
            return msgpack.unpackb(txn.get(encode_key(0, Tag.STORE_META)))  # type: ignore[no-any-return]
    finally:
        env.close()


def test_a_refused_open_makes_no_environment_and_keeps_the_record(tmp_path: Path) -> None:
    """Opens that the store refuses (other membership_shards; a later format) with
    more ledger shards asked for: nothing changes (they used to make ledger-2 and
    ledger-3 and rewrite the format record before the refusal)."""
    path = tmp_path / "s"
    _seeded(path)
    before = sorted(p.name for p in (path / "shards").iterdir())
    assert before == ["coordinator", "ledger-0", "ledger-1", "membership-0", "membership-1"]
    want = {
        "format": 2,
        "membership_shards": 2,
        "layout": "shards",
        "ledger_envs": 2,
        "history_ledgers": 2,  # made under 2 ledgers, never opened under another count
    }
    assert _record(path) == want
    with pytest.raises(InvalidArgument, match="membership_shards=2"):
        TidalDb.open(path, config=_cfg(membership_shards=3, ledger_shards=4))
    assert sorted(p.name for p in (path / "shards").iterdir()) == before
    assert _record(path) == want
    store = ShardedStore(path, _cfg())  # a later version's record, written by hand
    store.commit(
        [(Keyspace.META.value, encode_key(0, Tag.STORE_META), msgpack.packb({**want, "format": 3}))]
    )
    store.close()
    with pytest.raises(StorageError, match="format 3, by a later version"):
        TidalDb.open(path, config=_cfg(ledger_shards=4))
    assert sorted(p.name for p in (path / "shards").iterdir()) == before
    assert _record(path) == {**want, "format": 3}


def test_a_missing_environment_is_refused_without_the_stores_marker(tmp_path: Path) -> None:
    """The format record names membership-1: an open refuses the store without it even
    when ``tidal.store`` went too (it used to make membership-1 anew, empty: users 1,
    4 and 5, whose membership shard is 1, lost their cohorts); and a store whose
    coordinator's environment is gone is refused before an empty one is made."""
    path = tmp_path / "s"
    _seeded(path)
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    (path / "tidal.store").unlink()
    shutil.rmtree(path / "shards" / "membership-1")
    with pytest.raises(StorageError, match="no shards/membership-1 environment"):
        TidalDb.open(path, config=_cfg())
    assert not (path / "shards" / "membership-1").exists()
    shutil.rmtree(copy / "shards" / "coordinator")
    with pytest.raises(StorageError, match="no shards/coordinator environment"):
        TidalDb.open(copy, config=_cfg())
    assert not (copy / "shards" / "coordinator").exists()


def die_in_close(path: str, after: int) -> None:
    """Write users 0..7 (cohort c<u>, weight u + 1 at T0), flush, then close and die
    right after the ``after``-th environment commit of the close (0: before any)."""
    import os
    import signal

    from tidal_actors.storage.lmdb_env import LmdbStore

    db = TidalDb.open(path, config=_cfg(), clock=ManualClock(T0))
    for u in range(8):
        db.assign_cohort(u, f"c{u}")
        db.signal_with_context(u, 3, 1, float(u + 1), T0)
    db.flush()
    original = LmdbStore.commit
    done = [0]

    def commit(self: LmdbStore, ops: Any) -> None:
        if done[0] == after:
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, ops)
        done[0] += 1

    LmdbStore.commit = commit  # type: ignore[method-assign]
    db.close()
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("after", range(4))  # the close commits 3 times (2 ledgers, mark)
def test_a_kill_inside_the_close_loses_nothing_flushed(mp: Any, tmp_path: Path, after: int) -> None:
    """Killed between (or before) the environment commits of a close (its snapshot's
    chunks per ledger, then its mark): each reopen reads every flushed signal, c<u>
    = u + 1 (by hand), and a second session's signal adds to it exactly once."""
    path = str(tmp_path / "s")
    p = mp.Process(target=die_in_close, args=(path, after))
    p.start()
    p.join(60)
    assert p.exitcode == -9, p.exitcode
    for _ in range(2):
        with TidalDb.open(path, config=_cfg(), clock=ManualClock(T0)) as db:
            assert [db.read_decay_score(f"c{u}", 3, 1, T0) for u in range(8)] == [
                float(u + 1) for u in range(8)
            ]
    with TidalDb.open(path, config=_cfg(), clock=ManualClock(T0)) as db:
        db.signal_with_context(0, 3, 1, 10.0, T0)
    with TidalDb.open(path, config=_cfg(), clock=ManualClock(T0), read_only=True) as ro:
        assert [ro.read_decay_score(f"c{u}", 3, 1, T0) for u in range(8)] == [
            11.0 if u == 0 else float(u + 1) for u in range(8)
        ]


def purge_on_cue(path: str, ready: Any, go: Any, done: Any) -> None:
    """Users 1 (weight 1) and 2 (weight 2) in cohort c at T0, flushed; when told to,
    purge user 1 from c and flush; then wait to be killed."""
    db = TidalDb.open(path, config=_cfg(rematerialize_after_ms=None), clock=ManualClock(T0))
    for u in (1, 2):
        db.assign_cohort(u, "c")
        db.signal_with_context(u, 3, 1, float(u), T0)
    db.flush()
    ready.set()
    go.wait(60)
    db.request_community_purge(1, "c")
    db.flush()
    done.set()
    done.wait()
    import time

    time.sleep(60)


def test_a_read_only_open_straddling_a_purge_reads_it_whole(
    mp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader has begun the ledgers' read transactions (user 1's record still in
    the history) when the writer purges user 1 from c (manifest, tombstone and
    watermark in the coordinator's environment, then the history's erasure): the
    reader, seeing the manifest, must not count user 1 in c: c = 2.0 and
    @community = 3.0 (by hand, all at T0), with one manifest of one entry."""
    path = str(tmp_path / "s")
    ready, go, done = mp.Event(), mp.Event(), mp.Event()
    p = mp.Process(target=purge_on_cue, args=(path, ready, go, done))
    p.start()
    try:
        assert ready.wait(60)
        original = SnapshotStore.reading

        def reading(self: SnapshotStore) -> Any:
            if self.path.name == "coordinator" and not go.is_set():
                go.set()
                assert done.wait(60)
            return original(self)

        monkeypatch.setattr(SnapshotStore, "reading", reading)
        cfg = _cfg(rematerialize_after_ms=None)
        with TidalDb.open(path, config=cfg, clock=ManualClock(T0), read_only=True) as ro:
            assert go.is_set()
            assert [len(m.entries) for m in ro.list_purge_manifests(1)] == [1]
            assert ro.read_decay_score("c", 3, 1, T0) == 2.0
            assert ro.read_decay_score(COMMUNITY, 3, 1, T0) == 3.0
    finally:
        p.kill()
        p.join(30)


def test_the_shards_directory_is_not_opened_as_a_store(tmp_path: Path) -> None:
    """Opening ``<store>/shards`` (a slip of the path) used to make a second, empty
    store among the environments; it is refused, for writing and reading, and
    nothing is made there."""
    path = tmp_path / "s"
    _seeded(path)
    before = sorted(p.name for p in (path / "shards").iterdir())
    for read_only in (False, True):
        with pytest.raises(StorageError, match="holds the environments of the store at"):
            TidalDb.open(path / "shards", config=Config(), read_only=read_only)
    assert sorted(p.name for p in (path / "shards").iterdir()) == before
    with TidalDb.open(path, config=_cfg(), clock=ManualClock(T0)) as db:
        assert [db.read_decay_score(f"c{u}", 3, 1, T0) for u in range(8)] == [1.0] * 8


def test_the_coordinators_environment_alone_is_not_opened_as_a_store(tmp_path: Path) -> None:
    """A copy of ``shards/coordinator`` (what a tool opening one environment sees)
    holds the format record, the manifests and no users or history: it used to open
    as a whole ``single`` store (cohorts empty, scores 0, manifests there). Its record
    says ``layout: shards``: refused, read-only or not, and its data file unchanged."""
    path = tmp_path / "s"
    _seeded(path)
    copy = tmp_path / "coordinator"
    shutil.copytree(path / "shards" / "coordinator", copy)
    data = (copy / "data.mdb").read_bytes()
    for read_only in (True, False):
        with pytest.raises(
            StorageError, match="says layout 'shards' but it is opened as a 'single'"
        ):
            TidalDb.open(copy, config=_cfg(store_layout="single"), read_only=read_only)
    assert (copy / "data.mdb").read_bytes() == data


def die_in_purge(path: str, after: int) -> None:
    """Users 1 (weight 1) and 2 (weight 2) in cohort c at T0, flushed; then purge
    user 1 from c, re-materialize c and flush, dying right after the ``after``-th
    environment commit from the purge on (0: before any)."""
    import os
    import signal

    from tidal_actors.storage.lmdb_env import LmdbStore

    db = TidalDb.open(path, config=_cfg(rematerialize_after_ms=None), clock=ManualClock(T0))
    for u in (1, 2):
        db.assign_cohort(u, "c")
        db.signal_with_context(u, 3, 1, float(u), T0)
    db.flush()
    original = LmdbStore.commit
    done = [0]

    def commit(self: LmdbStore, ops: Any) -> None:
        if done[0] == after:
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, ops)
        done[0] += 1

    LmdbStore.commit = commit  # type: ignore[method-assign]
    db.request_community_purge(1, "c")
    db.rematerialize("c")
    db.flush()
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("after", range(4))  # 3 commits: manifest, erasure, status
def test_a_kill_inside_a_purge_and_its_rebuild_retracts_exactly_once(
    mp: Any, tmp_path: Path, after: int
) -> None:
    """Killed between any two environment commits of a purge and its rebuild (the
    manifest's, the history's erasure per ledger, the statuses): reopened twice, c is
    3.0 with no manifest or 2.0 with one of one entry (by hand: 1 + 2, then 2 alone,
    all at T0), @community 3.0; a purge of user 1 again lists exactly the entries not
    yet listed; in the end c = 2.0 and 1 entry over all manifests."""
    path = str(tmp_path / "s")
    p = mp.Process(target=die_in_purge, args=(path, after))
    p.start()
    p.join(60)
    assert p.exitcode == -9, p.exitcode
    cfg = _cfg(rematerialize_after_ms=None)
    states = []
    for _ in range(2):
        with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
            listed = [len(m.entries) for m in db.list_purge_manifests(1)]
            c = db.read_decay_score("c", 3, 1, T0)
            assert (listed, c) in (([], 3.0), ([1], 2.0)), (listed, c)
            assert db.read_decay_score(COMMUNITY, 3, 1, T0) == 3.0
            db.rematerialize("c")
            assert db.read_decay_score("c", 3, 1, T0) == c
            states.append((listed, c))
    assert states[0] == states[1]
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        _, manifest = db.request_community_purge(1, "c")
        assert len(manifest.entries) == (1 if states[0][0] == [] else 0)
        db.rematerialize("c")
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        assert db.read_decay_score("c", 3, 1, T0) == 2.0
        assert sum(len(m.entries) for m in db.list_purge_manifests(1)) == 1


def test_a_stray_empty_directory_among_the_environments_is_not_one(tmp_path: Path) -> None:
    """An empty ``shards/ledger-7`` (a mkdir, a partial copy) used to be opened as an
    environment by a writer: it was made (data.mdb, tidal.store), the record then said
    ``ledger_envs: 3`` (the count of ledger environments, not the highest number + 1)
    and every open after refused the store for a missing ledger-2, for good. Now it
    is ignored, read-only or not, and left empty; the record stays (2 ledgers)."""
    path = tmp_path / "s"
    _seeded(path)
    (path / "shards" / "ledger-7").mkdir()
    (path / "shards" / "membership-5").mkdir()
    for read_only in (True, False, False):
        with TidalDb.open(path, config=_cfg(), clock=ManualClock(T0), read_only=read_only) as db:
            assert [db.read_decay_score(f"c{u}", 3, 1, T0) for u in range(8)] == [1.0] * 8
    assert list((path / "shards" / "ledger-7").iterdir()) == []
    assert list((path / "shards" / "membership-5").iterdir()) == []
    assert _record(path)["ledger_envs"] == 2


def test_a_ledger_environment_past_a_gap_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    """A ledger-7 environment (with its data file) beside ledger-0 and ledger-1 only:
    ledger environments are made in number order, so 2..6 are missing (damage); the
    open refuses it (naming ledger-2) and makes none of them, the record unchanged."""
    path = tmp_path / "s"
    _seeded(path)
    LmdbStore(path / "shards" / "ledger-7", _cfg()).close()
    before = sorted(p.name for p in (path / "shards").iterdir())
    with pytest.raises(StorageError, match="no shards/ledger-2 environment"):
        TidalDb.open(path, config=_cfg())
    assert sorted(p.name for p in (path / "shards").iterdir()) == before
    assert _record(path)["ledger_envs"] == 2
