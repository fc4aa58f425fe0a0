"""A sender handles a message itself when the receiver is idle (`runtime.inline`).

The mailbox's claim (`Mailbox.claim`): while a sender holds it the actor's thread
takes nothing, and a sender cannot claim while that thread holds a message or
anything is queued. The pykka host: a blocking caller's calls run in its own thread
at an idle membership shard and the ledger shards below it; an async facade's loop
thread never runs a handler; a membership shard's thread may run a ledger's message,
never another membership shard's; and many callers at once leave exactly what the
reference model leaves.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
import trio
from pykka._envelope import Envelope

from tidal_actors import Config, ManualClock, Signal, TidalDb, open_tidal
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.runtime import inline
from tidal_actors.runtime.mailbox import Mailbox
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from .conftest import SEC, T0


def _until(cond: object, what: str, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_a_claim_holds_off_the_actor_thread_and_a_held_message_holds_off_claims() -> None:
    box = Mailbox(capacity=8)
    taken: list[object] = []
    proceed = threading.Event()

    def actor() -> None:  # the one getter, as pykka's loop
        while True:
            msg = box.get().message
            taken.append(msg)
            if msg == "stop":
                return
            proceed.wait()
            proceed.clear()

    assert box.claim()  # idle: a sender may run a message itself
    t = threading.Thread(target=actor, daemon=True)
    t.start()
    box.force(Envelope("first"))  # queued while claimed
    time.sleep(0.05)
    assert taken == []  # the thread takes nothing while the claim is held
    assert not box.claim()  # nor can another sender claim
    box.unclaim()
    _until(lambda: taken == ["first"], "the thread takes what came during the claim")
    # the thread holds "first" until it comes back for the next: no claim meanwhile
    assert not box.claim()
    proceed.set()
    _until(box.claim, "a claim once the thread waits on an empty mailbox")
    box.force(Envelope("second"))
    assert not box.claim()  # held already; and one queued would refuse it too
    box.unclaim()
    _until(lambda: taken == ["first", "second"], "the thread takes it after the claim")
    assert not box.claim()  # the thread holds "second" until its next get
    proceed.set()
    _until(box.claim, "idle again")
    box.unclaim()
    box.force(Envelope("stop"))
    t.join(5)
    assert taken == ["first", "second", "stop"]


def test_a_claim_needs_an_empty_mailbox_room_and_a_running_actor() -> None:
    box = Mailbox(capacity=2)
    box.force(Envelope("queued"))
    assert not box.claim()  # something queued: it goes first
    assert box.get().message == "queued"
    assert not box.claim()  # the getter holds it until its next get
    with pytest.raises(Exception):  # noqa: B017, PT011 - queue.Empty: nothing left
        box.get(block=False)
    assert box.claim()
    box.unclaim()
    box.held = lambda: 2  # the behaviour holds two messages aside: no room
    assert not box.claim()
    box.held = lambda: 0
    box.stopped = threading.Event()
    box.stopped.set()
    assert not box.claim()  # a stopped actor runs nothing more


def test_thread_levels_send_work_down_the_pipeline_only() -> None:
    seen: list[int | None] = []

    def probe() -> None:
        seen.append(inline.may_run("membership", True))
        seen.append(inline.may_run("ledger", True))
        seen.append(inline.may_run("persistence", True))
        seen.append(inline.may_run("membership", False))
        inline.set_level(inline.MEMBERSHIP)
        seen.append(inline.may_run("membership", True))
        seen.append(inline.may_run("ledger", False))
        inline.set_level(inline.LEDGER)
        seen.append(inline.may_run("ledger", True))

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    assert seen == [inline.MEMBERSHIP, inline.LEDGER, None, None, None, inline.LEDGER, None]
    assert inline.level_of("coordinator") == inline.NEVER


class _Threads:
    """Which threads ran the membership and ledger handlers of signals."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.membership: list[str] = []
        self.ledger: list[str] = []
        on_signals, on_attribute = MembershipShard._on_signals, LedgerShard._on_attribute

        def signals(shard: MembershipShard, msg: object) -> None:
            self.membership.append(threading.current_thread().name)
            on_signals(shard, msg)  # type: ignore[arg-type]

        def attribute(shard: LedgerShard, msg: object) -> None:
            self.ledger.append(threading.current_thread().name)
            on_attribute(shard, msg)  # type: ignore[arg-type]

        monkeypatch.setattr(MembershipShard, "_on_signals", signals)
        monkeypatch.setattr(LedgerShard, "_on_attribute", attribute)


def _signals(n: int, users: int) -> list[Signal]:
    return [Signal(u % users, u % 7, 1, 1.0, T0 + u * SEC) for u in range(n)]


