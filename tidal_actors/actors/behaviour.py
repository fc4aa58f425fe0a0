"""The behaviour base class and the context a host gives it.

Each is a state machine that handles one message at a time and sends messages through
a host-supplied context; none knows how it is hosted (pykka threads or the
deterministic test host). Rules every behaviour keeps:

* A handler never lets an exception escape: it is counted, and a reply waiting on the
  message (for a barrier's part, the barrier's) gets an :class:`ActorFailure` with the
  cause attached. An exception that is
  not a :class:`TidalError` is kept in ``fault`` for the host's supervisor, which
  restarts a membership or ledger shard from the store (`runtime.supervision`).
* No handler waits on another actor. Where a step needs another actor's answer (a
  commit, a purge's prepared set) the behaviour sends a request and *stashes* the
  messages that arrive meanwhile, so its own order is kept without blocking a thread.
* Ordering argument (DESIGN.md): everything about a user enters through its
  membership shard, and mailboxes are FIFO per sender/receiver pair, so a signal sent
  after a leave is processed after it, and a purge reaches a ledger after every signal
  that shard was sent for the user before the purge.
* Latency under load comes from how much waits ahead, never from reordering: no
  message overtakes another on the same sender/receiver pair (there is no priority
  lane), so the argument above holds as it is. What a control operation waits behind
  is bounded instead: a host bounds each load-carrying mailbox by time
  (``Config.inflight_budget_ms`` of the receiver's measured work,
  `runtime.pykka_host`), and the facade sizes each shard's signal batches to the
  same budget, so a leave waits for the batch in hand plus at most a budget's worth
  of queued signals at its membership shard, and each hop of a purge (membership,
  ledger, persistence) likewise. A leave
  is therefore still ordered after every signal submitted before it was called
  (those are ahead of it in the FIFO) and before every signal submitted after it
  returned (the gate is closed when it returns); a purge still covers every record
  its user submitted before the call (its bound is taken at the membership shard
  after them, and its marker follows them to every ledger).
* Control writes group-commit: a membership shard applies a control write only once
  its commit is in. While writes commit it keeps taking control writes on users with
  no write pending (nothing set aside ahead of them) and sends them on (a run of
  them together, before anything else it handles), since their ops depend only on
  their own user's state; anything else, and a write on a user with one pending, is
  stashed with everything after it until the writes ahead of it are applied. Persistence commits the writes waiting together in one transaction;
  each is applied and answered only after its own commit. So the
  order of effects per user is the order of the messages, and every other message
  sees every control write that reached the shard before it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import ActorFailure, StorageError, TidalError
from tidal_actors.actors import messages as M
from tidal_actors.actors.reply import Reply


def replies_of(message: object) -> list[Reply]:
    """The replies waiting on ``message``: its own, or, for a barrier's part, the
    barrier's (and its read's), whose caller waits for every part."""
    out: list[Reply] = []
    barrier = message.barrier if isinstance(message, M.BarrierPart) else message
    for obj in (message, barrier, getattr(barrier, "action", None)):
        reply = getattr(obj, "reply", None)
        if isinstance(reply, Reply) and reply not in out:
            out.append(reply)
    return out


class Context(Protocol):
    """What a host gives a behaviour: the config, the clock, and ``tell``."""

    config: Config
    clock: Clock
    durable: bool

    def tell(self, address: M.Address, message: object) -> None: ...


class Behaviour:
    """Base: type-dispatched ``receive`` that never raises, and an ``on_idle`` hook."""

    address: M.Address = ("", 0)
    # whether a host bounds this behaviour's mailbox by time (``inflight_budget_ms``)
    # as well as by message count
    time_bounded = True

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.handler_errors = 0
        self.last_error: BaseException | None = None
        self._handlers: dict[type, Callable[[Any], None]] = {}
        # acknowledged signals this shard lost (a handler failed on their batch) that
        # no flush has reported yet: the next flush's barrier carries it to its caller
        self._loss: BaseException | None = None
        self._lost_batches = 0
        self._lost_units = 0  # their signals (membership) or records (ledger) here
        # the first unexpected failure (not a TidalError) and its message: a
        # supervisor that restarts the behaviour reads it (`fault`)
        self.fault: tuple[object, BaseException] | None = None

    def on(self, kind: type, fn: Callable[[Any], None]) -> None:
        self._handlers[kind] = fn

    def receive(self, message: object) -> None:
        """Handle one message; an unexpected exception is counted and replied, never raised."""
        try:
            fn = self._handlers.get(type(message))
            if fn is None:
                raise TypeError(f"{self.address} cannot handle {type(message).__name__}")
            fn(message)
        except Exception as exc:  # noqa: BLE001 - the actor must keep serving
            self.handler_errors += 1
            self.last_error = exc
            if self.fault is None and not isinstance(exc, TidalError):
                self.fault = (message, exc)
            err = self.failure(message, exc)
            for reply in replies_of(message):
                reply.set_exception(err)
            self.on_error(message, err)

    def failure(self, message: object, exc: BaseException) -> BaseException:
        """``exc`` as the caller sees it: a TidalError as is, anything else wrapped in
        :class:`ActorFailure` with the cause attached."""
        if isinstance(exc, TidalError):
            return exc
        err = ActorFailure(
            f"{self.address[0]}[{self.address[1]}] failed on {type(message).__name__}: {exc!r}"
        )
        err.__cause__ = exc
        return err

    def on_error(self, message: object, err: BaseException) -> None:
        """Hook: a handler failed on ``message`` (already counted and replied)."""

    def note_loss(self, err: BaseException, message: M.SignalBatch | M.Attribute) -> None:
        """Signals acknowledged to their callers were lost here: ``message``'s
        (``err`` says why), counted as the signal batches it carries (several where a
        mailbox merged them: ``batches``) and its signals or records."""
        self._loss = err
        self._lost_batches += message.batches
        self._lost_units += (
            len(message.signals) if isinstance(message, M.SignalBatch) else len(message)
        )

    def take_over_loss(self, old: Behaviour) -> None:
        """Report, at the next flush, what ``old`` (the incarnation this one replaces
        after a restart) recorded with `note_loss` and did not report."""
        if old._loss is not None:
            self._loss = old._loss
            self._lost_batches += old._lost_batches
            self._lost_units += old._lost_units

    def take_loss(self, barrier: M.Barrier) -> tuple[BaseException, ...]:
        """What `note_loss` recorded, as one StorageError, for a barrier that reports
        losses (a flush's or close's: their caller is told); () if none or if the
        barrier does not report them (the loss then waits for one that does)."""
        if not barrier.reports_loss or self._loss is None:
            return ()
        units = "signals" if self.address[0] == M.MEMBERSHIP else "records"
        err = StorageError(
            f"{self.address[0]}[{self.address[1]}] lost {self._lost_batches} signal "
            f"batch(es) ({self._lost_units} {units}) since the last flush; last: {self._loss}"
        )
        err.__cause__ = self._loss
        self._loss, self._lost_batches, self._lost_units = None, 0, 0
        return (err,)

    def resume(self) -> None:
        """Called by a supervisor that keeps this behaviour after a `fault` (cleared
        first): carry on with what it had set aside."""

    def on_idle(self) -> None:
        """Called by the host when the mailbox is empty after a message."""

    def on_stop(self) -> None:
        """Called by a host as it stops the actor, in its thread, after its last
        message: work it started aside ends here (persistence's erasure)."""

    def idle_wait_s(self) -> float:
        """How long (seconds) a host may wait for another message before it calls
        `on_idle` on an empty mailbox (0.0: call it now). A host may call `on_idle`
        at once regardless (the deterministic harness does)."""
        return 0.0

    def held(self) -> int:
        """How many received messages this behaviour holds aside for later; a bounded
        mailbox counts them against its capacity (called from other threads)."""
        return 0

    def held_units(self) -> int:
        """The load (signals) in the messages `held` counts (called from other threads)."""
        return 0

    def room_made(self) -> None:
        """Set by a host with bounded mailboxes: call it after releasing held messages."""


# -- membership -------------------------------------------------------------------
