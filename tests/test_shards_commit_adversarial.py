"""Adversarial checks of the ``shards`` layout's group commit
(`ShardedWrites.commit_writes`, the persistence actor's) and of a ledger's own
history commits under the Ray host (`runtime.ray_history.HistoryCommits`).

The reference for `commit_writes` is the ``single`` layout's: the persistence actor
commits the group's ops in one transaction, in the writes' order, and retries them
one by one when it fails (`actors.persistence`), so a later write to a key wins and
each writer is told its own write's outcome. Each expected value is written out by
hand from that rule."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import lmdb
import pytest

from tidal_actors import Config, DatabaseClosed, StorageError
from tidal_actors.runtime.ray_history import HistoryCommits
from tidal_actors.storage.format import Keyspace, Tag, encode_key
from tidal_actors.storage.sharded import ShardedStore

USERS, META, ITEMS = Keyspace.USERS.value, Keyspace.META.value, Keyspace.ITEMS.value
STATUS = encode_key(3, Tag.PURGE_STATUS, bytes(16))  # the coordinator's
CHUNK = [encode_key(j, Tag.SNAPSHOT_CHUNK, b"\0\0\0\1") for j in range(2)]  # ledger-j's
USER = [encode_key(u, Tag.COHORT_ASSIGNMENT) for u in (1, 2)]  # a membership env's each


def _store(path: Path, **kw: Any) -> ShardedStore:
    base: dict[str, Any] = {"membership_shards": 2, "ledger_shards": 2, "store_layout": "shards"}
    return ShardedStore(path, Config(**{**base, **kw}))


# -- ordering ----------------------------------------------------------------------


@pytest.mark.parametrize("spanning_first", [True, False])
def test_the_later_of_two_writes_to_a_key_wins_when_one_spans_environments(
    tmp_path: Path, spanning_first: bool
) -> None:
    """Two writers set the coordinator's status key in one group, one of them in a
    write that also holds a ledger's chunk (it spans two environments). As in one
    transaction of the group's ops in order (the single layout), the later write's
    value is the one stored, whichever of the two spans."""
    store = _store(tmp_path / "s")
    try:
        spanning = [(ITEMS, STATUS, b"spanning"), (META, CHUNK[0], b"c")]
        alone = [(ITEMS, STATUS, b"alone")]
        writes = [spanning, alone] if spanning_first else [alone, spanning]
        assert store.commit_writes(writes) == [None, None]
        later = b"alone" if spanning_first else b"spanning"
        assert store.raw_get(Keyspace.ITEMS, STATUS) == later
        assert store.raw_get(Keyspace.META, CHUNK[0]) == b"c"
    finally:
        store.close()


def test_a_later_delete_after_a_spanning_write_leaves_the_key_deleted(tmp_path: Path) -> None:
    """A spanning write puts ledger-1's chunk, a later one deletes it: deleted (the
    single layout's order), not put back by the spanning write committed last."""
    store = _store(tmp_path / "s")
    try:
        writes = [
            [(ITEMS, STATUS, b"s"), (META, CHUNK[1], b"c")],
            [(META, CHUNK[1], None)],
            [(USERS, USER[0], b"u")],
        ]
        assert store.commit_writes(writes) == [None, None, None]
        assert store.raw_get(Keyspace.META, CHUNK[1]) is None
        assert store.raw_get(Keyspace.ITEMS, STATUS) == b"s"
        assert store.raw_get(Keyspace.USERS, USER[0]) == b"u"
    finally:
        store.close()


def test_two_writers_to_a_key_in_one_environment_the_later_wins_after_a_retry(
    tmp_path: Path,
) -> None:
    """Two writes to one user key in one group, their environment's group transaction
    failing once: retried one by one in order, the later value is stored and both
    writers are told it committed (the single layout's persistence does the same)."""
    store = _store(tmp_path / "s")
    try:
        calls: list[int] = []

        def once(ops: list[object]) -> None:
            calls.append(len(ops))
            if len(calls) == 1:
                raise StorageError("refused once (test)")

        env = store._owner(USERS, USER[0])
        store.envs[env].fault = once
        out = store.commit_writes([[(USERS, USER[0], b"first")], [(USERS, USER[0], b"second")]])
        assert out == [None, None]
        assert calls == [2, 1, 1]  # the group's transaction, then each write alone
        assert store.raw_get(Keyspace.USERS, USER[0]) == b"second"
    finally:
        store.close()


# -- what each writer is told --------------------------------------------------------


