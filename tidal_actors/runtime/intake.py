"""Signal intake: buffering per membership shard, batching, backpressure.

Owns how signals get from a caller to their membership shard's mailbox; `Core`
extends it (the state it uses is `Core`'s, set in its ``__init__``). It holds no
domain state, validates every signal before anything is queued, and never waits
for room while it holds a buffer's lock.

Signals are buffered per membership shard (``Config.batch_size`` signals, at most
``Config.signal_flush_interval_ms``) and sent as one message, under the buffer's
lock, so the per-shard order of everything a caller submits is kept. A control
operation or a read first sends what its shard has buffered, so "submitted before"
always means "processed before".

Backpressure, and no waiting for room under a lock: a buffer's lock is held only
for list work and puts that never wait for room, so whoever takes it (a control
operation, the flusher, an event loop) never waits behind a producer that waits for
room. Under the pykka host a blocking caller's put may instead handle the message
itself at an idle shard (`runtime.inline`), under the lock: whoever takes the lock
then waits for that work, as it would wait for the shard's thread. A blocking
caller's ``signal_batch`` sends its signals whole to an idle membership shard (at
most ``COALESCE_RECORDS`` a message, `PykkaHost.run_here`), in chunks otherwise. A
blocking caller (``TidalDb``) that is about to fill a batch first waits
for room in the membership mailbox and reserves it (`_Mailbox.reserve`), then takes
the lock and puts into the reserved room. A ``nonblocking`` core (an async facade's)
never waits: a full batch is offered and stays buffered if there is no room (the
facade parks its task until there is, before queueing more: `room_needed`,
`when_room`). The signals a control operation or a read sends ahead of itself go past
the capacity (at most a buffer's worth). The flusher thread only offers; it sleeps
while nothing is buffered, and the first signal buffered wakes it, or a batch call
when the batches were last sized more than ``TUNE_EVERY_S`` ago.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed, InvalidArgument
from tidal_actors._types import Signal
from tidal_actors.actors import messages as M
from tidal_actors.core.sharding import membership_shard_of, shard_split
from tidal_actors.core.validate import U64, check_signal, signal_columns
from tidal_actors.runtime.callers import Callers
from tidal_actors.runtime.host import Host
from tidal_actors.runtime.mailbox import COALESCE_RECORDS

__all__ = ["TUNE_EVERY_S", "Buffer", "Intake"]

# a batch call wakes the flusher thread to size the batches (`Intake._tune_batches`)
# only when they were last sized this long ago (seconds): calls of a few signals
# each would otherwise wake it every other call, for nothing else to do
TUNE_EVERY_S = 0.05


class Buffer:
    """One membership shard's signals not sent yet, and the lock that orders them."""

    __slots__ = ("items", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[M.SignalTuple] = []

    def after_buffered(self, items: list[M.SignalTuple]) -> list[M.SignalTuple]:
        """``items`` behind the signals buffered before them, which leave the buffer
        (call under ``lock``): what was submitted first is sent first."""
        if not self.items:
            return items
        out, self.items = self.items + items, []
        return out


class Intake:
    """Signal calls and the sending of buffered signals (see the module doc)."""

    config: Config
    host: Host
    closed: bool
    refusing: bool  # closed, or the flusher failed: `check_open` raises
    nonblocking: bool
    _nm: int
    _batch: int
    _steps: list[int]
    _buffers: list[Buffer]
    _callers: Callers
    _close_lock: threading.Lock
    _batch_calls: int
    _batch_calls_done: threading.Condition
    _tuned_at = float("-inf")  # when `_tune_batches` last ran (time.monotonic())

    def _shard_of(self, user_id: int) -> int:
        """The membership shard of a (checked) user id."""
        return 0 if self._nm == 1 else membership_shard_of(user_id, self._nm)

    def check_open(self) -> None:
        raise NotImplementedError

    def now(self) -> int:
        raise NotImplementedError

    def wake_flusher(self) -> None:
        raise NotImplementedError

    def _send_all_buffers(self, offer: bool = False) -> None:
        """Send every shard's buffered signals; with ``offer`` (the flusher) only to a
        mailbox with room, never waiting (what finds none stays buffered)."""
        for m, buf in enumerate(self._buffers):
            if buf.items:
                with buf.lock:
                    if buf.items:
                        if offer:
                            if self.host.offer((M.MEMBERSHIP, m), M.SignalBatch(buf.items)):
                                buf.items = []
                            continue
                        items, buf.items = buf.items, []
                        self.host.tell((M.MEMBERSHIP, m), M.SignalBatch(items))

    def _tune_batches(self) -> None:
        """Size each shard's batches to ``Config.inflight_budget_ms`` of its measured
        work per signal (at least 64 signals or ``signal_batch_size`` if smaller, at most
        ``signal_batch_size``)."""
        self._tuned_at = time.monotonic()
        budget = self.config.inflight_budget_ms
        unit_s = getattr(self.host, "unit_s", None)
        if budget is None or unit_s is None:
            return
        for m in range(self._nm):
            per = unit_s((M.MEMBERSHIP, m))
            if per > 0:
                self._steps[m] = max(
                    min(64, self._batch), min(self._batch, int(budget / 1000.0 / per))
                )

    def _tell_signals(self, m: int, items: list[M.SignalTuple], reserved: bool = False) -> None:
        """Send a batch under its buffer's lock, never waiting: into room reserved
        before the lock was taken, or past the capacity (a control operation's
        buffered signals, or a batch beyond the caller's one reservation)."""
        if reserved:
            self.host.put_reserved((M.MEMBERSHIP, m), M.SignalBatch(items))
        else:
            self.host.force((M.MEMBERSHIP, m), M.SignalBatch(items))

    def room_needed(self, user_id: object) -> int | None:
        """The membership shard a signal of ``user_id`` would have to wait for: its
        buffer would fill a batch and its mailbox is full; None if no wait is needed
        (or ``user_id`` is invalid: the signal call says so)."""
        if type(user_id) is not int or not 0 <= user_id < U64:
            return None
        m = self._shard_of(user_id)
        if len(self._buffers[m].items) + 1 < self._steps[m]:
            return None
        return None if self.host.has_room((M.MEMBERSHIP, m)) else m

    def shards_to_wait_for(self, user_id: object) -> list[int]:
        """`room_needed` as a list: the shards an async signal call waits for."""
        m = self.room_needed(user_id)
        return [] if m is None else [m]

    def full_shards(self) -> list[int]:
        """The membership shards whose mailboxes are full now."""
        return [m for m in range(self._nm) if not self.host.has_room((M.MEMBERSHIP, m))]

    def when_room(self, m: int, fn: Callable[[], None]) -> bool:
        """True if membership shard ``m`` has room; else ``fn()`` runs once it has (in
        an actor thread) and False is returned. Closed: True (the caller finds out)."""
        try:
            return bool(self.host.when_room((M.MEMBERSHIP, m), fn))
        except DatabaseClosed:
            return True

    def signal_with_context(
        self,
        user_id: int,
        entity_id: int,
        signal_type: int,
        weight: float = 1.0,
        timestamp_ns: int | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        if self.refusing:
            self.check_open()
        item = check_signal(
            user_id, entity_id, signal_type, weight, timestamp_ns, context, now=self.now
        )
        m = self._shard_of(item[0])
        self._callers.wrote(m)
        buf = self._buffers[m]
        reserved = False
        if not self.nonblocking and len(buf.items) + 1 >= self._steps[m]:
            self.host.reserve((M.MEMBERSHIP, m))  # wait for room before taking the lock
            reserved = True
        try:
            with buf.lock:
                self.check_open()  # again, under the lock (`close`)
                buf.items.append(item)
                if len(buf.items) == 1:  # the first buffered: the flusher sends it
                    self.wake_flusher()
                if len(buf.items) >= self._steps[m]:
                    if self.nonblocking:  # never waits: a full mailbox leaves it buffered
                        if self.host.offer((M.MEMBERSHIP, m), M.SignalBatch(buf.items)):
                            buf.items = []
                    else:  # a producer that raced ahead took the room: one past it
                        items, buf.items = buf.items, []
                        self._tell_signals(m, items, reserved)
                        reserved = False
        finally:
            if reserved:
                self.host.release((M.MEMBERSHIP, m))

    def signal_batch(self, signals: Iterable[Signal]) -> None:
        self.check_open()
        if isinstance(signals, (str, bytes, Mapping)) or not hasattr(signals, "__iter__"):
            raise InvalidArgument("signals", signals, "must be an iterable of Signal")
        nm = self._nm
        sigs = signals if type(signals) is list else list(signals)
        checked = signal_columns(sigs, Signal)
        per_shard: list[list[M.SignalTuple]]
        if checked is not None:  # the common case, checked column by column
            (us, es, ts_, ws, tss, cxs), has_none = checked
            if has_none:
                at = self.now()
                tss = tuple([at if t is None else t for t in tss])
            per_shard = shard_split(list(zip(us, es, ts_, ws, tss, cxs)), us, nm)
        else:
            per_shard = [[] for _ in range(nm)]
            stamp: list[int] = []

            def stamp_now() -> int:  # one clock read for the batch, taken when needed
                if not stamp:
                    stamp.append(self.now())
                return stamp[0]

            for i, s in enumerate(sigs):
                if not isinstance(s, Signal):
                    raise InvalidArgument(f"signals[{i}]", s, "must be a Signal")
                try:
                    item = check_signal(*s, now=stamp_now)
                except InvalidArgument as exc:
                    raise InvalidArgument(
                        f"signals[{i}].{exc.field}", exc.value, exc.reason
                    ) from None
                per_shard[self._shard_of(item[0])].append(item)
        steps = self._steps
        shards = [m for m, items in enumerate(per_shard) if items]
        self._callers.wrote_many(shards)
        if time.monotonic() - self._tuned_at >= TUNE_EVERY_S:
            self.wake_flusher()  # it sizes the batches (`_tune_batches`) while signals come
        if not self.nonblocking:
            self._send_chunks(shards, per_shard)
            return
        with contextlib.ExitStack() as held:
            for m in shards:  # in shard order, as every other taker of several
                held.enter_context(self._buffers[m].lock)
            self.check_open()  # under the locks: all of the batch or none (`close`)
            for m in shards:
                buf = self._buffers[m]
                items = buf.after_buffered(per_shard[m])
                step = steps[m]
                for k in range(0, len(items), step):
                    self._tell_signals(m, items[k : k + step])

    def _send_chunks(self, shards: list[int], per_shard: list[list[M.SignalTuple]]) -> None:
        """A blocking caller's batch: chunk by chunk, each into room reserved before
        the buffer's lock is taken, so a batch larger than a mailbox's budget queues
        no more than the budget allows. All of it or none: ``close()`` waits for a
        call that found the database open."""
        with self._close_lock:
            self.check_open()
            self._batch_calls += 1
        run_here = getattr(self.host, "run_here", None)  # the pykka host's (`inline`)
        try:
            for m in shards:
                buf, items, step = self._buffers[m], per_shard[m], self._steps[m]
                k = 0
                while k < len(items):
                    if run_here is not None:  # handled here if the shard is idle: whole
                        with buf.lock:
                            piece = items[k : k + COALESCE_RECORDS]

                            def whole(
                                piece: list[M.SignalTuple] = piece, buf: Buffer = buf
                            ) -> M.SignalBatch:
                                return M.SignalBatch(buf.after_buffered(piece))

                            if run_here((M.MEMBERSHIP, m), whole):
                                k += len(piece)
                                continue
                    self.host.reserve((M.MEMBERSHIP, m))  # no lock held while waiting
                    try:
                        with buf.lock:
                            chunk = buf.after_buffered(items[k : k + step])
                            self._tell_signals(m, chunk, reserved=True)
                    except BaseException:
                        self.host.release((M.MEMBERSHIP, m))
                        raise
                    k += step
        finally:
            with self._close_lock:
                self._batch_calls -= 1
                if not self._batch_calls:
                    self._batch_calls_done.notify_all()
