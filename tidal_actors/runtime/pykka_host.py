"""The pykka host: one ``pykka.ThreadingActor`` per behaviour, in production.

Owns threads and mailboxes. Mailboxes are FIFO; messages that carry load
(signal batches, attributions, history writes) wait for room once a mailbox holds
``Config.mailbox_capacity`` messages, or, sooner, once the load it holds would take
its actor more than ``Config.inflight_budget_ms`` to work through (queued units --
signals, records, writes -- times the actor's measured seconds per unit, a moving
average of its own handling times). So a fast producer is slowed, never dropped, and
whatever queues behind the load (a leave, a purge's steps, a read) waits for a few
milliseconds of work, not for a mailbox of it. Only
senders that never wait on the receiver are held this way (facade -> membership ->
ledger -> persistence), so no cycle of waits can form; replies and control traffic
always go through.

A producer that must not wait (the flusher thread, an event loop) uses ``offer``
(put only if there is room, atomically) or ``force`` (put past the capacity: a
control operation's buffered signals, bounded by what one buffer holds), and
``when_room`` to be called back, from the receiving actor's thread, once there is
room again.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka
from pykka._envelope import Envelope  # what ActorRef.tell puts; offer/force bypass tell

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.reply import Reply
from tidal_actors.runtime.supervision import Supervisor

__all__ = ["PykkaHost"]

_BOUNDED = (M.SignalBatch, M.Attribute)


def units(msg: object) -> int:
    """The work a load message carries (0: not load): signals, records, or one write."""
    kind = type(msg)
    if kind is M.SignalBatch:
        return len(msg.signals)  # type: ignore[attr-defined]
    if kind is M.Attribute:
        return len(msg.rseqs)  # type: ignore[attr-defined]
    if kind is M.Write and msg.reply is None:  # type: ignore[attr-defined]
        return 1
    return 0


class _Mailbox(queue.Queue):  # type: ignore[type-arg]
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

    def _full(self) -> bool:  # under self.mutex
        if self._qsize() + self.held() + self._reserved >= self._cap:
            return True
        if self._budget_s is None:
            return False
        load = self._units + self.held_units()
        return load > 0 and load * self.unit_s >= self._budget_s

    def _put(self, item: Any) -> None:
        super()._put(item)
        self._units += units(getattr(item, "message", None))

    def _get(self) -> Any:
        item = super()._get()
        self._units -= units(getattr(item, "message", None))
        return item

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

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get(block, timeout)
        if self._room_waiters:
            self._call_room_waiters()
        return item

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

    def put_reserved(self, item: Any) -> None:
        """Put ``item`` in the room `reserve` held for it (never waits)."""
        with self.not_full:
            self._reserved -= 1
            self._put(item)
            self.unfinished_tasks += 1
            self.not_empty.notify()

    def offer(self, item: Any) -> bool:
        """Put ``item`` if there is room (never waits); False if there was none."""
        with self.not_full:
            if self._full():
                return False
            self._put(item)
            self.unfinished_tasks += 1
            self.not_empty.notify()
        return True

    def force(self, item: Any) -> None:
        """Put ``item`` past the capacity (never waits)."""
        super().put(item)

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        msg = getattr(item, "message", None)
        if type(msg) in _BOUNDED or (type(msg) is M.Write and msg.reply is None):
            with self.not_full:
                self._wait_for_room()
                self._put(item)
                self.unfinished_tasks += 1
                self.not_empty.notify()
            return
        super().put(item, block, timeout)


def _actor_class(
    capacity: int, budget_s: float | None, started: list[Any], supervise: Callable[[Any], None]
) -> type[pykka.ThreadingActor]:
    class _Actor(pykka.ThreadingActor):
        use_daemon_thread = True

        def __init__(self, behaviour: Behaviour) -> None:
            super().__init__()
            self.actor_inbox.stopped = self.actor_stopped  # type: ignore[attr-defined]
            self.host(behaviour)
            if not behaviour.time_bounded:
                self.actor_inbox._budget_s = None  # type: ignore[attr-defined]
            self.thread: threading.Thread | None = None
            self.load_units = self.load_msgs = 0
            self.load_s = 0.0
            started.append(self)

        def host(self, behaviour: Behaviour) -> None:
            """Run ``behaviour`` from now on (at the start, and after a restart)."""
            self.behaviour = behaviour
            inbox: Any = self.actor_inbox
            inbox.held = behaviour.held
            inbox.held_units = behaviour.held_units
            behaviour.room_made = inbox.room_made  # type: ignore[method-assign]

        def _start_actor_loop(self) -> None:
            # pykka does not keep its thread; we do, to join it at stop
            kind, index = self.behaviour.address
            self.thread = threading.Thread(
                target=self._actor_loop, name=f"tidal-{kind}-{index}", daemon=True
            )
            self.thread.start()

        @staticmethod
        def _create_actor_inbox() -> Any:
            return _Mailbox(capacity, budget_s)

        def on_receive(self, message: Any) -> None:
            # time the load: handling it, and the idle work it causes (persistence
            # commits there), so the mailbox's seconds per unit say what a unit costs
            # (what the behaviour set aside is not work done yet; what it took back is)
            behaviour = self.behaviour
            held = behaviour.held_units()
            started = time.perf_counter()
            behaviour.receive(message)
            if behaviour.fault is not None:
                supervise(self)
            done = units(message) + held - behaviour.held_units()
            if done > 0:
                self.load_units += done
                self.load_msgs += 1
                self.load_s += time.perf_counter() - started
            if self.actor_inbox.empty():
                idle = time.perf_counter()
                try:
                    self.behaviour.on_idle()
                except Exception as exc:  # noqa: BLE001 - never let the actor die
                    self.behaviour.handler_errors += 1
                    self.behaviour.last_error = exc
                if self.load_units:
                    self.load_s += time.perf_counter() - idle
                    self._sample()
            elif self.load_msgs >= 4:
                self._sample()

        def _sample(self) -> None:
            self.actor_inbox.handled(self.load_units, self.load_s)  # type: ignore[attr-defined]
            self.load_units = self.load_msgs = 0
            self.load_s = 0.0

    return _Actor


class HostContext:
    """The context behaviours see under this host."""

    def __init__(
        self, config: Config, clock: Clock, durable: bool, tell: Callable[[M.Address, object], None]
    ) -> None:
        self.config = config
        self.clock = clock
        self.durable = durable
        self.tell = tell
        self.monotonic = time.monotonic


class PykkaHost:
    """Starts one pykka actor per behaviour and routes ``tell`` by address."""

    def __init__(self, config: Config, clock: Clock, durable: bool) -> None:
        self.config = config
        self.ctx = HostContext(config, clock, durable, self.tell)
        self._refs: dict[M.Address, pykka.ActorRef[Any]] = {}
        self.behaviours: dict[M.Address, Behaviour] = {}
        self._actors: list[Any] = []
        budget = config.inflight_budget_ms
        self._actor_cls = _actor_class(
            config.mailbox_capacity,
            None if budget is None else budget / 1000.0,
            self._actors,
            self._supervise,
        )
        self._stopped = threading.Event()
        self.supervisor: Supervisor | None = None  # set once persistence is started
        # told each behaviour that replaces a failed one (set by the engine)
        self.on_replace: Callable[[M.Address, Behaviour], None] | None = None

    def start(self, behaviours: list[Behaviour]) -> None:
        """Start actors: persistence first, so every sender finds its receiver."""
        for b in behaviours:
            self.behaviours[b.address] = b
            if isinstance(b, Persistence) and self.supervisor is None:
                self.supervisor = Supervisor(self.config, self.ctx, b.store)
            self._refs[b.address] = self._actor_cls.start(b)

    def _supervise(self, actor: Any) -> None:
        """``actor``'s behaviour failed: restart or resume it (`Supervisor.failed`)."""
        old: Behaviour = actor.behaviour
        if self.supervisor is None:
            old.fault = None
            old.resume()
            return
        new = self.supervisor.failed(old)
        if new is not old:
            actor.host(new)
            self.behaviours[new.address] = new
            if self.on_replace is not None:
                self.on_replace(new.address, new)

    def tell(self, address: M.Address, message: object) -> None:
        """Send ``message`` to ``address``. Raises DatabaseClosed once the actor is gone."""
        ref = self._refs.get(address)
        if ref is None:
            raise DatabaseClosed(f"no actor at {address}")
        try:
            ref.tell(message)
        except pykka.ActorDeadError:
            raise DatabaseClosed(f"actor {address} has stopped") from None

    def _inbox(self, address: M.Address) -> _Mailbox:
        ref = self._refs.get(address)
        if ref is None or not ref.is_alive():
            raise DatabaseClosed(f"no actor at {address}")
        return ref.actor_inbox  # type: ignore[return-value]

    def offer(self, address: M.Address, message: object) -> bool:
        """Send ``message`` if the mailbox has room; False (nothing sent) if not."""
        return self._inbox(address).offer(Envelope(message))

    def force(self, address: M.Address, message: object) -> None:
        """Send ``message`` past the mailbox's capacity, without waiting."""
        self._inbox(address).force(Envelope(message))

    def has_room(self, address: M.Address) -> bool:
        return self._inbox(address).has_room()

    def reserve(self, address: M.Address) -> None:
        """Wait for room at ``address`` and hold it (see `_Mailbox.reserve`)."""
        self._inbox(address).reserve()

    def release(self, address: M.Address) -> None:
        ref = self._refs.get(address)
        if ref is not None:
            ref.actor_inbox.release()  # type: ignore[attr-defined]

    def put_reserved(self, address: M.Address, message: object) -> None:
        """Send ``message`` into the room reserved for it."""
        self._inbox(address).put_reserved(Envelope(message))

    def unit_s(self, address: M.Address) -> float:
        """The actor's measured seconds per unit of load (0.0 until measured)."""
        ref = self._refs.get(address)
        return 0.0 if ref is None else float(ref.actor_inbox.unit_s)  # type: ignore[attr-defined]

    def when_room(self, address: M.Address, fn: Callable[[], None]) -> bool:
        """True if ``address`` has room now; else ``fn()`` runs once it has (from the
        actor's thread, or when it stops) and False is returned."""
        return self._inbox(address).when_room(fn)

    def settle(self, reply: Reply, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``reply`` (threads do the work)."""
        return bool(reply.wait(timeout))

    def stop(self, order: list[str]) -> None:
        """Stop actors kind by kind in ``order``; each drains its mailbox first, and
        its thread is joined."""
        for kind in order:
            for address, ref in list(self._refs.items()):
                if address[0] == kind:
                    with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                        ref.stop(block=True, timeout=30)
                    ref.actor_inbox._call_room_waiters()  # type: ignore[attr-defined]  # nobody waits on a stopped actor
        self._refs.clear()
        for actor in self._actors:
            if actor.thread is not None and actor.thread is not threading.current_thread():
                actor.thread.join(timeout=30)
        self._stopped.set()