def _twenty_batches(db: TidalDb, ref: ReferenceModel) -> None:
    """Ten users join, then 20 batches of 10 signals, each sent once the membership
    shard is idle (on a loaded host its thread may still be finishing the last
    commit's reply); the model takes the same calls."""
    for u in range(10):
        db.assign_cohort(u, f"c{u % 3}")
        ref.assign_cohort(u, f"c{u % 3}")
    db.flush()
    box = db._core.host._hosted[("membership", 0)].mailbox
    for k in range(20):
        # idle: nothing queued, nothing in hand (its thread back in ``get``)
        _until(lambda: box._busy is None and not box.qsize(), "the shard idle")
        batch = _signals(50, 10)[k % 5 * 10 : k % 5 * 10 + 10]
        db.signal_batch(batch)
        ref.signal_batch(batch)
    db.flush()


def test_a_blocking_caller_runs_signals_at_idle_shards_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each batch reaches an idle membership shard and idle ledgers: the caller's
    thread (not the main one) handles them (the flusher's periodic Publish may keep a
    ledger busy at a batch's moment, so most, not all, are asserted); the result is
    the model's."""
    seen = _Threads(monkeypatch)
    cfg = Config(membership_shards=1, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0 + 10**6 * SEC))
    with TidalDb.open(None, config=cfg, clock=ManualClock(T0 + 10**6 * SEC)) as db:
        caller = threading.Thread(target=_twenty_batches, args=(db, ref), name="caller")
        caller.start()
        caller.join(60)
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
    assert len(seen.membership) == 20
    assert seen.membership.count("caller") >= 15, seen.membership
    assert seen.ledger.count("caller") >= 15, seen.ledger


def test_the_main_thread_runs_handlers_only_if_sigint_is_handled_by_the_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With Python's default SIGINT handler a Ctrl-C could stop a handler the main
    thread ran halfway: the main thread queues (the actors' threads handle every
    batch); with a handler of the program's (as the command line's) it runs them."""
    cfg = Config(membership_shards=1, ledger_shards=2)
    main = threading.main_thread().name
    assert threading.current_thread().name == main
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        seen = _Threads(monkeypatch)
        with TidalDb.open(None, config=cfg, clock=ManualClock(T0 + 10**6 * SEC)) as db:
            _twenty_batches(db, ReferenceModel(cfg, ManualClock(T0 + 10**6 * SEC)))
        assert seen.membership and main not in seen.membership + seen.ledger
        signal.signal(signal.SIGINT, lambda *_: None)
        seen = _Threads(monkeypatch)
        with TidalDb.open(None, config=cfg, clock=ManualClock(T0 + 10**6 * SEC)) as db:
            _twenty_batches(db, ReferenceModel(cfg, ManualClock(T0 + 10**6 * SEC)))
        assert seen.membership.count(main) >= 15, seen.membership
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_interrupted_claim_is_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt between taking the claim and running the message (raised
    here where the thread sets its level) leaves the shard free: the call raises it,
    later calls and close() go on."""
    real = inline.set_level
    armed = {"on": False}

    def set_level(level: int) -> int:
        if armed["on"] and level == inline.MEMBERSHIP:
            armed["on"] = False
            raise KeyboardInterrupt
        return real(level)

    monkeypatch.setattr(inline, "set_level", set_level)
    out: dict[str, object] = {}

    def caller() -> None:
        with TidalDb.open(None, config=Config(membership_shards=1), clock=ManualClock(T0)) as db:
            db.assign_cohort(1, "c")
            db.flush()
            armed["on"] = True
            try:
                db.assign_cohort(2, "c")
            except KeyboardInterrupt:
                out["interrupted"] = True
            box = db._core.host._hosted[("membership", 0)].mailbox
            out["busy"] = box._busy
            db.assign_cohort(3, "c")
            db.flush()
            out["cohorts"] = [db.cohorts_of(u) for u in (1, 2, 3)]
        out["closed"] = True

    t = threading.Thread(target=caller)
    t.start()
    t.join(30)
    c = frozenset({"c"})
    assert out == {
        "interrupted": True,
        "busy": None,
        "cohorts": [c, frozenset(), c],
        "closed": True,
    }


