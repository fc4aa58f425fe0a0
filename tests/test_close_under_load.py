"""Issue 8: closing under load, a second close, and opening a directory twice.

* ``close()`` while eight threads are mid-call finishes within a bounded time; each
  call in flight either completes or raises `DatabaseClosed` (nothing else, and
  nobody waits for ever); acknowledged control operations survive the reopen, the
  one in flight at the close is there entirely or not at all.
* A second ``close()`` is a no-op; every call on a closed database raises
  DatabaseClosed.
* The same directory opened twice, in one process or from two, is refused with
  `DatabaseLocked` (documented choice); the lock goes with the process that held it,
  even when it was killed.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tidal_actors import (
    COMMUNITY,
    Config,
    DatabaseClosed,
    DatabaseLocked,
    ManualClock,
    Signal,
    TidalDb,
)
from tidal_actors.testing import ReferenceModel

from .conftest import T0

CLOSE_BOUND_S = 20.0


def _apply(target, op, u, arg):
    if op == "assign":
        target.assign_cohort(u, arg)
    elif op == "unassign":
        target.unassign_cohort(u, arg)
    elif op == "leave":
        target.leave_community_layer(u)
    elif op == "rejoin":
        target.rejoin_community_layer(u)
    elif op == "purge":
        target.request_community_purge(u, arg)


def _membership(x, u):
    return (x.community_layer_status(u).status, len(x.community_leave_history(u)), x.cohorts_of(u))


@pytest.mark.parametrize("mailbox", [4096, 2], ids=["default-mailbox", "tiny-mailbox"])
def test_close_while_eight_threads_are_mid_call(tmp_path, mailbox):
    cfg = Config(membership_shards=2, ledger_shards=2, mailbox_capacity=mailbox)
    path = str(tmp_path / "db")
    clock = ManualClock(T0)
    db = TidalDb.open(path, config=cfg, clock=clock)
    models = [ReferenceModel(cfg, ManualClock(T0)) for _ in range(8)]
    in_flight: list[tuple | None] = [None] * 8
    outcome: list[str] = [""] * 8
    unexpected: list[BaseException] = []

    def worker(k):
        rng = random.Random(k)
        users = [k * 10 + j for j in range(3)]
        while True:
            u = rng.choice(users)
            r = rng.random()
            try:
                if r < 0.5:
                    db.signal_batch(
                        [Signal(u, rng.randrange(5), 1, 1.0, T0) for _ in range(rng.randint(1, 50))]
                    )
                    continue
                if r < 0.6:
                    db.read_decay_score(COMMUNITY, 1, 1)
                    db.flush() if rng.random() < 0.2 else db.stats()
                    continue
                op = rng.choice(("assign", "unassign", "leave", "rejoin", "purge"))
                arg = rng.choice(("a", "b", "c"))
                in_flight[k] = (op, u, arg)
                _apply(db, op, u, arg)
                _apply(models[k], op, u, arg)
                in_flight[k] = None
            except DatabaseClosed:
                outcome[k] = "closed"
                return
            except BaseException as exc:  # noqa: BLE001
                unexpected.append(exc)
                outcome[k] = "error"
                return

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.4)
    t0 = time.monotonic()
    db.close()
    took = time.monotonic() - t0
    for t in threads:
        t.join(CLOSE_BOUND_S)
    assert not any(t.is_alive() for t in threads), "a call never returned after close()"
    assert took < CLOSE_BOUND_S, took
    assert unexpected == [], unexpected
    assert outcome == ["closed"] * 8
    t1 = time.monotonic()
    db.close()  # a no-op
    assert time.monotonic() - t1 < 0.1
    # acknowledged operations are there; the one in flight entirely or not at all
    with TidalDb.open(path, config=cfg, clock=clock) as db2:
        for k in range(8):
            flight = in_flight[k]
            for u in (k * 10 + j for j in range(3)):
                got = _membership(db2, u)
                want = _membership(models[k], u)
                if flight is not None and flight[1] == u and got != want:
                    _apply(models[k], *flight)
                    want = _membership(models[k], u)
                assert got == want, (k, u, flight)


CLOSED_CALLS = [
    lambda db: db.signal_with_context(1, 1, 1),
    lambda db: db.signal_batch([Signal(1, 1, 1)]),
    lambda db: db.assign_cohort(1, "c"),
    lambda db: db.unassign_cohort(1, "c"),
    lambda db: db.cohorts_of(1),
    lambda db: db.leave_community_layer(1),
    lambda db: db.rejoin_community_layer(1),
    lambda db: db.community_layer_status(1),
    lambda db: db.community_leave_history(1),
    lambda db: db.request_community_purge(1, "c"),
    lambda db: db.list_purge_manifests(1),
    lambda db: db.read_decay_score("c", 1, 1),
    lambda db: db.read_window("c", 1, 1),
    lambda db: db.top_entities("c", 1, 3),
    lambda db: db.aggregate_rows(),
    lambda db: db.stats(),
    lambda db: db.flush(),
    lambda db: db.rematerialize("c"),
]


@pytest.mark.parametrize("call", CLOSED_CALLS, ids=range(len(CLOSED_CALLS)))
def test_every_call_on_a_closed_database_raises_database_closed(pdb_path, call):
    db = TidalDb.open(pdb_path)
    db.close()
    db.close()
    assert db.closed
    with pytest.raises(DatabaseClosed):
        call(db)


def test_context_manager_close_then_close_again_is_a_no_op(pdb_path):
    with TidalDb.open(pdb_path) as db:
        db.assign_cohort(1, "c")
    db.close()
    with TidalDb.open(pdb_path) as db:
        assert db.cohorts_of(1) == {"c"}


def test_two_threads_opening_one_directory_exactly_one_wins(pdb_path):
    results: list[object] = []
    barrier = threading.Barrier(4)

    def opener():
        barrier.wait()
        try:
            results.append(TidalDb.open(pdb_path))
        except DatabaseLocked as exc:
            results.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    dbs = [r for r in results if isinstance(r, TidalDb)]
    assert len(dbs) == 1 and len(results) == 4
    dbs[0].close()
    TidalDb.open(pdb_path).close()


def test_the_lock_of_a_killed_process_is_released(pdb_path):
    code = textwrap.dedent(
        """
        import sys, time
        from tidal_actors import TidalDb
        db = TidalDb.open(sys.argv[1])
        db.assign_cohort(1, "c")
        print("open", flush=True)
        time.sleep(60)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", code, pdb_path], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "open"
        with pytest.raises(DatabaseLocked, match="another process"):
            TidalDb.open(pdb_path)
    finally:
        p.kill()
        p.wait(30)
    with TidalDb.open(pdb_path) as db:  # killed: its flock went with it
        assert db.cohorts_of(1) == {"c"}


