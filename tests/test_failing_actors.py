"""Issue 8: failing actors and bounded mailboxes.

An exception inside a handler reaches the caller as a `TidalError` with the cause
attached (`ActorFailure` when the cause is not a TidalError); the actor keeps serving.
On the signal path, where no caller waits, a failure is counted and exposed
(``stats()["handler_errors"]``, ``flush()`` for failed history writes). Mailboxes
are bounded: a full one makes the producer wait, and nothing is dropped.
"""

from __future__ import annotations

import threading
import time

import pytest

from tidal_actors import (
    COMMUNITY,
    ActorFailure,
    Config,
    StorageError,
    TidalDb,
    TidalError,
)
from tidal_actors.actors import messages as M

from ._setups import in_thread, refuse_history_writes
from .conftest import T0


def _once(exc: BaseException, real=None):
    """A callable raising ``exc`` on its first call, then delegating to ``real``."""
    state = {"raised": False}

    def fn(*args, **kwargs):
        if not state["raised"]:
            state["raised"] = True
            raise exc
        return real(*args, **kwargs) if real is not None else None

    return fn


def _membership(db, i=0):
    return db._core.host.behaviours[(M.MEMBERSHIP, i)]


def _ledger_of(db, cohort):
    from tidal_actors.storage.format import ledger_shard_of

    return db._core.ledgers[ledger_shard_of(cohort, db.config.ledger_shards)]


def _actors_alive(db):
    return all(ref.is_alive() for ref in db._core.host._refs.values())


def test_membership_handler_failure_reaches_caller_with_cause_and_shard_keeps_serving(db):
    shard = _membership(db)
    shard._set_cohorts = _once(RuntimeError("boom"), shard._set_cohorts)  # applying it
    with pytest.raises(ActorFailure) as info:
        db.assign_cohort(1, "c")
    assert isinstance(info.value, TidalError)
    assert isinstance(info.value.__cause__, RuntimeError) and str(info.value.__cause__) == "boom"
    assert db.cohorts_of(1) == frozenset()  # nothing applied
    db.assign_cohort(1, "c")  # the same shard serves the next message
    db.signal_with_context(1, 1, 1, 2.0)
    assert db.read_decay_score("c", 1, 1) == 2.0
    assert db.stats()["handler_errors"] == 1
    assert _actors_alive(db)


def test_ledger_read_failure_reaches_caller_as_tidal_error_with_cause(db, monkeypatch):
    from tidal_actors.core.aggregates import Aggregates

    db.signal_with_context(1, 1, 1, 1.0)
    monkeypatch.setattr(
        Aggregates, "decay_score", _once(ZeroDivisionError("bad read"), Aggregates.decay_score)
    )
    try:
        db.read_decay_score(COMMUNITY, 1, 1)
    except Exception as exc:  # noqa: BLE001 - checked below, after the shard is shown alive
        raised = exc
    else:
        raised = None
    assert db.read_decay_score(COMMUNITY, 1, 1) == 1.0  # the ledger keeps serving either way
    assert _actors_alive(db)
    assert isinstance(raised, TidalError) and isinstance(raised.__cause__, ZeroDivisionError), repr(
        raised
    )


def test_purge_prepare_failure_reaches_caller_and_changes_nothing(db):
    db.assign_cohort(1, "c")
    db.signal_with_context(1, 1, 1, 1.0)
    log = _ledger_of(db, "c").state.log
    log.prepare = _once(KeyError("lost"), log.prepare)
    with pytest.raises(ActorFailure) as info:
        db.request_community_purge(1, "c")
    assert isinstance(info.value.__cause__, KeyError)
    assert db.list_purge_manifests(1) == []
    assert db.read_decay_score("c", 1, 1) == 1.0
    _, manifest = db.request_community_purge(1, "c")  # the coordinator serves the next purge
    assert len(manifest.entries) == 1 and db.read_decay_score("c", 1, 1) == 0.0


def test_unexpected_store_exception_reaches_the_writer_instead_of_hanging(pdb_path, clock):
    """A non-LMDB exception out of the store (here from the fault hook) used to escape
    the persistence actor's commit: no writer was answered and the caller waited
    for ever. Each writer now gets an ActorFailure with the cause."""
    with TidalDb.open(pdb_path, clock=clock) as db:
        store = db._core.store
        failing = threading.Event()
        failing.set()

        def fault(ops):
            if failing.is_set():
                raise RuntimeError("disk on fire")

        store.fault = fault
        t, out = in_thread(lambda: db.assign_cohort(1, "c"))
        t.join(10)
        assert not t.is_alive(), "the caller was never answered"
        exc = out["r"]
        assert isinstance(exc, ActorFailure) and isinstance(exc.__cause__, RuntimeError)
        assert db.cohorts_of(1) == frozenset()
        failing.clear()
        db.assign_cohort(1, "c")
        assert db.cohorts_of(1) == {"c"}
    with TidalDb.open(pdb_path, clock=clock) as db:
        assert db.cohorts_of(1) == {"c"}


