"""The flusher thread: it sleeps while it has nothing to do and is woken by the work.

* with nothing buffered, no ledger shard's changes waiting and no rebuild due, it
  sleeps (no tick runs);
* the first signal buffered wakes it, and it sends the signal on;
* a ledger shard whose changes wait for a `Publish` wakes it (`wake_ticker`).

Expected scores come from the reference model.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tidal_actors import Config, ManualClock, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.testing import ReferenceModel

from .conftest import T0

SEC = 10**9
CFG = Config(ledger_shards=1, membership_shards=1)


def _until(cond: Callable[[], bool], limit_s: float = 10.0) -> bool:
    """Poll ``cond`` until it holds or ``limit_s`` seconds passed; whether it holds."""
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def test_the_flusher_sleeps_until_a_signal_is_buffered() -> None:
    with TidalDb.open(None, config=CFG, clock=ManualClock(T0)) as db:
        core = db._core
        db.assign_cohort(1, "red")
        assert _until(lambda: core._flusher_asleep)
        ticks: list[int] = []
        tune = core._tune_batches

        def counted() -> None:
            ticks.append(1)
            tune()

        core._tune_batches = counted  # type: ignore[method-assign]
        time.sleep(0.05)  # 25 flush intervals: asleep, it runs none
        assert ticks == []
        db.signal_with_context(1, 7, 1, 2.0, T0 - SEC)  # buffered: wakes it
        assert _until(lambda: not core._buffers[0].items)  # sent on by the flusher
        assert ticks
        model = ReferenceModel(CFG, ManualClock(T0))
        model.assign_cohort(1, "red")
        model.signal_with_context(1, 7, 1, 2.0, T0 - SEC)
        want = model.read_decay_score("red", 7, 1, T0)
        assert db.read_decay_score("red", 7, 1, T0) == want
        assert _until(lambda: core._flusher_asleep)  # nothing left to do: asleep again


class _Ctx:
    """A host context whose `wake_ticker` counts its calls."""

    def __init__(self) -> None:
        self.config = CFG
        self.clock = ManualClock(T0)
        self.durable = False
        self.publish_every_s = 0.005
        self.woken = 0

    def tell(self, address: object, message: object) -> None:
        pass

    def wake_ticker(self) -> None:
        self.woken += 1


def test_a_ledger_shard_with_changes_waiting_wakes_the_flusher() -> None:
    ctx = _Ctx()
    shard = LedgerShard(ctx, 0)
    shard.wanted = time.monotonic()  # a reader wants its view
    shard.receive(M.Publish())  # publishes its first view
    assert shard.view is not None and ctx.woken == 0
    shard._published_at = time.monotonic() + 60  # the next changes must wait
    shard._dirty_all = True  # changes noted since
    shard.on_idle()
    assert shard.unpublished and ctx.woken == 1  # waits for a `Publish`: wakes it
    shard.on_idle()
    assert ctx.woken == 1  # once, when the changes start waiting


def test_a_rebuild_scheduled_again_after_a_failure_wakes_the_flusher() -> None:
    """A failed rebuild is scheduled again (`_retry_remat`): the flusher, asleep,
    must be woken to send the `Tick` that starts it, as for a first schedule."""
    from tidal_actors._types import PurgeId, PurgeStatus
    from tidal_actors.actors.coordinator import PurgeCoordinator

    ctx = _Ctx()
    coord = PurgeCoordinator(ctx)  # type: ignore[arg-type]
    status = PurgeStatus(PurgeId(1), 1, "red", 1, False, None, 0)
    coord.state.statuses[1] = (status, 0)
    assert not coord.remat_due and ctx.woken == 0
    coord._retry_remat("red")
    assert coord.remat_due  # a rebuild waits for a tick...
    assert ctx.woken == 1  # ...and the flusher was told


class _Recording:
    """Stands in for the flusher's wake event: records, at each wait, whether the
    flusher's stop event was set."""

    def __init__(self, stop: object, inner: object) -> None:
        self.stop, self.inner, self.waits_after_stop = stop, inner, 0

    def clear(self) -> None:
        self.inner.clear()  # type: ignore[attr-defined]

    def set(self) -> None:
        self.inner.set()  # type: ignore[attr-defined]

    def wait(self, timeout: float) -> bool:
        if self.stop.is_set():  # type: ignore[attr-defined]
            self.waits_after_stop += 1
        return bool(self.inner.wait(0.0))  # type: ignore[attr-defined]


