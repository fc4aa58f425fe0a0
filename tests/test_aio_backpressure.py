"""Backpressure in the async facades is an await, under trio and under asyncio: a task
that finds its membership mailbox full is parked (other tasks run), is woken when the
shard takes a batch, and a cancellation while it waits queues nothing.

The membership shard is held on a gate (a ``threading.Event``) so that its mailbox
fills; nothing here measures time (a watchdog thread opens the gate after 20 s so
that a blocked loop fails the test instead of hanging it).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from tidal_actors import COMMUNITY, Config, ManualClock, open_tidal
from tidal_actors.actors import messages as M

from .conftest import T0

LOOPS = ["trio", "asyncio"]
# the flusher thread (which sends partial batches) kept out of the way: 10 s
CFG = Config(
    mailbox_capacity=2, signal_batch_size=4, ledger_shards=1, signal_flush_interval_ms=10_000.0
)


def run(loop: str, fn: Callable[[], Awaitable[Any]]) -> Any:
    if loop == "trio":
        return trio.run(fn)
    return asyncio.run(fn())  # type: ignore[arg-type]


async def yield_(loop: str) -> None:
    if loop == "trio":
        await trio.sleep(0)
    else:
        await asyncio.sleep(0)


class Gate:
    """Holds the membership shard's signal batches until opened."""

    def __init__(self, db: Any) -> None:
        self.event = threading.Event()
        self.entered = threading.Event()  # the shard holds a batch
        self.by_watchdog = False
        shard = db._core.host.behaviours[(M.MEMBERSHIP, 0)]
        original = shard._handlers[M.SignalBatch]

        def held(msg: M.SignalBatch) -> None:
            self.entered.set()
            self.event.wait(30)
            original(msg)

        shard._handlers[M.SignalBatch] = held
        self._timer = threading.Timer(20.0, self._watchdog)
        self._timer.daemon = True
        self._timer.start()

    def _watchdog(self) -> None:
        self.by_watchdog = True
        self.event.set()

    def open(self) -> None:
        self._timer.cancel()
        self.event.set()


def parked(db: Any) -> bool:
    return any(db._room_events.values())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_full_mailbox_parks_the_sender_and_the_loop_runs_on(loop: str) -> None:
    n = 40

    async def main() -> tuple[int, int, int, int, bool, int]:
        async with open_tidal(None, config=CFG, clock=ManualClock(T0)) as db:
            gate = Gate(db)
            sent = [0]
            ticks_while_parked = [0]
            sent_when_parked = [n]

            async def produce() -> None:
                for i in range(n):
                    await db.signal_with_context(1, i % 5, 1, 1.0)
                    sent[0] += 1
                    while sent[0] == 4 and not gate.entered.is_set():
                        await yield_(loop)  # the first batch reached the held shard

            async def tick() -> None:
                # the loop keeps running other tasks while the producer waits for room
                while not parked(db) and sent[0] < n:
                    await yield_(loop)
                sent_when_parked[0] = sent[0]
                while ticks_while_parked[0] < 200 and not gate.by_watchdog:
                    await yield_(loop)
                    ticks_while_parked[0] += 1
                gate.open()

            if loop == "trio":
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(produce)
                    nursery.start_soon(tick)
            else:
                async with asyncio.TaskGroup() as group:
                    group.create_task(produce())
                    group.create_task(tick())
            await db.flush()
            stats = await db.stats()
            window = await db.read_window(COMMUNITY, 0, 1, T0)
            return (
                sent[0],
                stats["signals"],
                window.count,
                ticks_while_parked[0],
                gate.by_watchdog,
                sent_when_parked[0],
            )

    sent, applied, entity0, ticks, by_watchdog, sent_when_parked = run(loop, main)
    assert not by_watchdog, "the loop was blocked while the producer waited for room"
    # the gate holds one batch in the handler and two in the mailbox (capacity 2), and
    # a batch is 4 signals: the producer parks once 12 are out and 3 more buffered
    assert sent_when_parked == 15
    assert ticks == 200
    assert sent == applied == n
    assert entity0 == n // 5  # entity i % 5: 8 of the 40 signals


@pytest.mark.parametrize("loop", LOOPS)
def test_a_signal_cancelled_while_waiting_for_room_is_not_applied(loop: str) -> None:
    async def main() -> tuple[int, int, bool]:
        async with open_tidal(None, config=CFG, clock=ManualClock(T0)) as db:
            gate = Gate(db)
            sent = [0]

            async def produce() -> None:
                for i in range(1000):
                    await db.signal_with_context(1, i % 5, 1, 1.0)
                    sent[0] += 1

            if loop == "trio":
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(produce)
                    while not parked(db):
                        await trio.sleep(0)
                    nursery.cancel_scope.cancel()
            else:
                task = asyncio.get_running_loop().create_task(produce())
                while not parked(db):
                    await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert sent[0] < 1000
            gate.open()
            await db.flush()
            return sent[0], (await db.stats())["signals"], gate.by_watchdog

    sent, applied, by_watchdog = run(loop, main)
    assert not by_watchdog
    # every call that returned was queued and applied; the cancelled one was not
    assert applied == sent


@pytest.mark.parametrize("loop", LOOPS)
def test_many_tasks_under_backpressure_lose_nothing(loop: str) -> None:
    tasks, per = 50, 30
    cfg = Config(mailbox_capacity=1, signal_batch_size=8, ledger_shards=2, membership_shards=2)

    async def main() -> tuple[int, list[int]]:
        async with open_tidal(None, config=cfg, clock=ManualClock(T0)) as db:
            for u in range(tasks):
                await db.assign_cohort(u, f"c{u % 3}")

            async def produce(u: int) -> None:
                for i in range(per):
                    await db.signal_with_context(u, i % 4, 1, 1.0, timestamp_ns=T0)
                await db.leave_community_layer(u)
                await db.signal_with_context(u, 0, 1, 1.0, timestamp_ns=T0)  # gated

            if loop == "trio":
                async with trio.open_nursery() as nursery:
                    for u in range(tasks):
                        nursery.start_soon(produce, u)
            else:
                async with asyncio.TaskGroup() as group:
                    for u in range(tasks):
                        group.create_task(produce(u))
            await db.flush()
            stats = await db.stats()
            counts = [(await db.read_window(f"c{k}", 0, 1, T0)).count for k in range(3)]
            return stats["gated"], counts

    gated, counts = run(loop, main)
    assert gated == tasks
    # users u % 3 == k are in cohort c{k}; each sent per // 4 + 1 (i % 4 == 0: 8 of 30) to entity 0
    assert counts == [len(range(k, tasks, 3)) * 8 for k in range(3)]
