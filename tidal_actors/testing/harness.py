"""The message-driven test harness: the real actor behaviours under a deterministic host.

Owns :class:`Harness` (the facade a test drives), :class:`DeterministicHost` (the host
it runs the behaviours on) and :class:`Schedule` (the seeded delivery order, the trace
and the injected write failures they share across a reopen). It must not change what
a behaviour does: the behaviours, messages, validation and restore are the production
ones (``_behaviours``, ``_core``); only the hosting differs.

Theory of operation (FoundationDB-style deterministic simulation):

* One thread, no timers. ``tell`` appends to the receiver's FIFO mailbox and returns;
  nothing is delivered until :meth:`Harness.step` picks a non-empty mailbox with the
  seeded ``random.Random`` and delivers its oldest message. One mailbox per receiver,
  as under pykka, so the order between one sender and one receiver is FIFO and a
  message sent (causally) earlier to a receiver is delivered earlier. With
  ``ordering="pair"`` there is one queue per sender/receiver pair instead: only the
  per-pair FIFO order is kept, which is what a networked host would guarantee (and
  not enough today: purge exactness relies on the causal order one mailbox per
  receiver gives; see ``test_purge_is_exact_with_fifo_per_pair_only``).
* After a delivery that leaves the receiver's mailbox empty the host calls its
  ``on_idle`` (persistence group-commits there), exactly as the pykka host does.
* Same seed and same calls: same deliveries, same trace, byte for byte.
* The host is the supervisor of the fault calls: it drops a crashed shard's mailbox,
  answers the callers whose messages were lost, and restarts the shard from storage
  through the product's restore step (``runtime.supervision.restore_ledger`` and
  ``restore_membership``, after the exchange of ``actors.recovery``), as the pykka
  host does after a handler failure. What a crash means for the messages in flight
  is spelled out in :meth:`Harness.crash_shard` and :meth:`Harness.crash_persistence`.
  A crashed shard is read only through its public hand-over methods (``in_doubt``,
  ``held_messages``, ``counters``); a crashed persistence actor through its pending
  writes (``Persistence._writes``/``_unreported``), whose writers are answered through
  ``Persistence._ack``, as a supervisor that shares the process may.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._errors import ActorFailure, DatabaseClosed, InvalidArgument, StorageError
from tidal_actors._types import Signal
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.recovery import FaultReport, LoadStore, RecoverLedger
from tidal_actors.actors.reply import Reply
from tidal_actors.core.contrib_log import LogRecord, Prepared
from tidal_actors.runtime.engine import Call, Core, check_meta
from tidal_actors.runtime.pykka_host import HostContext
from tidal_actors.runtime.supervision import carried_over, restore_ledger, restore_membership
from tidal_actors.storage.format import Tag, decode_key
from tidal_actors.storage.stores import LmdbStore, MemoryStore, NullStore

__all__ = [
    "FACADE",
    "START_NS",
    "DeterministicHost",
    "FaultReport",
    "Harness",
    "HarnessStuck",
    "Schedule",
]

START_NS = 10**18
"""Where a harness's clock starts: 1e18 ns (2001-09-09), as the pytest plugin's."""

FACADE: M.Address = ("facade", 0)
"""The sender address of messages the caller's operations send."""

Ordering = Literal["mailbox", "pair"]


class HarnessStuck(RuntimeError):
    """A handle cannot complete: nothing is left to deliver and its reply never came.

    Under a correct runtime this does not happen; the message says what is still
    waiting, to be read beside :meth:`Harness.trace`.
    """


# fields left out of the trace: wall-clock measurements
_VOLATILE_FIELDS = frozenset({"seconds"})


def _addr(a: M.Address) -> str:
    return f"{a[0]}[{a[1]}]"


