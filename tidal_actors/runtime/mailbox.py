"""The bounded mailbox of a pykka actor (`runtime.pykka_host`).

FIFO and unbounded for control traffic; messages that carry load (signal batches,
attributions, history writes; ``units`` counts their work) wait for room once it holds
``Config.mailbox_capacity`` messages, or once the load it holds would take its actor
more than ``Config.inflight_budget_ms`` to work through (queued units times the
actor's measured seconds per unit, a moving average). ``offer``, ``force``,
``reserve``/``put_reserved`` and ``when_room`` serve producers that must not wait.

An actor takes the signal batches queued back to back at the head of its mailbox as
one message, and a membership shard's attributions queued before the first message
of another kind as one message, up to ``COALESCE_RECORDS`` units (`coalesce`). It takes what is
queued when it asks: it never waits for more. A host that follows each message it
put (the Ray host's durable acknowledgements, `runtime.ray_restart.DurableEnds`)
hears which messages a merged one stands for (``on_merge``).

A sender may run a message itself instead of queueing it (`runtime.inline`): it
`claim` s the actor (possible only while its mailbox is empty and nothing is being
handled) and `unclaim` s it after. The actor's thread never takes a message while a
sender holds the claim, and a sender never claims while the thread holds a message
it took (from `get` until it comes back for the next), so one message at a time is
handled, in mailbox order.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from itertools import chain
from typing import Any

import numpy as np
from pykka._envelope import Envelope  # what ActorRef.tell puts; offer/force bypass tell

from tidal_actors._errors import DatabaseClosed
from tidal_actors.actors import messages as M

__all__ = ["COALESCE_RECORDS", "Mailbox", "coalesce", "units"]

_BOUNDED = (M.SignalBatch, M.Attribute)

# an actor takes the signal batches queued back to back at the head of its mailbox,
# or one membership shard's attributions queued before any other kind of message, as
# one message, up to this many signals or records (`Mailbox._get`)
COALESCE_RECORDS = 4096

_THREAD = "thread"  # `Mailbox._busy`: the actor's thread handles a message


def units(msg: object) -> int:
    """The work a load message carries (0: not load): signals, records, or one write."""
    if type(msg) is M.SignalBatch:
        return len(msg.signals)
    if type(msg) is M.Attribute:
        return len(msg.rseqs)
    if type(msg) is M.Write and msg.reply is None:
        return 1
    return 0


def coalesce(msgs: list[Any]) -> Any:
    """One message holding the load of ``msgs`` (all `SignalBatch`, or all
    `Attribute` of one membership shard), in order: signals concatenated; records'
    columns concatenated and each context at its record's new index; the signal
    batches they carry (``batches``) summed, so a failure on it counts them all.

    Handling it is handling ``msgs`` one after the other: a membership shard routes a
    batch's signals in order, and a ledger adds a batch's records in order, which
    equals adding them one by one (the property tests of
    ``tests/test_columnar_ledger.py``)."""
    if type(msgs[0]) is M.SignalBatch:
        signals: list[Any] = []
        for m in msgs:
            signals.extend(m.signals)
        return M.SignalBatch(signals, sum(m.batches for m in msgs))
    contexts: dict[int, bytes] = {}
    at = 0
    for m in msgs:
        if m.contexts:
            contexts.update((at + i, cx) for i, cx in m.contexts.items())
        at += len(m.cohorts)
    cohorts: list[str] = []
    for m in msgs:
        cohorts.extend(m.cohorts)
    return M.Attribute(
        msgs[0].mshard,
        _cat([m.rseqs for m in msgs], np.int64),
        _cat([m.users for m in msgs], np.uint64),
        cohorts,
        _cat([m.entities for m in msgs], np.uint64),
        _cat([m.types for m in msgs], np.uint64),
        _cat([m.weights for m in msgs], np.float64),
        _cat([m.timestamps for m in msgs], np.int64),
        contexts or None,
        sum(m.batches for m in msgs),
    )


def _cat(cols: list[M.Column], dtype: type[np.generic]) -> M.Column:
    """`Attribute` columns (`messages.Column`) joined: one list if all are lists, else
    one numpy array of ``dtype`` (the column's)."""
    if all(type(c) is list for c in cols):
        return list(chain.from_iterable(cols))
    return np.concatenate([np.asarray(c, dtype=dtype) for c in cols])


class Mailbox(queue.Queue[Envelope[Any]]):
    """Unbounded queue that holds back load-carrying messages past a capacity."""

    def __init__(self, capacity: int, budget_s: float | None = None) -> None:
        super().__init__()
        self._cap = capacity
        self._budget_s = budget_s
        self._units = 0  # the load queued, in units (`units`)
        self._reserved = 0  # room promised to producers about to put (`reserve`)
        self.unit_s = 0.0  # the actor's seconds per unit (moving average; 0: not measured)
        self.stopped: threading.Event | None = None  # the owning actor's, set once it runs
        # messages the behaviour has taken out but holds aside (`Behaviour.held`): they
        # count against the capacity, so holding them back does not let producers run on
        self.held: Callable[[], int] = lambda: 0
        self.held_units: Callable[[], int] = lambda: 0
        self._room_waiters: list[Callable[[], None]] = []
        # told ``(parts, merged)`` when the actor takes ``merged`` for ``parts``
        self.on_merge: Callable[[list[Any], Any], None] | None = None
        # who handles a message now: None (nobody), _THREAD (the actor's thread, from
        # `get` until its next `get`) or the ident of a sender's thread (`claim`)
        self._busy: str | int | None = None

    def _full(self) -> bool:  # under self.mutex
        if self._qsize() + self.held() + self._reserved >= self._cap:
            return True
        if self._budget_s is None:
            return False
        load = self._units + self.held_units()
        return load > 0 and load * self.unit_s >= self._budget_s

    def _put(self, item: Envelope[Any]) -> None:
        super()._put(item)
        self._units += units(item.message)

    def _get(self) -> Envelope[Any]:
        item = super()._get()
        msg = item.message
        self._units -= units(msg)
        kind = type(msg)
        if (kind is M.Attribute or kind is M.SignalBatch) and self.queue:
            taken = self._take_alike(msg)
            if len(taken) > 1:
                merged = coalesce(taken)
                if self.on_merge is not None:
                    self.on_merge(taken, merged)
                item = Envelope(merged)
                self.not_full.notify_all()
        return item

    def _take_alike(self, msg: M.Attribute | M.SignalBatch) -> list[Any]:
        """``msg`` and the messages behind it it can be handled with as one
        (`coalesce`), taken out, up to ``COALESCE_RECORDS`` units in all: the signal
        batches right behind it; or the attributions of its membership shard before
        the first message that is not an attribution (those of other membership
        shards stay, in their order: only one sender's order is kept, `pykka_host`)."""
        taken: list[Any] = [msg]
        kind: Any = type(msg)
        shard = msg.mshard if isinstance(msg, M.Attribute) else None
        n = units(msg)
        queue = self.queue
        passed: list[Envelope[Any]] = []
        while queue:
            nxt: Any = queue[0].message
            if type(nxt) is not kind:
                break
            if shard is not None and nxt.mshard != shard:
                passed.append(queue.popleft())
                continue
            k = units(nxt)
            if n + k > COALESCE_RECORDS:
                break
            queue.popleft()
            self._units -= k
            taken.append(nxt)
            n += k
        if passed:
            queue.extendleft(reversed(passed))
        return taken

    def handled(self, n: int, seconds: float) -> None:
        """The actor took ``seconds`` over a message of ``n`` units (n > 0)."""
        per = seconds / n
        self.unit_s = per if self.unit_s == 0.0 else 0.8 * self.unit_s + 0.2 * per

    def room_made(self) -> None:
        """Wake producers waiting for room (the behaviour released what it held)."""
        with self.not_full:
            self.not_full.notify_all()
        self._call_room_waiters()

    def _call_room_waiters(self) -> None:
        if not self._room_waiters:
            return
        stopped = self.stopped
        with self.mutex:
            if self._full() and not (stopped is not None and stopped.is_set()):
                return
            waiters, self._room_waiters = self._room_waiters, []
        for fn in waiters:
            with contextlib.suppress(Exception):  # a waiter gone must not hurt the actor
                fn()

    def get(self, block: bool = True, timeout: float | None = None) -> Envelope[Any]:
        """The next message (the actor's thread, the one getter, calls it): waits
        while the mailbox is empty or a sender holds the claim; the thread then holds
        the actor until its next call. ``block``/``timeout`` as `queue.Queue.get`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.not_empty:
            if self._busy is _THREAD:  # back for the next one: done with the last
                self._busy = None
            while not self._qsize() or self._busy is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if not block or (left is not None and left <= 0.0):
                    raise queue.Empty
                self.not_empty.wait(left)
            item = self._get()
            self._busy = _THREAD
            self.not_full.notify()
        if self._room_waiters:
            self._call_room_waiters()
        return item

    def claim(self) -> bool:
        """Hold the actor for a sender to handle one message itself: only if nothing
        is queued, nothing is being handled, there is room and the actor runs; False
        (nothing held) otherwise. `unclaim` gives it back."""
        stopped = self.stopped
        with self.mutex:
            if (
                self._busy is not None
                or self._qsize()
                or self._full()
                or (stopped is not None and stopped.is_set())
            ):
                return False
            self._busy = threading.get_ident()
            return True

    def unclaim(self) -> None:
        """Give back the claim this thread holds (nothing if it holds none: safe to
        call from a ``finally`` whatever interrupted the claim); the actor's thread
        takes what came meanwhile."""
        with self.mutex:
            if self._busy != threading.get_ident():
                return
            self._busy = None
            if self._qsize():
                self.not_empty.notify()
        if self._room_waiters:
            self._call_room_waiters()

    def wait_for_message(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until the mailbox holds a message, without
        taking it; whether it does (the actor's own thread, the one getter, calls it)."""
        with self.not_empty:
            if not self._qsize():
                self.not_empty.wait(timeout)
            return self._qsize() > 0

    def has_room(self) -> bool:
        with self.mutex:
            return not self._full()

    def when_room(self, fn: Callable[[], None]) -> bool:
        """True if there is room now; else ``fn`` is called (once, from the actor's
        thread, or at stop) when there is, and False is returned."""
        with self.mutex:
            if not self._full():
                return True
            self._room_waiters.append(fn)
        stopped = self.stopped
        if stopped is not None and stopped.is_set():
            self._call_room_waiters()
        return False

    def reserve(self) -> None:
        """Wait for room, then hold it for a `put_reserved` (or give it back with
        `release`): a producer waits here before it takes a lock of its own, so it
        never waits for room while holding one.

        Raises:
            DatabaseClosed: the actor stopped meanwhile.
        """
        with self.not_full:
            self._wait_for_room()
            self._reserved += 1

    def _wait_for_room(self) -> None:
        """Wait (``not_full`` held) until there is room.

        Raises:
            DatabaseClosed: the actor stopped while the producer waited: what is put
                now would be dropped unseen, so the producer hears about it.
        """
        stopped = self.stopped
        while self._full() and not (stopped and stopped.is_set()):
            self.not_full.wait(0.05)
        if stopped is not None and stopped.is_set():
            raise DatabaseClosed("the actor stopped before taking this message")

    def release(self) -> None:
        """Give back a reservation that was not used."""
        with self.not_full:
            self._reserved -= 1
            self.not_full.notify()
        self._call_room_waiters()

    def put_reserved(self, item: Envelope[Any]) -> None:
        """Put ``item`` in the room `reserve` held for it (never waits)."""
        with self.not_full:
            self._reserved -= 1
            self._put(item)
            self.unfinished_tasks += 1
            self.not_empty.notify()

    def offer(self, item: Envelope[Any]) -> bool:
        """Put ``item`` if there is room (never waits); False if there was none."""
        with self.not_full:
            if self._full():
                return False
            self._put(item)
            self.unfinished_tasks += 1
            self.not_empty.notify()
        return True

    def force(self, item: Envelope[Any]) -> None:
        """Put ``item`` past the capacity (never waits)."""
        super().put(item)

    def put(self, item: Envelope[Any], block: bool = True, timeout: float | None = None) -> None:
        msg = item.message
        if type(msg) in _BOUNDED or (type(msg) is M.Write and msg.reply is None):
            with self.not_full:
                self._wait_for_room()
                self._put(item)
                self.unfinished_tasks += 1
                self.not_empty.notify()
            return
        super().put(item, block, timeout)
