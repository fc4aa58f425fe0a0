"""The flusher thread failing: loud, and nothing acknowledged lost.

The flusher (`Core._flush_loop`) sends buffered signals on a tick. When it raises
something other than a `TidalError` it ends; every later call raises `ActorFailure`
naming the cause, and close() still sends and commits the signals acknowledged
before, then raises it too. Expected scores come from the reference model.
"""

from __future__ import annotations

from typing import Any

import pytest

from tidal_actors import ActorFailure, Config, ManualClock, TidalDb
from tidal_actors.testing import ReferenceModel

from .conftest import SEC, T0, until

CFG = Config(ledger_shards=1, membership_shards=1)


def _break_ticks(core: Any, exc: Exception, after: int = 0) -> None:
    """Make the flusher's ticks raise ``exc`` (from the ``after + 1``-th on); a
    close's send (not a tick's offer) goes through."""
    send = core._send_all_buffers
    ticks = [0]

    def offer_breaks(offer: bool = False) -> None:  # the flusher's tick offers
        if offer:
            ticks[0] += 1
            if ticks[0] > after:
                raise exc
        send(offer)

    core._send_all_buffers = offer_breaks


def _names_the_cause(exc: BaseException) -> bool:
    return "RuntimeError: offer broke" in str(exc) and isinstance(exc.__cause__, RuntimeError)


def test_a_failed_flusher_fails_the_next_calls_and_close_loses_nothing(tmp_path) -> None:
    path = tmp_path / "s"
    db = TidalDb.open(path, config=CFG, clock=ManualClock(T0))
    core = db._core
    db.assign_cohort(1, "red")
    assert until(lambda: core._flusher_asleep)
    _break_ticks(core, RuntimeError("offer broke"))
    db.signal_with_context(1, 7, 1, 2.0, T0 - SEC)  # acknowledged; wakes the flusher
    flusher = core._flusher
    assert flusher is not None
    flusher.join(10.0)
    assert not flusher.is_alive()
    assert core._buffers[0].items  # the tick failed before sending it

    with pytest.raises(ActorFailure) as signal_err:
        db.signal_with_context(1, 8, 1, 1.0, T0 - SEC)  # refused: not acknowledged
    assert _names_the_cause(signal_err.value)
    with pytest.raises(ActorFailure) as read_err:
        db.read_decay_score("red", 7, 1, T0)
    assert _names_the_cause(read_err.value)
    with pytest.raises(ActorFailure):
        db.flush()
    with pytest.raises(ActorFailure) as close_err:
        db.close()
    assert _names_the_cause(close_err.value)
    assert db.closed
    db.close()  # idempotent: reported once

    model = ReferenceModel(CFG, ManualClock(T0))
    model.assign_cohort(1, "red")
    model.signal_with_context(1, 7, 1, 2.0, T0 - SEC)
    with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as again:
        for entity in (7, 8):
            want = model.read_decay_score("red", entity, 1, T0)
            assert again.read_decay_score("red", entity, 1, T0) == want


def test_calls_from_several_threads_when_the_flusher_fails(tmp_path) -> None:
    """Four threads signal (one at a time and in batches) while the flusher's tick
    fails and a fifth thread closes: every call either returns (acknowledged) or
    raises ActorFailure / DatabaseClosed (not acknowledged); after the reopen every
    acknowledged signal, and no other, is in the window counts (the reference model
    fed the acknowledged ones)."""
    import threading

    from tidal_actors import DatabaseClosed, Signal

    path = tmp_path / "s"
    cfg = Config(ledger_shards=2, membership_shards=2, signal_batch_size=16)
    db = TidalDb.open(path, config=cfg, clock=ManualClock(T0))
    core = db._core
    users = range(1, 9)
    for u in users:
        db.assign_cohort(u, "red")
    _break_ticks(core, RuntimeError("offer broke"), after=3)
    acked: list[list[tuple[int, int]]] = [[] for _ in range(4)]
    refused: list[BaseException] = []
    go = threading.Event()

    def producer(i: int) -> None:
        go.wait()
        for n in range(3_000):
            u, entity = users[(n + i) % len(users)], 10 * i + n % 7
            try:
                if n % 5 == 0:
                    db.signal_batch([Signal(u, entity, 1, 1.0, T0 - SEC)] * 3)
                    acked[i].extend([(u, entity)] * 3)
                else:
                    db.signal_with_context(u, entity, 1, 1.0, T0 - SEC)
                    acked[i].append((u, entity))
            except (ActorFailure, DatabaseClosed) as exc:
                refused.append(exc)
                return

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    go.set()
    assert until(lambda: core._flusher_error is not None or not any(t.is_alive() for t in threads))
    closing: list[BaseException] = []

    def closer() -> None:
        try:
            db.close()
        except BaseException as exc:  # noqa: BLE001 - looked at below
            closing.append(exc)

    c = threading.Thread(target=closer)
    c.start()
    for t in threads:
        t.join(60.0)
    c.join(60.0)
    assert not c.is_alive() and not any(t.is_alive() for t in threads)
    assert core._flusher_error is not None
    assert len(closing) == 1 and isinstance(closing[0], ActorFailure)
    assert all(isinstance(e, (ActorFailure, DatabaseClosed)) for e in refused)

    model = ReferenceModel(cfg, ManualClock(T0))
    for u in users:
        model.assign_cohort(u, "red")
    for got in acked:
        for u, entity in got:
            model.signal_with_context(u, entity, 1, 1.0, T0 - SEC)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as again:
        for i in range(4):
            for entity in range(10 * i, 10 * i + 7):
                want = model.read_window("red", entity, 1, T0)
                assert again.read_window("red", entity, 1, T0) == want, entity