def test_a_write_whose_key_cannot_be_routed_fails_alone(tmp_path: Path) -> None:
    """One write of the group holds a key that is not bytes (no environment can be
    found for it). Its writer gets the error; the others commit and are told so, as
    the single layout's one-by-one retry answers them; the call returns (a raise
    would leave every writer of the group unanswered)."""
    store = _store(tmp_path / "s")
    try:
        bad: Any = "not bytes"
        out = store.commit_writes(
            [[(USERS, USER[0], b"u")], [(USERS, bad, b"x")], [(ITEMS, STATUS, b"s")]]
        )
        assert out[0] is None and out[2] is None
        assert isinstance(out[1], Exception)
        assert store.raw_get(Keyspace.USERS, USER[0]) == b"u"
        assert store.raw_get(Keyspace.ITEMS, STATUS) == b"s"
    finally:
        store.close()


def test_a_value_that_cannot_be_written_fails_only_its_own_write(tmp_path: Path) -> None:
    """A value LMDB refuses (not bytes) in one write of ledger-0's group: that
    group's transaction fails whole, its writes are retried one by one; the bad one
    alone fails, the good one beside it and the other environments' commit."""
    store = _store(tmp_path / "s")
    try:
        bad: Any = 12345
        writes = [
            [(META, CHUNK[0], b"good")],
            [(META, encode_key(0, Tag.SNAPSHOT_CHUNK, b"\0\0\0\2"), bad)],
            [(META, CHUNK[1], b"other")],
        ]
        out = store.commit_writes(writes)
        assert out[0] is None and out[2] is None and out[1] is not None
        assert store.raw_get(Keyspace.META, CHUNK[0]) == b"good"
        assert store.raw_get(Keyspace.META, CHUNK[1]) == b"other"
        assert store.raw_get(Keyspace.META, encode_key(0, Tag.SNAPSHOT_CHUNK, b"\0\0\0\2")) is None
    finally:
        store.close()


class _DiskErrorAtCommit:
    """Stands in for an `lmdb.Environment` whose write transactions fail at their
    commit (after every put went through) while ``failing[0]`` is true: LMDB
    aborts them, as it does when the write of the data file fails."""

    def __init__(self, env: Any, failing: list[bool]) -> None:
        self._env = env
        self._failing = failing

    def begin(self, write: bool = False, **kw: Any) -> Any:
        txn = self._env.begin(write=write, **kw)
        return _Aborting(txn) if write and self._failing[0] else txn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


class _Aborting:
    def __init__(self, txn: Any) -> None:
        self.txn = txn

    def __enter__(self) -> Any:
        return self.txn

    def __exit__(self, *exc: object) -> None:
        self.txn.abort()
        raise lmdb.DiskError("Input/output error (test)")


def test_a_disk_error_in_one_environment_fails_only_its_writes(tmp_path: Path) -> None:
    """membership-<u1>'s transactions fail at commit (an LMDB disk error): its two
    writes are refused with a StorageError each, nothing of them stored; every other
    environment's writes committed and are told so; once the disk answers again the
    same writes commit."""
    store = _store(tmp_path / "s")
    try:
        envs = [store._owner(USERS, k) for k in USER]
        assert envs[0] != envs[1]  # users 1 and 2 sit in different membership shards
        failing = [True]
        inner = store.envs[envs[0]]
        inner.env = _DiskErrorAtCommit(inner.env, failing)  # type: ignore[assignment]
        other = encode_key(1, Tag.COHORT_ASSIGNMENT, b"x")  # user 1 again: the same env
        writes = [
            [(USERS, USER[0], b"a")],
            [(USERS, USER[1], b"b")],
            [(USERS, other, b"c")],
            [(META, CHUNK[0], b"d")],
        ]
        out = store.commit_writes(writes)
        assert [e is None for e in out] == [False, True, False, True]
        assert all(isinstance(e, StorageError) for e in (out[0], out[2]))
        assert store.raw_get(Keyspace.USERS, USER[0]) is None
        assert store.raw_get(Keyspace.USERS, other) is None
        assert store.raw_get(Keyspace.USERS, USER[1]) == b"b"
        assert store.raw_get(Keyspace.META, CHUNK[0]) == b"d"
        failing[0] = False
        assert store.commit_writes(writes) == [None] * 4
        assert store.raw_get(Keyspace.USERS, USER[0]) == b"a"
    finally:
        store.close()