def test_a_call_sent_just_before_close_is_never_left_waiting(pdb_path):
    """The interleaving, forced with hooks: the caller passes the open check, close()
    sends its barriers and waits for the last one (the flush); the caller's assign is
    sent after it; close() stops the shards (the assign's commit is answered to a
    stopped shard) and fails the calls it tracks; only then does the caller track its
    reply."""
    db = TidalDb.open(pdb_path)
    core = db._core
    passed_check, barrier_done, sent, closed = (threading.Event() for _ in range(4))
    check_open, settle, track = core.check_open, core.host.settle, core.track

    def hooked_check_open():
        check_open()
        if threading.current_thread().name == "caller" and not passed_check.is_set():
            passed_check.set()
            barrier_done.wait(10)

    def hooked_settle(reply, timeout):
        ok = settle(reply, timeout)
        if reply.label == "close-flush":  # close()'s last barrier has passed
            barrier_done.set()
            sent.wait(10)
        return ok

    def hooked_track(reply):
        if threading.current_thread().name == "caller":
            sent.set()
            closed.wait(10)
        track(reply)

    core.check_open = hooked_check_open
    core.host.settle = hooked_settle
    core.track = hooked_track
    result: list[object] = []

    def caller():
        try:
            db.assign_cohort(1, "fresh")
            result.append("ok")
        except DatabaseClosed as exc:
            result.append(exc)

    t = threading.Thread(target=caller, name="caller", daemon=True)
    t.start()
    assert passed_check.wait(10)
    db.close()
    closed.set()
    t.join(3)
    assert not t.is_alive(), "the call was left waiting after close()"
    assert result and (result[0] == "ok" or isinstance(result[0], DatabaseClosed))