@pytest.mark.trio
async def test_a_failed_flusher_under_the_async_facade(tmp_path) -> None:
    """The trio facade over a core whose flusher failed: tasks queueing signals
    hear ActorFailure naming the cause (nothing queued), leaving the block raises it
    too, and every signal acknowledged before is in the store (the reference model)."""
    import trio

    from tidal_actors import open_tidal

    path = tmp_path / "s"
    got: list[BaseException] = []
    with pytest.raises(ActorFailure) as close_err:
        async with open_tidal(str(path), config=CFG, clock=ManualClock(T0)) as db:
            core = db._core
            await db.assign_cohort(1, "red")
            _break_ticks(core, RuntimeError("offer broke"))
            await db.signal_with_context(1, 7, 1, 2.0, T0 - SEC)  # acknowledged
            while core._flusher_error is None:
                await trio.sleep(0.01)

            async def task(entity: int) -> None:
                try:
                    await db.signal_with_context(1, entity, 1, 1.0, T0 - SEC)
                except ActorFailure as exc:
                    got.append(exc)

            async with trio.open_nursery() as nursery:
                for entity in range(20, 30):
                    nursery.start_soon(task, entity)
    assert len(got) == 10 and all(_names_the_cause(e) for e in got)
    assert _names_the_cause(close_err.value)
    model = ReferenceModel(CFG, ManualClock(T0))
    model.assign_cohort(1, "red")
    model.signal_with_context(1, 7, 1, 2.0, T0 - SEC)
    with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as again:
        for entity in (7, *range(20, 30)):
            want = model.read_decay_score("red", entity, 1, T0)
            assert again.read_decay_score("red", entity, 1, T0) == want


def test_a_flusher_failing_with_a_tidal_error_is_loud_too(tmp_path) -> None:
    """A tick that raises one of the library's own errors while the database is open
    (a host whose actor is gone raises ActorFailure or DatabaseClosed) ends the
    flusher as any other error does: the next calls raise ActorFailure naming it,
    and close() sends and commits what was acknowledged before, then raises it."""
    path = tmp_path / "s"
    db = TidalDb.open(path, config=CFG, clock=ManualClock(T0))
    core = db._core
    db.assign_cohort(1, "red")
    assert until(lambda: core._flusher_asleep)
    _break_ticks(core, ActorFailure("membership[0]'s process died"))
    db.signal_with_context(1, 7, 1, 2.0, T0 - SEC)  # acknowledged; wakes the flusher
    flusher = core._flusher
    assert flusher is not None
    flusher.join(10.0)
    assert not flusher.is_alive()
    with pytest.raises(ActorFailure) as signal_err:
        db.signal_with_context(1, 8, 1, 1.0, T0 - SEC)  # refused: not acknowledged
    assert "ActorFailure: membership[0]'s process died" in str(signal_err.value)
    assert isinstance(signal_err.value.__cause__, ActorFailure)
    with pytest.raises(ActorFailure):
        db.close()
    model = ReferenceModel(CFG, ManualClock(T0))
    model.assign_cohort(1, "red")
    model.signal_with_context(1, 7, 1, 2.0, T0 - SEC)
    with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as again:
        for entity in (7, 8):
            want = model.read_decay_score("red", entity, 1, T0)
            assert again.read_decay_score("red", entity, 1, T0) == want


@pytest.mark.trio
async def test_leaving_the_async_block_by_an_exception_after_the_flusher_failed() -> None:
    """`open_tidal`'s block left by an exception while the flusher has failed: the
    close's ActorFailure propagates, the body's exception its ``__context__`` (as
    the docstring of `open_tidal` says)."""
    import trio

    from tidal_actors import open_tidal

    class Body(Exception):
        pass

    with pytest.raises(ActorFailure) as err:
        async with open_tidal(None, config=CFG, clock=ManualClock(T0)) as db:
            core = db._core
            _break_ticks(core, RuntimeError("offer broke"))
            await db.signal_with_context(1, 7, 1, 2.0, T0 - SEC)
            while core._flusher_error is None:
                await trio.sleep(0.01)
            raise Body()
    assert _names_the_cause(err.value) and isinstance(err.value.__context__, Body)