class Schedule:
    """Seeded delivery order, trace and injected write failures of one harness.

    Shared by every host a harness starts (a reopen starts a new host), so the trace
    and the random sequence continue across it.

    Args:
        seed: seeds ``random.Random`` (any value it accepts).
        ordering: ``"mailbox"`` (one FIFO mailbox per receiver, as pykka) or
            ``"pair"`` (one FIFO queue per sender/receiver pair).
    """

    def __init__(self, seed: Any = 0, ordering: Ordering = "mailbox") -> None:
        if ordering not in ("mailbox", "pair"):
            raise InvalidArgument("ordering", ordering, 'must be "mailbox" or "pair"')
        self.seed = seed
        self.ordering = ordering
        self.rng = random.Random(seed)
        self.lines: list[str] = []
        self.steps = 0
        self._labels: weakref.WeakKeyDictionary[Reply, str] = weakref.WeakKeyDictionary()
        self._n = 0
        self._fail_budget: list[str | None] = []
        # op tuples of writes chosen to fail, kept alive so their ids stay unique
        self._poisoned: dict[int, tuple[str, bytes, bytes | None]] = {}
        self.prior_fault: Callable[[list[Any]], None] | None = None

    # -- trace -------------------------------------------------------------------

    def event(self, text: str) -> None:
        """Add a non-delivery line (fault, clock move, close) to the trace."""
        self.lines.append(f"{'':>6} ** {text}")

    def label(self, reply: Reply, name: str | None = None) -> str:
        """The reply's stable name in the trace: ``name`` if given at its first sight
        (the harness names each operation's replies ``<operation>#<n>``), else
        ``<label>@<n>`` numbered in order of first sight."""
        s = self._labels.get(reply)
        if s is None:
            if name is None:
                self._n += 1
                name = f"{reply.label or 'reply'}@{self._n}"
            s = self._labels[reply] = name
        return s

    def value(self, x: Any) -> str:
        """Deterministic text for a message field: no object ids, replies by label."""
        if isinstance(x, Reply):
            return self.label(x)
        if x is None or isinstance(x, (bool, int, float, str)):
            return repr(x)
        if isinstance(x, bytes):
            return f"<{len(x)}B>"
        if isinstance(x, BaseException):
            return f"{type(x).__name__}({str(x)!r})"
        if isinstance(x, M.Barrier):
            return f"{x!r} reply={self.label(x.reply)}"
        if isinstance(x, Prepared):
            return f"Prepared(n={len(x.records)}, evicted={x.evicted})"
        if isinstance(x, (tuple, list)):
            return "(" + ", ".join(self.value(v) for v in x) + ")"
        if isinstance(x, Mapping):
            return "{" + ", ".join(f"{self.value(k)}: {self.value(v)}" for k, v in x.items()) + "}"
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return self.describe(x)
        return f"<{type(x).__name__}>"

    def describe(self, msg: object) -> str:
        """One message in the trace's notation: its type and key fields."""
        name = type(msg).__name__
        if isinstance(msg, M.SignalBatch):
            return f"{name} " + " ".join(
                f"(u={u} e={e} t={t} w={w!r} ts={ts}{' +context' if cx is not None else ''})"
                for u, e, t, w, ts, cx in msg.signals
            )
        if isinstance(msg, M.Attribute):
            return f"{name} " + " ".join(
                f"({m}:{r} u={u} {c!r} e={e} t={t} w={w!r} ts={ts})"
                for m, r, u, c, e, t, w, ts in msg.records
            )
        if isinstance(msg, M.Write):
            ops = []
            for ks, key, value in msg.ops:
                try:
                    ident, tag, _ = decode_key(key)
                    tname = Tag(tag).name if tag in Tag._value2member_map_ else f"0x{tag:02x}"
                    ops.append(f"{ks}:{tname}({ident}){'' if value is not None else ' delete'}")
                except ValueError:
                    ops.append(f"{ks}:<{len(key)}B>")
            r = msg.reply
            reply = (
                "none"
                if r is None
                else self.label(r)
                if isinstance(r, Reply)
                else f"{_addr(r[0])}/token={self.value(r[1])}"
            )
            return f"{name} [{', '.join(ops)}] ack={reply}"
        if isinstance(msg, M.BarrierPart):
            return f"{name} {self.value(msg.barrier)}"
        if isinstance(msg, M.Barrier):
            return self.value(msg)
        if dataclasses.is_dataclass(msg):
            parts = [
                f"{f.name}={self.value(getattr(msg, f.name))}"
                for f in dataclasses.fields(msg)
                if f.name not in _VOLATILE_FIELDS
            ]
            return f"{name} " + " ".join(parts)
        return name

    # -- injected write failures --------------------------------------------------

    def fail_next_write(self, n: int, only: str | None) -> None:
        self._fail_budget.extend([only] * n)

    def take(self, w: M.Write) -> bool:
        """At a write's delivery to persistence: is it one of the next to fail?"""
        kind = "history" if w.reply is None else "control"
        for i, only in enumerate(self._fail_budget):
            if only is None or only == kind:
                del self._fail_budget[i]
                for op in w.ops:
                    self._poisoned[id(op)] = op
                return True
        return False

    def store_fault(self, ops: list[tuple[str, bytes, bytes | None]]) -> None:
        """The store's fault hook: a commit that holds a chosen write fails whole."""
        if self._poisoned and any(id(op) in self._poisoned for op in ops):
            raise StorageError("injected write failure (Harness.fail_next_write)")
        if self.prior_fault is not None:
            self.prior_fault(ops)


class _Down:
    """A crashed shard waiting for its restart."""

    __slots__ = ("carry", "old", "orphans")

    def __init__(self, old: Behaviour) -> None:
        self.old = old
        # in-doubt control writes: token -> (reply, label)
        self.orphans: dict[Any, tuple[Reply, str]] = {}
        # what the next incarnation takes over (`runtime.supervision.carried_over`)
        self.carry: list[object] = []


