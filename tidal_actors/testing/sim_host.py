"""The deterministic host: the real actor behaviours, one delivery at a time.

:class:`DeterministicHost` implements the pykka host's interface
(``runtime.pykka_host.PykkaHost``) for the message-driven harness. It must not change
what a behaviour does: the behaviours, messages, validation and restore are the
production ones; only the hosting differs.

Theory of operation (FoundationDB-style deterministic simulation):

* One thread, no timers. ``tell`` appends to the receiver's FIFO mailbox and returns;
  nothing is delivered until :meth:`DeterministicHost.step` picks a non-empty mailbox
  with the seeded ``random.Random`` and delivers its oldest message. One mailbox per
  receiver, as under pykka, so the order between one sender and one receiver is FIFO
  and a message sent (causally) earlier to a receiver is delivered earlier. With
  ``ordering="pair"`` there is one queue per sender/receiver pair instead: only the
  per-pair FIFO order is kept, which is what a networked host would guarantee (and
  not enough: purge exactness relies on the causal order one mailbox per receiver
  gives; see ``test_purge_is_exact_with_fifo_per_pair_only``).
* After a delivery that leaves the receiver's mailbox empty the host calls its
  ``on_idle`` (persistence group-commits there), exactly as the pykka host does.
* Same seed and same calls: same deliveries, same trace, byte for byte
  (:class:`~tidal_actors.testing.schedule.Schedule`).
* Between every sender and receiver runs the link protocol (`runtime.links`): each
  message is numbered on its link, applied once and in order, and re-sent when
  nothing else can be delivered; the link faults (``Harness(link_faults=...)``,
  ``drop_next``, ...) lose, duplicate and reorder messages on the way (base class
  :class:`~tidal_actors.testing.sim_links.LinkLayer`). Without link faults the links
  change nothing.
* The host is the supervisor of the fault calls and of handler failures, which it
  deals with as the pykka host does (its base class,
  :class:`~tidal_actors.testing.faults.FaultInjection`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.recovery import FaultReport
from tidal_actors.actors.reply import Reply
from tidal_actors.runtime.links import LinkReceiver, LinkSender
from tidal_actors.runtime.pykka_host import HostContext
from tidal_actors.runtime.supervision import REPORTS_KEPT
from tidal_actors.testing.faults import FaultInjection, _Down
from tidal_actors.testing.schedule import FACADE, Schedule, addr
from tidal_actors.testing.sim_links import Copy, Link, LinkLayer

__all__ = ["DeterministicHost"]


class DeterministicHost(LinkLayer, FaultInjection):
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
        self.ctx.publish_every_s = 0.0  # a ledger publishes after every change
        # operational delays (re-materialization after a purge) run on the manual
        # clock here, so they are as deterministic as everything else
        self.ctx.monotonic = lambda: clock.now_ns() / 1e9
        self.behaviours: dict[M.Address, Behaviour] = {}
        self.incarnation: dict[M.Address, int] = {}
        self.on_replace: Callable[[M.Address, Behaviour], None] | None = None
        self._pair = self.schedule.ordering == "pair"
        self._queues: dict[Any, collections.deque[Copy]] = {}
        self._send: dict[Link, LinkSender[object]] = {}
        self._recv: dict[Link, LinkReceiver[object]] = {}
        self._down: dict[M.Address, _Down] = {}
        self._stopped: set[M.Address] = set()
        self._closed = False
        self._sender: M.Address = FACADE
        self._barriers_seen: dict[int, M.Barrier] = {}
        self._failed_barriers: set[int] = set()
        self.reports: collections.deque[FaultReport] = collections.deque(maxlen=REPORTS_KEPT)

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
        self._send_on(self._sender, address, message)

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

    def settle(self, reply: Reply, timeout: float) -> bool:
        """Deliver messages until ``reply`` is done or nothing is left; ``timeout`` is ignored."""
        while not reply.done and self.step():
            pass
        return bool(reply.done)

    def stop(self, order: list[str]) -> None:
        """Stop kind by kind in ``order``, each draining its mailboxes first (as PykkaHost)."""
        for kind in order:
            while self._progress(lambda a, kind=kind: a[0] == kind):  # type: ignore[misc]
                pass
            for a in self.behaviours:
                if a[0] == kind:
                    self._stopped.add(a)
        self._closed = True
        self._queues.clear()
        self._send.clear()
        self._recv.clear()
        self._down.clear()

    # -- delivery ---------------------------------------------------------------------

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

    def step(self) -> bool:
        """Deliver one message; when none can be delivered, re-send what the links have
        not acknowledged, or else restart a crashed shard.

        Returns False when there is nothing to do.
        """
        if self._closed:
            return False
        if self._progress():
            return True
        if self._down:
            self.restart(min(self._down))
            return True
        return False

    def _deliver_from(self, keys: list[Any]) -> None:
        key = keys[0] if len(keys) == 1 else keys[self.schedule.rng.randrange(len(keys))]
        sender, seq, msg = self._queues[key].popleft()
        address = self._receiver(key)
        link = (sender, address)
        ready = self._arrive(link, seq, msg)
        last = len(ready) - 1
        for i, m in enumerate(ready):
            down = self._down.get(address)
            if down is not None:  # failed on an earlier one: the next incarnation's
                down.carry.extend(ready[i:])
                break
            self._deliver(address, sender, m, more=i < last)
        if ready:
            self._acknowledge(link, seq + last)
        elif address not in self._down and self._mailbox_empty(address):
            self._idle(address, self.behaviours[address])  # discarded the last one

    def _deliver(
        self, address: M.Address, sender: M.Address, msg: object, more: bool = False
    ) -> None:
        sched = self.schedule
        sched.steps += 1
        note, drop = self._intercept(address, msg)
        sched.lines.append(
            f"{sched.steps:>6} {addr(address)} <- {addr(sender)}: {sched.describe(msg)}{note}"
        )
        if drop:
            return
        behaviour = self.behaviours[address]
        prev, self._sender = self._sender, address
        try:
            behaviour.receive(msg)
            if behaviour.fault is not None:  # a handler failure: restarted or resumed
                self.supervise(address, behaviour)
            if not more and address not in self._down and self._mailbox_empty(address):
                self._idle(address, behaviour)
        finally:
            self._sender = prev
        if type(msg) is M.BarrierPart and address == M.PERSIST_ADDR and msg.barrier.reply.done:
            self._barriers_seen.pop(msg.barrier.barrier_id, None)

    def _idle(self, address: M.Address, behaviour: Behaviour) -> None:
        """Its mailbox is empty: the behaviour's ``on_idle`` (persistence commits there)."""
        prev, self._sender = self._sender, address
        try:
            behaviour.on_idle()
        except Exception as exc:  # noqa: BLE001 - as PykkaHost: the actor keeps serving
            behaviour.handler_errors += 1
            behaviour.last_error = exc
        finally:
            self._sender = prev

    def _intercept(self, address: M.Address, msg: object) -> tuple[str, bool]:
        """Supervisor bookkeeping at a delivery: (note for the trace, drop it?)."""
        if address == M.PERSIST_ADDR:
            if type(msg) is M.Write and self.schedule.take(msg):
                return " [injected: this write fails]", False
            if type(msg) is M.BarrierPart:
                b = msg.barrier
                if b.barrier_id in self._failed_barriers:
                    return " [dropped: its flush already failed in a persistence crash]", True
                self._barriers_seen[b.barrier_id] = b
        return "", False

    @property
    def down(self) -> list[M.Address]:
        """Crashed shards not restarted yet."""
        return sorted(self._down)