def test_every_environment_grows_its_map_in_one_parallel_group(tmp_path: Path) -> None:
    """Each of the five environments needs its map grown (from the smallest one,
    64 KiB, by doubling) to hold its write of 300 KB, all in one group: every
    write commits and reads back whole after a reopen."""
    size = 64 * 1024
    path = tmp_path / "s"
    store = _store(path, map_size_bytes=size)
    keys = [(USERS, USER[0]), (USERS, USER[1]), (META, CHUNK[0]), (META, CHUNK[1])]
    keys.append((ITEMS, STATUS))
    assert len({store._owner(ks, k) for ks, k in keys}) == 5
    values = [bytes([i]) * 300_000 for i in range(5)]
    try:
        out = store.commit_writes([[(ks, k, v)] for (ks, k), v in zip(keys, values)])
        assert out == [None] * 5
    finally:
        store.close()
    store = _store(path, map_size_bytes=size)
    try:
        for (ks, k), v in zip(keys, values):
            assert store.raw_get(Keyspace(ks), k) == v
    finally:
        store.close()


def test_a_group_after_close_is_refused_and_starts_no_thread(tmp_path: Path) -> None:
    """A group committed to a closed store: every write refused (DatabaseClosed),
    nothing written, and no commit thread started for a store that is gone."""
    store = _store(tmp_path / "s")
    store.close()
    before = {t.ident for t in threading.enumerate()}
    out = store.commit_writes([[(USERS, USER[0], b"u")], [(META, CHUNK[0], b"c")]])
    assert all(isinstance(e, DatabaseClosed) for e in out)
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert started == []


# -- a ledger's own history commits (the Ray host, shards layout) ----------------------