@pytest.mark.parametrize("call", ["purge", "signal", "signal_batch"])
def test_a_call_that_found_the_database_open_is_refused_once_close_has_begun(
    tmp_path, call
) -> None:  # type: ignore[no-untyped-def]
    """A call that passed the open check and was then preempted while close() got past
    its barriers must not be sent after them: it would be committed behind the
    snapshot's back (a purge: manifest and tombstones stored, retraction missing) or
    lost (a signal queued in a buffer nobody flushes). It raises DatabaseClosed and
    nothing of it is stored."""
    path = str(tmp_path / "s")
    clock = ManualClock(T0)
    db = TidalDb.open(path, config=Config(rematerialize_after_ms=None), clock=clock)
    db.assign_cohort(1, "c")
    db.signal_with_context(1, 5, 0, 1.0, T0)
    db.flush()
    core = db._core
    real = core._shard_of if call == "purge" else core.now
    real_stop = core.host.stop
    stopping = threading.Event()

    def stop(*args):  # type: ignore[no-untyped-def]
        stopping.set()  # close() is past its barriers: the actors are about to stop
        time.sleep(0.1)
        return real_stop(*args)

    def stalled(*args):  # type: ignore[no-untyped-def]
        stopping.wait(10)
        return real(*args)

    core.host.stop = stop

    if call == "purge":
        core._shard_of = stalled
        run = lambda: db.request_community_purge(1, "c")  # noqa: E731
    elif call == "signal":
        core.now = stalled
        run = lambda: db.signal_with_context(1, 6, 0, 1.0)  # noqa: E731  (no timestamp: reads the clock)
    else:
        core.now = stalled
        run = lambda: db.signal_batch([Signal(1, 6, 0, 1.0, None)])  # noqa: E731
    out: list[object] = []

    def caller() -> None:
        try:
            out.append(run())
        except Exception as exc:
            out.append(exc)

    t = threading.Thread(target=caller)
    t.start()
    time.sleep(0.05)  # the caller is past the open check, stalled
    db.close()
    t.join(10)
    assert len(out) == 1 and isinstance(out[0], DatabaseClosed), out
    with TidalDb.open(path, config=Config(rematerialize_after_ms=None), clock=clock) as again:
        assert again.list_purge_manifests(1) == []
        assert again.read_decay_score("c", 5, 0, T0) == 1.0
        assert again.read_window(COMMUNITY, 6, 0, T0).count == 0


def test_a_second_close_from_another_thread_returns_once_the_first_is_done(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "s")
    db = TidalDb.open(path, clock=ManualClock(T0))
    db.signal_batch([Signal(u % 100, u % 7, 0, 1.0, T0) for u in range(20_000)])
    core = db._core
    real_stop = core.host.stop

    def slow_stop(*args):  # type: ignore[no-untyped-def]
        time.sleep(0.3)  # the first close is still at work when the second is called
        return real_stop(*args)

    core.host.stop = slow_stop
    first = threading.Thread(target=db.close)
    first.start()
    while not core.closed:
        time.sleep(0.0005)
    db.close()  # returns only once the first close has closed the store
    assert not first.is_alive()
    with TidalDb.open(path, clock=ManualClock(T0)) as again:  # not DatabaseLocked
        assert sum(again.read_window(COMMUNITY, e, 0, T0).count for e in range(7)) == 20_000


def test_signals_stashed_behind_a_control_write_count_against_the_mailbox(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """While a control operation commits, its membership shard sets later messages
    aside; the signal batches among them count against ``mailbox_capacity``, so
    producers wait instead of piling signals up there."""
    cap = 2
    cfg = Config(mailbox_capacity=cap, signal_batch_size=1, ledger_shards=4)
    with TidalDb.open(str(tmp_path / "s"), config=cfg, clock=ManualClock(T0)) as db:
        shard = db._core.host.behaviours[("membership", 0)]
        stop = threading.Event()
        peak = [0]

        def produce(k: int) -> None:
            i = 0
            while not stop.is_set():
                db.signal_with_context(k, i % 5, 0, 1.0, T0)
                i += 1

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], shard._stashed_batches)

        threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)] + [
            threading.Thread(target=watch)
        ]
        for t in threads:
            t.start()
        for _ in range(
            40
        ):  # control writes, each committed with fsync: the shard stashes meanwhile
            db.leave_community_layer(9)
            db.rejoin_community_layer(9)
        stop.set()
        for t in threads:
            t.join(10)
        assert 0 < peak[0] <= cap, peak[0]


def test_lmdb_flags_after_close_raises_database_closed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = TidalDb.open(str(tmp_path / "s"))
    db.close()
    with pytest.raises(DatabaseClosed):
        db.lmdb_flags()