class DeterministicHost:
    """Hosts behaviours with explicit, seeded, one-at-a-time delivery (PykkaHost's interface).

    Args:
        config, clock, durable: as for ``PykkaHost``.
        schedule: the delivery order and trace to use (default: a new one, seed 0).
        store: the store the behaviours were restored from; needed to restart a
            crashed shard from storage.
    """

    def __init__(
        self,
        config: Config,
        clock: Any,
        durable: bool,
        schedule: Schedule | None = None,
        store: Any = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.schedule = schedule if schedule is not None else Schedule()
        self.store = store
        self.ctx = HostContext(config, clock, durable, self.tell)
        # operational delays (re-materialization after a purge) run on the manual
        # clock here, so they are as deterministic as everything else
        self.ctx.monotonic = lambda: clock.now_ns() / 1e9
        self.behaviours: dict[M.Address, Behaviour] = {}
        self.incarnation: dict[M.Address, int] = {}
        self.on_replace: Callable[[M.Address, Behaviour], None] | None = None
        self._pair = self.schedule.ordering == "pair"
        self._queues: dict[Any, collections.deque[tuple[M.Address, object]]] = {}
        self._down: dict[M.Address, _Down] = {}
        self._stopped: set[M.Address] = set()
        self._closed = False
        self._sender: M.Address = FACADE
        self._barriers_seen: dict[int, M.Barrier] = {}
        self._failed_barriers: set[int] = set()

    # -- the PykkaHost interface ----------------------------------------------------

    def start(self, behaviours: list[Behaviour]) -> None:
        """Register behaviours; nothing runs until a delivery."""
        for b in behaviours:
            self.behaviours[b.address] = b
            self.incarnation[b.address] = 1

    def tell(self, address: M.Address, message: object) -> None:
        """Append ``message`` to the receiver's mailbox. Raises DatabaseClosed once it is stopped."""
        if self._closed or address in self._stopped or address not in self.behaviours:
            raise DatabaseClosed(f"no actor at {address}")
        key: Any = (self._sender, address) if self._pair else address
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = collections.deque()
        q.append((self._sender, message))

    def offer(self, address: M.Address, message: object) -> bool:
        """Mailboxes here are unbounded: always sent."""
        self.tell(address, message)
        return True

    def force(self, address: M.Address, message: object) -> None:
        self.tell(address, message)

    def has_room(self, address: M.Address) -> bool:
        return True

    def reserve(self, address: M.Address) -> None:
        """Mailboxes here are unbounded: there is always room."""

    def release(self, address: M.Address) -> None:
        pass

    def put_reserved(self, address: M.Address, message: object) -> None:
        self.tell(address, message)

    def when_room(self, address: M.Address, fn: Callable[[], None]) -> bool:
        return True

    def settle(self, reply: Any, timeout: float) -> bool:
        """Deliver messages until ``reply`` is done or nothing is left; ``timeout`` is ignored."""
        while not reply.done and self.step():
            pass
        return bool(reply.done)

    def stop(self, order: list[str]) -> None:
        """Stop kind by kind in ``order``, each draining its mailboxes first (as PykkaHost)."""
        for kind in order:
            while True:
                keys = [k for k in self._deliverable() if self._receiver(k)[0] == kind]
                if not keys:
                    break
                self._deliver_from(keys)
            for a in self.behaviours:
                if a[0] == kind:
                    self._stopped.add(a)
        self._closed = True
        self._queues.clear()
        self._down.clear()

    # -- delivery ---------------------------------------------------------------------

    def _receiver(self, key: Any) -> M.Address:
        return key[1] if self._pair else key  # type: ignore[no-any-return]

    def _deliverable(self) -> list[Any]:
        return sorted(
            k
            for k, q in self._queues.items()
            if q and (a := self._receiver(k)) not in self._down and a not in self._stopped
        )

    def _mailbox_empty(self, address: M.Address) -> bool:
        if not self._pair:
            return not self._queues.get(address)
        return not any(q for k, q in self._queues.items() if k[1] == address)

    def _keys_to(self, address: M.Address) -> list[Any]:
        return sorted(k for k in self._queues if self._receiver(k) == address)

    def step(self) -> bool:
        """Deliver one message (or restart a crashed shard once nothing else can run).

        Returns False when there is nothing to do.
        """
        if self._closed:
            return False
        keys = self._deliverable()
        if keys:
            self._deliver_from(keys)
            return True
        if self._down:
            self._restart(min(self._down))
            return True
        return False

    def _deliver_from(self, keys: list[Any]) -> None:
        key = keys[0] if len(keys) == 1 else keys[self.schedule.rng.randrange(len(keys))]
        sender, msg = self._queues[key].popleft()
        self._deliver(self._receiver(key), sender, msg)

    def _deliver(self, address: M.Address, sender: M.Address, msg: object) -> None:
        sched = self.schedule
        sched.steps += 1
        note, drop = self._intercept(address, msg)
        sched.lines.append(
            f"{sched.steps:>6} {_addr(address)} <- {_addr(sender)}: {sched.describe(msg)}{note}"
        )
        if drop:
            return
        behaviour = self.behaviours[address]
        prev, self._sender = self._sender, address
        try:
            behaviour.receive(msg)
            if self._mailbox_empty(address):
                try:
                    behaviour.on_idle()
                except Exception as exc:  # noqa: BLE001 - as PykkaHost: the actor keeps serving
                    behaviour.handler_errors += 1
                    behaviour.last_error = exc
        finally:
            self._sender = prev
        if type(msg) is M.BarrierPart and address == M.PERSIST_ADDR and msg.barrier.reply.done:
            self._barriers_seen.pop(msg.barrier.barrier_id, None)

    def _intercept(self, address: M.Address, msg: object) -> tuple[str, bool]:
        """Supervisor bookkeeping at a delivery: (note for the trace, drop it?)."""
        kind = type(msg)
        if address == M.PERSIST_ADDR:
            if kind is M.Write and self.schedule.take(msg):  # type: ignore[arg-type]
                return " [injected: this write fails]", False
            if kind is M.BarrierPart:
                b = msg.barrier  # type: ignore[attr-defined]
                if b.barrier_id in self._failed_barriers:
                    return " [dropped: its flush already failed in a persistence crash]", True
                self._barriers_seen[b.barrier_id] = b
        return "", False

    def pending(self) -> dict[M.Address, list[object]]:
        """Messages waiting, by receiver (FIFO order per queue), crashed shards included."""
        out: dict[M.Address, list[object]] = {}
        for k in sorted(self._queues):
            q = self._queues[k]
            if q:
                out.setdefault(self._receiver(k), []).extend(m for _, m in q)
        return out

    @property
    def down(self) -> list[M.Address]:
        """Crashed shards not restarted yet."""
        return sorted(self._down)

    # -- supervision (fault injection) ------------------------------------------------

    def _fail(self, reply: Reply, exc: BaseException, report: FaultReport) -> None:
        if reply.set_exception(exc):
            report.failed.append(self.schedule.label(reply))

    def _take_queue(
        self, address: M.Address, keep: Callable[[object], bool] = lambda m: False
    ) -> list[object]:
        """Remove and return the messages waiting for ``address``, except those ``keep`` holds."""
        out: list[object] = []
        for k in self._keys_to(address):
            q = self._queues[k]
            rest = collections.deque(item for item in q if keep(item[1]))
            out.extend(m for _, m in q if not keep(m))
            self._queues[k] = rest
        return out

    def _drop(self, address: M.Address, msg: object, report: FaultReport) -> None:
        """Account for one message lost with a crashed shard."""
        sched = self.schedule
        report.dropped.append(sched.describe(msg))
        why = f"{_addr(address)} crashed before handling {type(msg).__name__}"
        if isinstance(msg, M.SignalBatch):
            report.lost_signals.extend(msg.signals)
        elif isinstance(msg, M.Attribute):
            report.lost_records.extend(LogRecord(*r) for r in msg.records)
        elif isinstance(
            msg,
            (M.PreparePurge, M.RematStart, M.RematStep, M.PurgeMarker, M.PurgeAbandoned),
        ):
            pass  # the coordinator ends or lists that purge or rebuild at the restart
        elif isinstance(msg, (M.ApplyPurge, M.EvictionUpdate)):
            pass  # committed before it was sent: the state restored from storage has it
        elif isinstance(msg, M.BarrierPart):
            self._fail(msg.barrier.reply, ActorFailure(why), report)
        else:
            reply = getattr(msg, "reply", None)
            if isinstance(reply, Reply):
                self._fail(reply, ActorFailure(why), report)

    def crash(self, address: M.Address) -> FaultReport:
        """Crash a membership or ledger shard; it restarts from storage once nothing
        else can run. See :meth:`Harness.crash_shard`."""
        if address not in self.behaviours or address[0] not in (M.MEMBERSHIP, M.LEDGER):
            raise InvalidArgument(
                "address", address, "must be a membership or ledger shard's address"
            )
        if address in self._down:
            raise InvalidArgument("address", address, "has crashed already and not restarted yet")
        if self._closed:
            raise DatabaseClosed("the harness is closed")
        if self.store is None or not getattr(self.store, "durable", False):
            raise InvalidArgument(
                "store", self.store, "a shard restarts from storage: use a durable store"
            )
        old = self.behaviours[address]
        down = _Down(old)
        report = FaultReport(address)
        lost: list[object]
        if isinstance(old, MembershipShard):
            # a Committed waiting here answers a write of this incarnation: kept for
            # the next one, which answers the write's caller (`MembershipShard.restarted`)
            lost = old.held_messages()
            lost += self._take_queue(address, keep=lambda m: isinstance(m, M.Committed))
            # a control operation whose write is on its way: its outcome is decided by
            # persistence; the caller is answered with it at the restart
            for token, reply in old.in_doubt().items():
                label = self.schedule.label(reply)
                down.orphans[token] = (reply, label)
                report.in_doubt.append(label)
        else:
            assert isinstance(old, LedgerShard)
            # barrier parts it counted stay counted; a purge preparation waiting for
            # its marker dies with it (the coordinator abandons the purge at the restart)
            down.carry, lost = carried_over(old.held_messages())
            lost += self._take_queue(address)
        for msg in lost:
            self._drop(address, msg, report)
        self._down[address] = down
        self.schedule.event(
            f"crash {_addr(address)}: {len(report.dropped)} message(s) dropped, "
            f"{len(report.lost_signals)} signal(s) and {len(report.lost_records)} record(s) lost, "
            f"{len(report.failed)} handle(s) failed, {len(report.in_doubt)} in doubt"
        )
        return report

    def _ask(self, sender: M.Address, address: M.Address, make: Callable[[Reply], object]) -> Any:
        """Send ``make(reply)`` from ``sender`` and deliver until the reply comes."""
        reply = Reply("restart")
        prev, self._sender = self._sender, sender
        try:
            self.tell(address, make(reply))
        finally:
            self._sender = prev
        while not reply.done and (keys := self._deliverable()):
            self._deliver_from(keys)
        if not reply.done:
            raise HarnessStuck(f"{_addr(sender)} cannot restart: {address} did not answer")
        return reply.result()

    def _restart(self, address: M.Address) -> None:
        """Restart a crashed shard through the product's restore step
        (`runtime.supervision`): nothing else can run, so every write its crashed
        incarnation caused is committed, and no barrier through the ledgers is needed
        before the store is read."""
        down = self._down[address]  # nothing is delivered to it until it is replaced
        old = down.old
        i = address[1]
        store, n = self.store, self.incarnation[address]
        new: Behaviour
        if isinstance(old, LedgerShard):
            recovery = self._ask(address, M.COORD_ADDR, lambda r: RecoverLedger(i, r))
            restored = self._ask(address, M.PERSIST_ADDR, LoadStore)
            new = restore_ledger(
                self.config, self.ctx, restored, store, i, recovery, old.counters()
            )
        else:
            assert isinstance(old, MembershipShard)
            restored = self._ask(address, M.PERSIST_ADDR, LoadStore)
            committed = {
                m.token: m.error
                for m in self.pending().get(address, [])
                if isinstance(m, M.Committed)
            }
            in_doubt: dict[Any, Reply] = {}
            for token, (reply, label) in down.orphans.items():
                if token in committed:
                    in_doubt[token] = reply
                    outcome = "committed" if committed[token] is None else "failed"
                else:
                    reply.set_exception(
                        ActorFailure(f"{_addr(address)} crashed; the outcome is unknown")
                    )
                    outcome = "outcome unknown"
                self.schedule.event(f"{label} in doubt at the crash: {outcome}")
            new = restore_membership(
                self.config, self.ctx, restored, store, i, n, in_doubt, old.counters()
            )
        del self._down[address]
        self.behaviours[address] = new
        self.incarnation[address] = n + 1
        if self.on_replace is not None:
            self.on_replace(address, new)
        self.schedule.event(f"restart {_addr(address)} from storage (incarnation {n + 1})")
        prev, self._sender = self._sender, address
        try:
            for msg in down.carry:
                new.receive(msg)
        finally:
            self._sender = prev

    def crash_persistence(self) -> FaultReport:
        """Crash and restart the persistence actor. See :meth:`Harness.crash_persistence`."""
        if self._closed:
            raise DatabaseClosed("the harness is closed")
        address = M.PERSIST_ADDR
        old = self.behaviours[address]
        assert isinstance(old, Persistence)
        report = FaultReport(address)
        queued = self._take_queue(address)
        lost = list(old._writes) + queued
        # writes (and history erasures) are answered by the restarted incarnation below
        writes: list[Any] = [
            m for m in lost if isinstance(getattr(m, "ops", None), list) and hasattr(m, "reply")
        ]
        report.lost_writes = len(writes)
        report.dropped = [self.schedule.describe(m) for m in lost]
        err = StorageError("persistence crashed before committing this write")
        for msg in queued:
            if isinstance(msg, M.BarrierPart):
                self._barriers_seen[msg.barrier.barrier_id] = msg.barrier
            elif msg not in writes and isinstance(getattr(msg, "reply", None), Reply):
                self._fail(
                    msg.reply,  # type: ignore[attr-defined]
                    StorageError(f"persistence crashed before handling {type(msg).__name__}"),
                    report,
                )
        for key, b in list(self._barriers_seen.items()):
            # parts already counted by the crashed incarnation are gone: fail the
            # flush (parts of it that still arrive are dropped by its id)
            self._fail(
                b.reply, StorageError("persistence crashed before this flush committed"), report
            )
            self._failed_barriers.add(key)
        self._barriers_seen.clear()
        new = Persistence(self.ctx, old.store)
        new.commits, new.failed_writes, new.handler_errors = (
            old.commits,
            old.failed_writes,
            old.handler_errors,
        )
        new._unreported = old._unreported
        self.behaviours[address] = new
        self.incarnation[address] += 1
        if self.on_replace is not None:
            self.on_replace(address, new)
        prev, self._sender = self._sender, address
        try:
            # the restarted actor answers every write it lost: a writer waiting for the
            # commit gets the error (nothing applied); a lost history write is counted
            # and reported by the next flush
            for w in writes:
                if isinstance(w.reply, Reply):
                    report.failed.append(self.schedule.label(w.reply))
                elif w.reply is not None:
                    report.failed.append(
                        f"{_addr(w.reply[0])}/token={self.schedule.value(w.reply[1])}"
                    )
                new._ack(w, err)
        finally:
            self._sender = prev
        self.schedule.event(
            f"crash persistence[0]: {report.lost_writes} uncommitted write(s) lost, "
            f"{len(report.failed)} writer(s) told; restarted (incarnation {self.incarnation[address]})"
        )
        return report


def _open_store(store: Any, config: Config) -> tuple[Any, str | None]:
    if store is None:
        return MemoryStore(), None
    if isinstance(store, str):
        if store.startswith("lmdb:"):
            path = store[len("lmdb:") :]
            return LmdbStore(path, config), path
        if store == "memory":
            return MemoryStore(), None
        if store == "null":
            return NullStore(), None
        raise InvalidArgument("store", store, 'must be a store, "memory", "null" or "lmdb:<path>"')
    if not callable(getattr(store, "commit", None)) or not callable(getattr(store, "load", None)):
        raise InvalidArgument("store", store, "must be a store (MemoryStore, LmdbStore, NullStore)")
    if isinstance(store, LmdbStore):
        return store, str(store.path)
    return store, None


class Harness:
    """Drive the real actor behaviours message by message, in a seeded order.

    The operations have ``TidalDb``'s names and arguments; each validates at once
    (raising ``InvalidArgument`` as ``TidalDb`` does), sends its message, and returns
    a handle (``.done``; ``.result()`` returns the value, raises the operation's
    error, or raises ``RuntimeError`` if the reply has not arrived). Signals have no
    reply: their handle is done at once. Nothing is delivered until :meth:`step`,
    :meth:`run`, :meth:`run_until_idle` (or a close) delivers it.

    Args:
        seed: chooses the delivery order among non-empty mailboxes.
        config: settings (default ``Config()``); shard counts matter here.
        store: a ``MemoryStore`` (default), ``NullStore``, ``LmdbStore``, or the
            strings ``"memory"``, ``"null"``, ``"lmdb:<path>"``. Crashes restart
            shards from it, :meth:`close_and_reopen` restores from it.
        start_ns: where the harness's :class:`ManualClock` starts.
        ordering: ``"mailbox"`` (default: one FIFO mailbox per receiver, as in
            production) or ``"pair"`` (FIFO per sender/receiver pair only).

    Example::

        h = Harness(seed=3)
        h.signal_with_context(1, 10, 0)
        leave = h.leave_community_layer(1)
        h.run(leave)
        print(h.trace())
    """

    def __init__(
        self,
        seed: Any = 0,
        config: Config | None = None,
        store: Any = None,
        *,
        start_ns: int = START_NS,
        ordering: Ordering = "mailbox",
    ) -> None:
        self.config = config if config is not None else Config()
        if not isinstance(self.config, Config):
            raise InvalidArgument("config", config, "must be a Config")
        self.schedule = Schedule(seed, ordering)
        self.clock = ManualClock(start_ns)
        self.store, self._lmdb_path = _open_store(store, self.config)
        self._calls = 0
        self._open()

    def _open(self) -> None:
        store = self.store
        prior = getattr(store, "fault", None)
        if prior is not None and getattr(prior, "__self__", None) is not self.schedule:
            self.schedule.prior_fault = prior
        if hasattr(store, "fault"):
            store.fault = self.schedule.store_fault
        restored = store.load()
        check_meta(store, self.config, restored)
        self.host = DeterministicHost(self.config, self.clock, store.durable, self.schedule, store)
        self.core = Core(self.config, self.clock, store, restored, self.host, buffered=False)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Harness(seed={self.schedule.seed!r}, steps={self.schedule.steps})"

    # -- driving ------------------------------------------------------------------------

    @property
    def seed(self) -> Any:
        return self.schedule.seed

    @property
    def steps(self) -> int:
        """Deliveries so far."""
        return self.schedule.steps

    @property
    def closed(self) -> bool:
        return self.core.closed

    def step(self) -> bool:
        """Deliver one message (the seed picks the mailbox); False if nothing is pending.

        When only crashed shards have messages waiting, the step restarts one of them.
        """
        return self.host.step()

    def run_until_idle(self, max_steps: int = 10_000_000) -> int:
        """Deliver until nothing is pending; returns the number of steps taken.

        Raises:
            HarnessStuck: still busy after ``max_steps`` (a message loop).
        """
        n = 0
        while self.host.step():
            n += 1
            if n >= max_steps:
                raise HarnessStuck(f"still delivering after {max_steps} steps")
        return n

    def run(self, call: Call) -> Any:
        """Deliver until ``call`` is done, then return its result (or raise its error).

        Raises:
            HarnessStuck: nothing is left to deliver and the call is not done.
        """
        while not call.done:
            if not self.host.step():
                raise HarnessStuck(
                    f"{call.name} cannot complete: nothing is left to deliver "
                    f"(after step {self.schedule.steps}; see trace())"
                )
        return call.result()

    def pending(self) -> dict[M.Address, list[str]]:
        """What waits in which mailbox: receiver address -> message descriptions, oldest first."""
        return {
            a: [self.schedule.describe(m) for m in msgs] for a, msgs in self.host.pending().items()
        }

    def pending_messages(self) -> dict[M.Address, list[object]]:
        """As :meth:`pending`, with the message objects themselves."""
        return self.host.pending()

    def trace(self) -> str:
        """Every delivery so far, one line each (``step receiver <- sender: message``),
        plus ``**`` lines for faults, clock moves and reopens. Deterministic."""
        return "".join(line + "\n" for line in self.schedule.lines)

    def trace_lines(self) -> list[str]:
        """:meth:`trace` as a list of lines."""
        return list(self.schedule.lines)

    def behaviour(self, address: M.Address) -> Behaviour:
        """The behaviour currently at ``address`` (to inspect its state in a test)."""
        return self.host.behaviours[address]

    # -- clock --------------------------------------------------------------------------

    def advance(self, delta_ns: int) -> int:
        """Move the manual clock by ``delta_ns`` (may be negative); returns the new now."""
        now = self.clock.advance(delta_ns)
        self.schedule.event(f"clock {'+' if delta_ns >= 0 else ''}{int(delta_ns)} -> {now}")
        return now

    def set_time(self, now_ns: int) -> None:
        """Set the manual clock to ``now_ns`` (may go backwards)."""
        self.clock.set(now_ns)
        self.schedule.event(f"clock = {int(now_ns)}")

    # -- operations ---------------------------------------------------------------------

    def _call(self, call: Call) -> Call:
        self._calls += 1
        many = len(call.replies) > 1
        for k, r in enumerate(call.replies):
            self.schedule.label(r, f"{call.name}#{self._calls}" + (f".{k}" if many else ""))
            self.core.track(r)
        return call

    @staticmethod
    def _done(name: str) -> Call:
        return Call(name, [])

    def signal_with_context(
        self,
        user_id: int,
        entity_id: int,
        signal_type: int,
        weight: float = 1.0,
        timestamp_ns: int | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> Call:
        """Enqueue one signal (one message); the handle is done at once (no reply)."""
        self.core.signal_with_context(
            user_id, entity_id, signal_type, weight, timestamp_ns, context
        )
        return self._done("signal_with_context")

    def signal_batch(self, signals: Iterable[Signal]) -> Call:
        """Enqueue many signals, one message each, after validating all of them."""
        self.core.signal_batch(signals)
        return self._done("signal_batch")

    def assign_cohort(self, user_id: int, cohort: str) -> Call:
        return self._call(self.core.assign_cohort(user_id, cohort))

    def unassign_cohort(self, user_id: int, cohort: str) -> Call:
        return self._call(self.core.unassign_cohort(user_id, cohort))

    def cohorts_of(self, user_id: int) -> Call:
        return self._call(self.core.cohorts_of(user_id))

    def leave_community_layer(self, user_id: int) -> Call:
        return self._call(self.core.leave_community_layer(user_id))

    def rejoin_community_layer(self, user_id: int) -> Call:
        return self._call(self.core.rejoin_community_layer(user_id))

    def community_layer_status(self, user_id: int) -> Call:
        return self._call(self.core.community_layer_status(user_id))

    def community_leave_history(self, user_id: int) -> Call:
        return self._call(self.core.community_leave_history(user_id))

    def request_community_purge(self, user_id: int, cohort_name: str) -> Call:
        return self._call(self.core.request_community_purge(user_id, cohort_name))

    def list_purge_manifests(self, user_id: int) -> Call:
        """Asks the purge coordinator directly: it sees the purges already committed."""
        return self._call(self.core.list_purge_manifests(user_id))

    def read_decay_score(
        self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None
    ) -> Call:
        return self._call(self.core.read_decay_score(cohort, entity_id, signal_type, at_ns))

    def read_window(
        self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None
    ) -> Call:
        return self._call(self.core.read_window(cohort, entity_id, signal_type, at_ns))

    def top_entities(self, cohort: str, signal_type: int, k: int, at_ns: int | None = None) -> Call:
        return self._call(self.core.top_entities(cohort, signal_type, k, at_ns))

    def aggregate_rows(self, at_ns: int | None = None) -> Call:
        return self._call(self.core.aggregate_rows(at_ns))

    def stats(self) -> Call:
        return self._call(self.core.stats())

    def flush(self) -> Call:
        return self._call(self.core.flush())

    def rematerialize(self, cohort: str) -> Call:
        return self._call(self.core.rematerialize(cohort))

    def purge_status(self, purge_id: int) -> Call:
        return self._call(self.core.purge_status(purge_id))

    def compact(self) -> Call:
        return self._call(self.core.compact())

    def tick(self) -> None:
        """Send the purge coordinator the ``Tick`` that the pykka facade sends every
        50 ms while a re-materialization is due (``Config.rematerialize_after_ms``
        after a purge, measured here on the harness's manual clock, so ``advance``
        makes it due). The harness has no timers: without ticks, scheduled
        re-materializations wait (a reopen resumes them); ``rematerialize`` runs one
        at once."""
        tick = getattr(M, "Tick", None)
        if tick is not None:
            self.host.tell(M.COORD_ADDR, tick())

    def close(self) -> None:
        """Close as ``TidalDb.close`` does (flush, stop kind by kind, close the store),
        delivering what that needs. Handles still waiting get ``DatabaseClosed``."""
        if not self.core.closed:
            self.core.close()
            self.schedule.event("closed")

    # -- faults -------------------------------------------------------------------------

    def fail_next_write(self, n: int = 1, *, only: str | None = None) -> None:
        """Make the next ``n`` writes that reach persistence fail with ``StorageError``.

        Args:
            n: how many writes.
            only: ``"control"`` (writes a caller waits for: assign, unassign,
                leave, rejoin, purge manifest) or ``"history"`` (contribution
                batches); None for whichever comes first.

        A failed write fails only its own caller (persistence retries the rest of its
        group one by one): a control operation raises ``StorageError`` and changes
        nothing, in memory or in storage; a failed history write is counted and the
        next ``flush`` raises ``StorageError`` (its signals stay in the live
        aggregates but are not durable, so a reopen does not have them). The trace
        marks the chosen write with ``[injected: this write fails]``.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgument("n", n, "must be an int >= 0")
        if only not in (None, "control", "history"):
            raise InvalidArgument("only", only, 'must be None, "control" or "history"')
        self.schedule.fail_next_write(n, only)
        self.schedule.event(f"fail next {n} {only or 'any'} write(s)")

    def crash_persistence(self) -> FaultReport:
        """Crash the persistence actor and restart it at once.

        The crashed incarnation loses everything it had not committed: the writes in
        its group and in its mailbox. The restarted one answers each lost write as a
        failed commit: a caller waiting for one (assign, unassign, leave, rejoin,
        purge) gets ``StorageError`` and nothing is applied; a lost history write is
        counted and the next ``flush`` raises ``StorageError`` (those signals stay
        live but are not durable). A flush whose barrier had reached the crashed
        incarnation fails with ``StorageError``. Everything already committed stays.

        Returns:
            A :class:`FaultReport` (``lost_writes``, ``failed``, ``dropped``).
        """
        return self.host.crash_persistence()

    def crash_shard(self, address: M.Address) -> FaultReport:
        """Crash a membership or ledger shard; it is restarted from storage.

        What happens to the messages in flight (the supervisor's contract):

        * The shard's mailbox (and, for a membership shard, the messages it had
          stashed behind a pending commit) is dropped. A dropped signal is lost (it
          had no acknowledgement; listed in ``lost_signals``); a dropped attribution
          is lost for that cohort (``lost_records``; its other cohorts keep it). A
          dropped operation with a reply (control operation, query, read, flush
          barrier) fails with ``ActorFailure``. A dropped purge preparation fails
          the purge whole (nothing committed, nothing retracted). A dropped purge
          retraction or eviction update needs nothing: both were committed before
          they were sent, and the restore applies them.
        * A control operation whose write was already on its way to persistence is
          *in doubt*: its outcome is decided there. Its caller is answered on
          restart with that outcome (success if committed, else the error).
        * Messages sent to the shard while it is down wait. The shard restarts, from
          what the store holds, at the first step at which nothing else can be
          delivered: by then every write the crashed incarnation caused is
          committed (or failed), so the restored state holds every acknowledged
          operation and record numbering never repeats. A restarting ledger shard
          asks the coordinator for the purges in flight (`actors.recovery`); a purge
          waiting for its preparation there, or a re-materialization running there,
          fails with ``ActorFailure``. A retraction prepared by the crashed
          incarnation but arriving after the restart is ignored by the shard (the
          restored state already leaves those records out: tombstones).
        * Counters (``stats()``) carry over.

        After recovery the state equals the reference model's over every operation
        acknowledged (or in doubt and committed), without the lost signals/records.
        Lost records still count against the contribution log's capacity.

        Args:
            address: ``("membership", i)`` or ``("ledger", i)``.

        Returns:
            A :class:`FaultReport`.

        Raises:
            InvalidArgument: not such a shard, already down, or a non-durable store.
        """
        return self.host.crash(address)

    def clock_jump(self, delta_ns: int) -> int:
        """Make the clock jump by ``delta_ns`` (backwards if negative), as a fault.

        Nothing else happens: signals stamped "now" and reads "now" use the new time.
        A contribution stamped after a read's time does not count in it, and none
        weighs more than its weight. Returns the new now.
        """
        now = self.clock.advance(delta_ns)
        self.schedule.event(f"clock jump {'+' if delta_ns >= 0 else ''}{int(delta_ns)} -> {now}")
        return now

    def close_and_reopen(self) -> None:
        """Close (flush, stop, close the store) and open again from the store.

        Everything is restored from storage, as ``TidalDb.open`` restores it; the
        clock, the seed's random sequence and the trace continue.
        """
        self.close()
        if self._lmdb_path is not None:
            self.store = LmdbStore(self._lmdb_path, self.config)
        self._open()
        self.schedule.event("reopened from storage")