def _within(fn: Any, seconds: float = 10.0) -> Any:
    """``fn()``'s result, or a failure if it has not returned within ``seconds``."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert box, f"did not return within {seconds} s"
    return box[0]


def test_after_a_failed_history_commit_nothing_later_commits_and_each_write_is_reported() -> None:
    """The first commit fails: it and the two writes handed over after it are
    reported (three failures, the first error each), none of the later ones reaches
    the store, and a second drain reports nothing more."""
    calls: list[list[Any]] = []
    gate = threading.Event()

    def commit(ops: list[Any]) -> None:
        calls.append(ops)
        gate.wait(10)
        raise StorageError("disk refused (test)")

    h = HistoryCommits(commit, 0)
    try:
        h.put([("h", b"1", b"a")])
        while not calls:  # the thread took the first write: the next two queue
            threading.Event().wait(0.01)
        h.put([("h", b"2", b"b")])
        h.put([("h", b"3", b"c")])
        gate.set()
        failures = _within(h.drain)
        assert len(failures) == 3
        assert all(str(f) == "disk refused (test)" for f in failures)
        assert calls == [[("h", b"1", b"a")]]  # the later two never committed
        assert _within(h.drain) == []
    finally:
        gate.set()
        _within(h.close)


class _Killed(BaseException):
    """Not an `Exception`: what ends a thread that catches only those."""


def test_a_history_commit_that_raises_past_exception_does_not_hang_the_flush() -> None:
    """The commit raises a BaseException (not an Exception): the drain a flush waits
    on must still return, reporting that write failed, rather than wait forever for
    a thread that died holding it."""

    def commit(ops: list[Any]) -> None:
        raise _Killed("thread ended (test)")

    h = HistoryCommits(commit, 0)
    h.put([("h", b"1", b"a")])
    failures = _within(h.drain)
    assert len(failures) == 1 and isinstance(failures[0], _Killed)
    h.put([("h", b"2", b"b")])  # a later write fails unwritten, reported too
    assert len(_within(h.close)) == 1


def test_a_history_write_after_close_is_reported_not_left_waiting() -> None:
    """A write handed over after `close` (its thread has ended): a later drain
    returns at once and reports it failed, instead of waiting forever for a thread
    that will not commit it."""
    calls: list[list[Any]] = []
    h = HistoryCommits(calls.append, 0)
    h.put([("h", b"1", b"a")])
    assert _within(h.close) == []
    h.put([("h", b"2", b"b")])
    (failure,) = _within(h.drain)
    assert isinstance(failure, StorageError)
    assert calls == [[("h", b"1", b"a")]]


# -- what a flush raises when a ledger's own environment is full (docs/guarantees.md,
# "A full disk": a history write that does not fit is reported as StorageFull) ----


def test_a_ledgers_full_environment_is_reported_to_the_flush_as_storage_full() -> None:
    """Persistence answers a flush whose only loss is a ledger's report of its own
    failed history commits (the Ray host, shards layout): a full map there reaches
    the caller as `StorageFull`, as a history write persistence failed to fit does
    (the last failure's class kept), not as a plain StorageError."""
    from tidal_actors import StorageFull
    from tidal_actors.actors import messages as M
    from tidal_actors.actors.persistence import Persistence
    from tidal_actors.actors.reply import Reply
    from tidal_actors.storage.stores import MemoryStore

    from ._setups import RecordingContext

    p = Persistence(RecordingContext(), MemoryStore())  # type: ignore[arg-type]
    full = StorageFull("LMDB map is full at 65536 bytes (test)")
    reply = Reply("flush")
    barrier = M.Barrier((0,), 1, reply, reports_loss=True)
    p.receive(M.BarrierPart(barrier, (full,)))
    with pytest.raises(StorageFull, match="map is full") as raised:
        reply.result()
    assert raised.value.__cause__ is full


def test_a_ledgers_history_commit_failing_full_keeps_the_class_in_its_report() -> None:
    """The ledger's part of a flush (`LocalHost._with_failures`) after its own
    history commit failed with `StorageFull`: the loss it carries is a StorageFull
    (naming the ledger and how many writes failed), so the flush can raise one."""
    pytest.importorskip("ray")
    from tidal_actors import ManualClock, StorageFull
    from tidal_actors.actors import messages as M
    from tidal_actors.actors.reply import Reply
    from tidal_actors.runtime.ray_local import LocalHost

    from .conftest import T0
    from .test_ray_durable_ends import _Links

    host = LocalHost(Config(), ManualClock(T0), True, _Links(), None, 3, 0)  # type: ignore[arg-type]

    def commit(ops: list[Any]) -> None:
        raise StorageFull("LMDB map is full at 65536 bytes (test)")

    host.commit_history = commit
    host.tell(M.PERSIST_ADDR, M.Write([("history", b"k", b"v")]))
    part = M.BarrierPart(M.Barrier((3,), 1, Reply("flush"), reports_loss=True))
    host.tell(M.PERSIST_ADDR, part)
    sent = [m for _, m in host.links.sent if type(m) is M.BarrierPart]  # type: ignore[attr-defined]
    (loss,) = sent[-1].lost
    assert isinstance(loss, StorageFull)
    assert "1 history write(s) of ledger 3 failed" in str(loss)
    assert "map is full" in str(loss)
    host._history.close()  # type: ignore[union-attr]


def _signals(first: int, n: int) -> list[Any]:
    from tidal_actors import Signal

    from .conftest import SEC, T0

    return [
        Signal(i % 24, i % 13, i % 2, 1.0 + i % 5, T0 - (i % 700) * SEC)
        for i in range(first, first + n)
    ]


def _model(cfg: Config, signals: list[Any]) -> Any:
    from tidal_actors import ManualClock
    from tidal_actors.testing import ReferenceModel

    from .conftest import T0

    ref = ReferenceModel(cfg, ManualClock(T0))
    for u in range(24):
        ref.assign_cohort(u, ("red", "green", "blue")[u % 3])
    ref.signal_batch(signals)
    return ref


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("ray") is None, reason="Ray is not installed"
)
def test_a_ray_ledger_whose_environment_fills_stops_at_a_prefix_and_says_so(
    ray_session: None, tmp_path: Path
) -> None:
    """The Ray host, shards layout, one membership and one ledger shard, each
    environment's map at most 256 KiB: signals streamed 100 at a time, each followed
    by a flush, until the ledger's environment is full. That flush raises
    StorageFull; a flush after more signals raises again (nothing of that ledger
    commits after a failed commit); the close ends. Reopened (pykka host, room to
    grow), the store holds exactly a prefix of the signals sent (the reference
    model of the first n of them, for one n), at least every signal a flush
    confirmed, and the store opens whole."""
    import time

    from tidal_actors import ManualClock, StorageFull, TidalDb

    from ._differential import rows_mismatch
    from ._ray import ray_config
    from .conftest import T0

    path = str(tmp_path / "store")
    cfg = ray_config(
        membership_shards=1,
        ledger_shards=1,
        map_size_bytes=64 * 1024,
        max_map_size_bytes=256 * 1024,
        store_layout="shards",
    )
    sent: list[Any] = []
    confirmed = 0
    db = TidalDb.open(path, config=cfg, clock=ManualClock(T0))
    try:
        for u in range(24):
            db.assign_cohort(u, ("red", "green", "blue")[u % 3])
        full: StorageFull | None = None
        for k in range(2000):
            batch = _signals(k * 100, 100)
            db.signal_batch(batch)
            sent += batch
            try:
                db.flush()
            except StorageFull as exc:
                full = exc
                break
            confirmed = len(sent)
        assert full is not None and confirmed > 0, "the ledger's environment never filled"
        assert "ledger 0" in str(full)
        batch = _signals(len(sent), 100)
        db.signal_batch(batch)
        sent += batch
        with pytest.raises(StorageFull, match="ledger 0"):
            db.flush()
    finally:
        started = time.monotonic()
        with contextlib.suppress(StorageFull):  # the close's flush may report it again
            db.close()
        closed_s = time.monotonic() - started
    assert closed_s < 60, f"the close took {closed_s:.1f} s"
    again_cfg = cfg.replace(host="pykka", max_map_size_bytes=64 * 1024**2)
    with TidalDb.open(path, config=again_cfg, clock=ManualClock(T0)) as again:
        rows = again.aggregate_rows()
    ref = _model(cfg.replace(host="pykka"), sent[:confirmed])
    prefix = []  # each n whose first n signals the store holds, exactly
    for n in range(confirmed, len(sent) + 1):
        if rows_mismatch(rows, ref.aggregate_rows()) is None:
            prefix.append(n)
        if n < len(sent):
            ref.signal_batch(sent[n : n + 1])
    assert prefix, (
        f"the store holds no prefix of the {len(sent)} signals sent "
        f"({confirmed} confirmed by a flush)"
    )