def test_close_during_a_tick_does_not_leave_the_flusher_sleeping_out_its_timeout() -> None:
    """close() sets the stop event, then wakes the flusher; if that lands during a
    tick with nothing to do (after the flusher looked at its stop event, before it
    cleared its wake event), the flusher must not then sleep out its timeout (a
    quarter of ``WANTED_S``) before it stops: close() waits for it."""
    import threading

    with TidalDb.open(None, config=CFG, clock=ManualClock(T0)) as db:
        core = db._core
        thread = core._flusher
        assert thread is not None
        core._flusher_stop.set()  # the real flusher stops; this test runs the loop
        core._flusher_wake.set()
        thread.join()
        stop = threading.Event()
        rec = _Recording(stop, threading.Event())
        core._flusher_stop, core._flusher_wake = stop, rec  # type: ignore[assignment]
        tune = core._tune_batches

        def tune_then_close() -> None:  # close() lands here, within the tick
            tune()
            stop.set()
            rec.set()

        core._tune_batches = tune_then_close  # type: ignore[method-assign]
        core._flush_loop()  # one tick, then it stops
        assert rec.waits_after_stop == 0


def test_a_fenced_ledger_shard_leaves_the_flusher_nothing_to_do() -> None:
    """A ledger shard fenced (its restart failed) with changes waiting for a `Publish`
    (or a view nobody reads) must not keep the flusher awake sending `Publish` to
    the fence, which counts each as a handler failure."""
    import pytest

    from tidal_actors._errors import ActorFailure, StorageError
    from tidal_actors.runtime.supervision import Fenced

    db = TidalDb.open(None, config=CFG, clock=ManualClock(T0))
    try:
        core = db._core
        thread = core._flusher
        assert thread is not None
        core._flusher_stop.set()  # no flusher tick races this test's ledger state
        core._flusher_wake.set()
        thread.join()
        old = core.ledgers[0]
        old._on, old.wanted = True, time.monotonic() - 60  # a view, unread for 60 s
        old.unpublished = True  # and changes waiting for a `Publish` at the failure
        address = (M.LEDGER, 0)
        core._replaced(address, Fenced(old.ctx, address, ActorFailure("restart failed")))
        assert not core._flusher_work()  # the flusher may sleep
        assert not core.ledgers[0].unread(time.monotonic())  # and sends no `Publish`
    finally:
        with pytest.raises(StorageError, match="fenced"):  # close() reports the fence
            db.close()


def test_a_signal_buffered_as_the_flusher_goes_to_sleep_is_not_left_behind() -> None:
    """The first signal buffered after a tick found nothing, before the flusher
    marks itself asleep: its wake-up finds the flusher awake and does nothing, so
    the flusher must see the signal when it looks again, and not sleep."""
    import threading

    db = TidalDb.open(None, config=CFG, clock=ManualClock(T0))
    try:
        core = db._core
        thread = core._flusher
        assert thread is not None
        core._flusher_stop.set()  # the real flusher stops; this test runs the loop
        core._flusher_wake.set()
        thread.join()
        stop, inner = threading.Event(), threading.Event()
        waits: list[bool] = []  # at each sleep: whether a signal was buffered

        class _Wake:
            cleared = 0

            def clear(self) -> None:
                inner.clear()
                self.cleared += 1
                if self.cleared == 1:  # in the window: the tick looked, not asleep yet
                    db.signal_with_context(1, 7, 1, 2.0, T0 - SEC)

            def set(self) -> None:
                inner.set()

            def wait(self, timeout: float) -> bool:
                waits.append(bool(core._buffers[0].items))
                stop.set()  # one sleep is enough: the loop ends after it
                return True

        core._flusher_stop, core._flusher_wake = stop, _Wake()  # type: ignore[assignment]
        core._flush_loop()
        assert waits == [False]  # it slept once, with nothing buffered
        assert not core._buffers[0].items  # the signal was sent on before that
    finally:
        db.close()