def test_an_exception_that_is_not_an_exception_counts_as_the_handlers_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SystemExit out of a handler the caller's thread ran (as a signal handler of
    the program's would raise it): the message's reply fails, the shard's failure is
    reported and dealt with (resumed: an ephemeral database), the exception goes on up
    to the caller, and the database still serves."""
    real = MembershipShard._on_signals
    calls = {"n": 0}

    def on_signals(shard: MembershipShard, msg: object) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise SystemExit("a signal handler of the program's")
        real(shard, msg)  # type: ignore[arg-type]

    monkeypatch.setattr(MembershipShard, "_on_signals", on_signals)
    out: dict[str, object] = {}

    def caller() -> None:
        with TidalDb.open(None, config=Config(membership_shards=1), clock=ManualClock(T0)) as db:
            db.assign_cohort(1, "c")
            db.signal_batch([Signal(1, 1, 1, 1.0, T0)])
            db.flush()
            try:
                db.signal_batch([Signal(1, 2, 1, 1.0, T0)])
            except SystemExit as exc:
                out["raised"] = str(exc)
            out["reports"] = [r.action for r in db._core.fault_reports()]
            db.signal_batch([Signal(1, 3, 1, 1.0, T0)])
            try:
                db.flush()
            except Exception as exc:  # noqa: BLE001 - the loss is reported at the flush
                out["flush"] = type(exc).__name__
            out["records"] = db.stats()["records"]

    t = threading.Thread(target=caller)
    t.start()
    t.join(30)
    assert out["raised"] == "a signal handler of the program's"
    assert out["reports"] == ["resumed"]
    assert out["records"] == 4  # the first and third signals, to "c" and @community


@pytest.mark.trio
async def test_an_async_facade_never_runs_a_handler_in_its_loop_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _Threads(monkeypatch)
    loop = threading.current_thread().name
    async with open_tidal(None, config=Config(membership_shards=1), clock=ManualClock(T0)) as db:
        for u in range(5):
            await db.assign_cohort(u, "c")
        for _ in range(10):
            await db.signal_batch(_signals(20, 5))
            await trio.sleep(0.001)
        await db.flush()
        assert (await db.stats())["records"] == 10 * 20 * 2
    assert seen.membership and seen.ledger
    assert loop not in seen.membership and loop not in seen.ledger
    # the membership shard's own thread may run the ledgers' messages (one level down)
    assert set(seen.ledger) <= {"tidal-membership-0", "tidal-ledger-0", "tidal-ledger-1"}


def test_many_callers_at_once_leave_what_the_model_leaves() -> None:
    """Eight threads, each its own users' signals, joins, leaves and rejoins: the
    order of each caller's calls holds whether a call ran in its thread or in the
    actors' (the model applies each caller's calls in its order; users are disjoint,
    so the interleaving of callers does not change the result)."""
    cfg = Config(membership_shards=2, ledger_shards=3)
    clock = ManualClock(T0 + 10**6 * SEC)
    ref = ReferenceModel(cfg, ManualClock(T0 + 10**6 * SEC))
    plans: list[list[tuple[str, tuple[object, ...]]]] = []
    for k in range(8):
        users = [k * 100 + i for i in range(6)]
        plan: list[tuple[str, tuple[object, ...]]] = []
        for step in range(60):
            u = users[step % 6]
            if step % 13 == 5:
                plan.append(("leave_community_layer", (u,)))
            elif step % 13 == 9:
                plan.append(("rejoin_community_layer", (u,)))
            elif step % 11 == 0:
                plan.append(("assign_cohort", (u, f"c{(step + k) % 4}")))
            else:
                sigs = [Signal(x, (x + step) % 5, 1, 0.5, T0 + step * SEC) for x in users]
                plan.append(("signal_batch", (sigs,)))
        plans.append(plan)
    errors: list[BaseException] = []
    with TidalDb.open(None, config=cfg, clock=clock) as db:

        def caller(plan: list[tuple[str, tuple[object, ...]]]) -> None:
            try:
                for name, args in plan:
                    getattr(db, name)(*args)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=caller, args=(p,)) for p in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        db.flush()
        assert not errors, errors
        for plan in plans:
            for name, args in plan:
                getattr(ref, name)(*args)
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        assert db.stats()["gated"] == ref.stats()["gated"] > 0


def test_a_failure_escaping_an_inline_run_stops_the_actor_and_close_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failure outside the handler (here the held-load count the host reads) while
    a caller's thread runs a membership shard's message: logged, the actor stops as
    pykka's loop stops it, its thread ends (it was waiting in ``get``), and close()
    does not wait on it (its stop message is never taken: 30 s a thread before)."""
    out: dict[str, object] = {}

    def caller() -> None:
        db = TidalDb.open(None, config=Config(membership_shards=1), clock=ManualClock(T0))
        shard = db._core.host.behaviours[("membership", 0)]
        db.assign_cohort(1, "c")
        db.flush()
        hosted = db._core.host._hosted[("membership", 0)]

        def broken() -> int:
            raise RuntimeError("the host's own bookkeeping failed")

        monkeypatch.setattr(shard, "held_units", broken)
        db.signal_batch([Signal(1, 1, 1, 1.0, T0)])  # run here: the failure stops the actor
        assert hosted.thread is not None
        hosted.thread.join(10)
        out["thread ended"] = not hosted.thread.is_alive()
        started = time.monotonic()
        try:
            db.close()
        except Exception as exc:  # noqa: BLE001 - the stopped shard's loss may be reported
            out["close"] = type(exc).__name__
        out["close within 10 s"] = time.monotonic() - started < 10

    t = threading.Thread(target=caller)
    t.start()
    t.join(60)
    assert out["thread ended"] is True and out["close within 10 s"] is True, out