# -- refused but stored: the snapshot at close -----------------------------------------


@pytest.mark.parametrize("layout", ["single", "shards"])
def test_a_signal_whose_history_write_failed_is_not_in_the_store_after_a_reopen(
    tmp_path: Path, layout: str
) -> None:
    """A signal's history write fails (the flush says it is not durable), the
    store then works again and the database closes. Reopened, the store holds only
    the signal whose write committed (docs/guarantees.md, "A full disk": such
    signals stay in the live aggregates until the database is reopened), not the
    failed one brought back by the snapshot written at close from the live state."""
    from tidal_actors import ManualClock, Signal, TidalDb

    from ._differential import rows_mismatch
    from .conftest import T0

    cfg = Config(
        membership_shards=1, ledger_shards=1, store_layout=layout, rematerialize_after_ms=None
    )
    path = tmp_path / "s"
    kept, failed = Signal(1, 5, 1, 1.0, T0), Signal(1, 5, 1, 10.0, T0)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "red")
        db.signal_batch([kept])
        db.flush()
        store = db._core.store
        targets = [store] if layout == "single" else list(store.envs.values())

        def fault(ops: list[Any]) -> None:
            if any(op[0] == Keyspace.HISTORY.value for op in ops):
                raise StorageError("the disk refused it (test)")

        for t in targets:
            t.fault = fault
        db.signal_batch([failed])
        with pytest.raises(StorageError, match="history write"):
            db.flush()
        for t in targets:
            t.fault = None
    ref = _model_of(cfg, [kept])
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None


def _model_of(cfg: Config, signals: list[Any]) -> Any:
    from tidal_actors import ManualClock
    from tidal_actors.testing import ReferenceModel

    from .conftest import T0

    ref = ReferenceModel(cfg, ManualClock(T0))
    ref.assign_cohort(1, "red")
    ref.signal_batch(signals)
    return ref


@pytest.mark.parametrize("fails", [False, True])
def test_a_ray_ledger_whose_history_commit_failed_is_marked_for_no_snapshot(fails: bool) -> None:
    """The Ray host's ledger that commits its own history (shards layout): stopped
    after one of its commits failed, its behaviour (which the facade reads back for
    the snapshot at close) says so (`LedgerShard.history_failed`); after commits
    that all passed, it does not."""
    pytest.importorskip("ray")
    from tidal_actors import ManualClock
    from tidal_actors.actors import messages as M
    from tidal_actors.actors.ledger import LedgerShard
    from tidal_actors.runtime.ray_local import LocalHost

    from .conftest import T0
    from .test_ray_durable_ends import _History, _Links

    host = LocalHost(Config(), ManualClock(T0), True, _Links(), None, 0, 0)  # type: ignore[arg-type]

    def commit(ops: list[Any]) -> None:
        if fails:
            raise StorageError("the disk refused it (test)")

    host.commit_history = commit
    ledger = LedgerShard(host.ctx, 0)
    ledger.state.wire_history(_History())  # type: ignore[arg-type]
    host.start([ledger])
    host.tell(M.PERSIST_ADDR, M.Write([("history", b"k", b"v")]))
    host.stop([M.LEDGER])
    assert ledger.history_failed is fails