def test_storage_error_fails_only_its_own_writer(pdb_path, clock):
    with TidalDb.open(pdb_path, clock=clock) as db:
        store = db._core.store

        def fault(ops):
            if any(v is not None and b"bad" in v for _, _, v in ops):
                raise StorageError("injected")

        store.fault = fault
        errors = []

        def assign(u, c):
            try:
                db.assign_cohort(u, c)
            except StorageError as exc:
                errors.append((u, exc))

        threads = [
            threading.Thread(target=assign, args=(u, "bad" if u == 3 else "good")) for u in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert [u for u, _ in errors] == [3]
        assert db.cohorts_of(3) == frozenset()
        assert all(db.cohorts_of(u) == {"good"} for u in range(8) if u != 3)


def test_failed_history_write_is_reported_by_the_next_flush_once(pdb_path, clock):
    with TidalDb.open(pdb_path, clock=clock) as db:
        store = db._core.store
        store.fault = refuse_history_writes
        db.signal_with_context(1, 1, 1, 1.0)
        with pytest.raises(StorageError, match="history write") as info:
            db.flush()
        assert isinstance(info.value.__cause__, StorageError)
        store.fault = None
        db.flush()  # reported once
        assert db.stats()["failed_writes"] == 1


def test_signal_path_failure_is_counted_and_exposed(db):
    shard = _membership(db)
    table = shard.routes
    table.expand_few = _once(RuntimeError("route"), table.expand_few)  # a 1-signal batch
    db.signal_with_context(5, 1, 1, 1.0)
    with pytest.raises(StorageError, match="lost 1 signal batch"):
        db.flush()  # an acknowledged signal was lost: never silently
    db.flush()  # reported once
    assert db.stats()["handler_errors"] == 1
    db.signal_with_context(5, 1, 1, 1.0)
    assert db.read_window(COMMUNITY, 1, 1).count == 1
    assert _actors_alive(db)


def test_tiny_mailboxes_drop_nothing_under_many_producers(clock):
    cfg = Config(mailbox_capacity=1, signal_batch_size=1, membership_shards=2, ledger_shards=2)
    per, threads_n = 2500, 4
    with TidalDb.open(config=cfg, clock=clock) as db:
        for u in range(8):
            db.assign_cohort(u, f"c{u % 3}")

        def produce(k):
            for i in range(per):
                db.signal_with_context((i + k) % 8, i % 7, 1, 1.0, timestamp_ns=T0)

        threads = [threading.Thread(target=produce, args=(k,)) for k in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        s = db.stats()
        assert s["signals"] == per * threads_n == s["forwarded"]
        total = sum(db.read_window(COMMUNITY, e, 1, T0).count for e in range(7))
        assert total == per * threads_n
        assert s["handler_errors"] == 0


def test_full_mailbox_makes_the_producer_wait_then_delivers_everything(clock):
    cfg = Config(mailbox_capacity=4, signal_batch_size=1, ledger_shards=1)
    with TidalDb.open(config=cfg, clock=clock) as db:
        ledger = db._core.ledgers[0]
        gate = threading.Event()
        attribute = ledger._handlers[M.Attribute]

        def slow(msg):
            gate.wait(30)
            attribute(msg)

        ledger._handlers[M.Attribute] = slow
        done = threading.Event()
        n = 200

        def produce():
            for i in range(n):
                db.signal_with_context(1, i % 5, 1, 1.0, timestamp_ns=T0)
            done.set()

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        time.sleep(0.5)
        assert not done.is_set(), "the producer should wait while the mailboxes are full"
        inbox = db._core.host._refs[(M.MEMBERSHIP, 0)].actor_inbox
        assert inbox.qsize() <= cfg.mailbox_capacity
        gate.set()
        assert done.wait(30)
        t.join(5)
        db.flush()  # the producer's signals, read from this thread
        assert sum(db.read_window(COMMUNITY, e, 1, T0).count for e in range(5)) == n


def _returns_within(fn, seconds=1.5):
    """Run ``fn`` in a thread; (finished, its result or exception)."""
    out: list = []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return (not t.is_alive()), (out[0] if out else None)


def test_a_coordinator_failure_mid_purge_reaches_the_caller_and_later_purges_run(
    clock, monkeypatch
):
    import tidal_actors.actors.coordinator as B

    db = TidalDb.open(clock=clock)
    try:
        monkeypatch.setattr(B, "encode_manifest", _once(RuntimeError("encode"), B.encode_manifest))
        done, result = _returns_within(lambda: db.request_community_purge(1, "c"))
        assert done, "the purge's caller was never answered"
        assert isinstance(result, ActorFailure) and isinstance(result.__cause__, RuntimeError)
        done, result = _returns_within(lambda: db.request_community_purge(1, "c"))
        assert done and not isinstance(result, BaseException), "the next purge never ran"
    finally:
        # unstick the coordinator by hand, or close() waits 60 s for the purge to drain
        coordinator = db._core.coordinator
        coordinator._pending = None
        coordinator._waiting.clear()
        db.close()


def test_a_membership_failure_after_the_commit_reaches_the_caller(db):
    shard = _membership(db)
    shard._set_cohorts = _once(RuntimeError("apply"), shard._set_cohorts)
    done, result = _returns_within(lambda: db.assign_cohort(1, "c"))
    assert done, "the caller was never answered"
    assert isinstance(result, TidalError) and isinstance(result.__cause__, RuntimeError)


def test_a_producer_waiting_on_a_stopped_actors_mailbox_hears_database_closed():
    """A producer held back by a full mailbox whose actor then stops (close) used to
    put its message into the dead mailbox and return as if delivered."""
    import types

    from tidal_actors import DatabaseClosed
    from tidal_actors.runtime.mailbox import Mailbox

    box = Mailbox(1)
    box.stopped = threading.Event()
    item = types.SimpleNamespace(message=M.SignalBatch([]))
    box.put(item)
    out: list = []

    def produce():
        try:
            box.put(item)
            out.append("delivered")
        except DatabaseClosed as exc:
            out.append(exc)

    t = threading.Thread(target=produce)
    t.start()
    time.sleep(0.2)
    assert out == []  # waiting for room
    box.stopped.set()
    t.join(5)
    assert len(out) == 1 and isinstance(out[0], DatabaseClosed)
    assert box.qsize() == 1
