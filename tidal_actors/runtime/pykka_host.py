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

An actor takes the signal batches queued back to back at the head of its mailbox,
or one membership shard's attributions queued before any other kind of message, as
one message (`mailbox.coalesce`, up to ``COALESCE_RECORDS``): a run of small calls
costs one message's fixed cost at each shard, not one per call. The deterministic
host delivers messages one by one.

A producer that must not wait (the flusher thread, an event loop) uses ``offer``
(put only if there is room, atomically) or ``force`` (put past the capacity: a
control operation's buffered signals, bounded by what one buffer holds), and
``when_room`` to be called back, from the receiving actor's thread, once there is
room again.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import pykka
from pykka._envelope import Envelope  # what ActorRef.tell puts; offer/force bypass tell

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour, replies_of
from tidal_actors.actors.ledger_views import PUBLISH_EVERY_S
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.reply import Reply
from tidal_actors.runtime.inline import level_of, may_run, nested_s, run_claimed, set_level
from tidal_actors.runtime.mailbox import Mailbox, units
from tidal_actors.runtime.supervision import Supervisor

__all__ = ["PykkaHost"]

_WAKE = object()  # put for an actor's thread to take once its actor stopped (`run_inline`)


def _mailbox(ref: pykka.ActorRef[pykka.ThreadingActor]) -> Mailbox:
    """The mailbox of an actor `_actor_class` made (its `_create_actor_inbox`)."""
    return cast(Mailbox, ref.actor_inbox)


class _Hosted(Protocol):
    """What the host reads of an actor `_actor_class` made."""

    behaviour: Behaviour
    thread: threading.Thread | None
    mailbox: Mailbox

    def host(self, behaviour: Behaviour) -> None: ...

    def run_inline(self, message: object) -> None: ...


def _actor_class(
    capacity: int,
    budget_s: float | None,
    started: list[_Hosted],
    supervise: Callable[[_Hosted], None],
) -> type[pykka.ThreadingActor]:
    class _Actor(pykka.ThreadingActor):
        use_daemon_thread = True

        def __init__(self, behaviour: Behaviour) -> None:
            super().__init__()
            self.mailbox = cast(Mailbox, self.actor_inbox)  # `_create_actor_inbox`'s
            self.mailbox.stopped = self.actor_stopped
            self.host(behaviour)
            if not behaviour.time_bounded:
                self.mailbox._budget_s = None
            self.thread: threading.Thread | None = None
            self.load_units = self.load_msgs = 0
            self.load_s = 0.0
            started.append(self)

        def host(self, behaviour: Behaviour) -> None:
            """Run ``behaviour`` from now on (at the start, and after a restart)."""
            self.behaviour = behaviour
            inbox = self.mailbox
            inbox.held = behaviour.held
            inbox.held_units = behaviour.held_units
            # the behaviour's hook (a no-op method) becomes its mailbox's wake-up
            behaviour.room_made = inbox.room_made  # type: ignore[method-assign]

        def _start_actor_loop(self) -> None:
            # pykka does not keep its thread; we do, to join it at stop
            kind, index = self.behaviour.address
            self.thread = threading.Thread(
                target=self._run_loop,
                args=(level_of(kind),),
                name=f"tidal-{kind}-{index}",
                daemon=True,
            )
            self.thread.start()

        def _run_loop(self, level: int) -> None:
            set_level(level)  # which actors this thread may run messages of (`inline`)
            self._actor_loop()

        def run_inline(self, message: object) -> None:
            """Handle ``message`` in the calling thread, as this actor's thread would
            (the caller holds the mailbox's claim, `runtime.inline`). A failure that
            escapes the handler stops the actor, as in pykka's loop. An exception that
            is not an ``Exception`` (a signal handler's KeyboardInterrupt or SystemExit
            in the main thread) may have stopped the handler halfway: it counts as the
            handler's failure (the message's replies fail, the supervisor restarts or
            resumes the behaviour), then goes on up."""
            try:
                self.on_receive(message)
            except Exception:  # noqa: BLE001 - as pykka's actor loop: logged, the actor stops
                self._handle_failure(*sys.exc_info())
                self.mailbox.force(Envelope(_WAKE))  # its thread, waiting in get, ends
            except BaseException as exc:
                behaviour = self.behaviour
                behaviour.handler_errors += 1
                behaviour.last_error = exc
                if behaviour.fault is None:
                    behaviour.fault = (message, exc)
                err = behaviour.failure(message, exc)
                for reply in replies_of(message):
                    reply.set_exception(err)
                with contextlib.suppress(Exception):
                    supervise(self)
                raise

        @staticmethod
        def _create_actor_inbox() -> Mailbox:
            return Mailbox(capacity, budget_s)

        def on_receive(self, message: Any) -> None:
            if message is _WAKE:
                return
            # time the load: handling it, and the idle work it causes (persistence
            # commits there), so the mailbox's seconds per unit say what a unit costs
            # (what the behaviour set aside is not work done yet; what it took back is)
            behaviour = self.behaviour
            held = behaviour.held_units()
            started = time.perf_counter()
            nested = nested_s()  # what it runs for the actors below it is theirs (`inline`)
            behaviour.receive(message)
            if behaviour.fault is not None:
                supervise(self)
            done = units(message) + held - behaviour.held_units()
            if done > 0:
                self.load_units += done
                self.load_msgs += 1
                self.load_s += time.perf_counter() - started - (nested_s() - nested)
            if self.actor_inbox.empty():
                wait = self.behaviour.idle_wait_s()
                if wait > 0.0 and self.mailbox.wait_for_message(wait):
                    return  # more came: idle is asked again after it
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

        def on_stop(self) -> None:
            self.behaviour.on_stop()

        def _sample(self) -> None:
            self.mailbox.handled(self.load_units, self.load_s)
            self.load_units = self.load_msgs = 0
            self.load_s = 0.0

    return _Actor


def _nothing() -> None:
    pass


class _AsideJob:
    """Work run on a thread of its own (`HostContext.run_aside`)."""

    def __init__(self, fn: Callable[[], Any], done: Callable[[_AsideJob], None]) -> None:
        self._result: tuple[Any, BaseException | None] = (None, None)
        self._finished = threading.Event()
        self._fn, self._done = fn, done
        threading.Thread(target=self._run, name="tidal-aside", daemon=True).start()

    def _run(self) -> None:
        try:
            self._result = (self._fn(), None)
        except Exception as exc:  # noqa: BLE001 - handed to whoever waits for it
            self._result = (None, exc)
        self._finished.set()
        with contextlib.suppress(Exception):  # the actor told may have stopped
            self._done(self)

    def wait(self) -> tuple[Any, BaseException | None]:
        """Block until done: ``(result, None)`` or ``(None, error)``."""
        self._finished.wait()
        return self._result


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
        # called by a behaviour that needs the engine's periodic work soon (a ledger
        # shard's `Publish`, the coordinator's `Tick`): wakes a sleeping flusher thread
        self.wake_ticker: Callable[[], None] = _nothing
        # how often a ledger shard publishes its view under load (`actors.ledger_views`)
        self.publish_every_s = PUBLISH_EVERY_S
        # ``run_aside(fn, done)``: run ``fn()`` off the actor's thread, then
        # ``done(job)``; ``job.wait()`` gives ``(result, None)`` or ``(None, error)``
        # (persistence reads a purge's erasure there, `actors.erasure`). None: the
        # work runs in the handler (the deterministic harness's hosts)
        self.run_aside: Callable[[Callable[[], Any], Callable[[Any], None]], Any] | None = None


class PykkaHost:
    """Starts one pykka actor per behaviour and routes ``tell`` by address."""

    def __init__(self, config: Config, clock: Clock, durable: bool) -> None:
        self.config = config
        self.ctx = HostContext(config, clock, durable, self.tell)
        self.ctx.run_aside = _AsideJob  # a thread per job
        self._refs: dict[M.Address, pykka.ActorRef[pykka.ThreadingActor]] = {}
        self.behaviours: dict[M.Address, Behaviour] = {}
        self._actors: list[_Hosted] = []
        self._hosted: dict[M.Address, _Hosted] = {}
        # whether threads that are not actors' (the blocking facade's callers) may run
        # messages themselves (`runtime.inline`); an async facade's database sets it
        # False, so that its loop's thread never runs a handler
        self.callers_run_inline = True
        # False: no thread runs another actor's message, every message queues for its
        # actor's thread (tests of the queued path: coalescing, a held handler)
        self.senders_run_inline = True
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
            self._hosted[b.address] = self._actors[-1]  # appended by its constructor

    def _supervise(self, actor: _Hosted) -> None:
        """``actor``'s behaviour failed: restart or resume it (`Supervisor.failed`)."""
        old = actor.behaviour
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
            if new.fault is not None:
                # it failed on what it took over from the failed one: dealt with now,
                # not after the next message has been handled by a half-updated shard
                self._supervise(actor)

    def _run_here(self, address: M.Address, message: object) -> bool:
        """Handle ``message`` in this thread if the rule of `runtime.inline` allows it
        and the actor at ``address`` is idle; whether it was."""
        return self.run_here(address, lambda: message)

    def run_here(self, address: M.Address, build: Callable[[], object]) -> bool:
        """Handle the message ``build()`` makes in this thread, if the rule of
        `runtime.inline` allows it and the actor at ``address`` is idle (``build`` is
        called only then, with the actor held); whether it was. A caller with a large
        batch sends it whole this way, where a queued one would go in chunks."""
        level = may_run(address[0], self.callers_run_inline)
        if level is None or not self.senders_run_inline:
            return False
        actor = self._hosted.get(address)
        return actor is not None and run_claimed(actor.mailbox, level, actor.run_inline, build)

    def tell(self, address: M.Address, message: object) -> None:
        """Send ``message`` to ``address`` (handled in this thread if the actor is idle
        and `runtime.inline` allows it). Raises DatabaseClosed once the actor is gone."""
        ref = self._refs.get(address)
        if ref is None:
            raise DatabaseClosed(f"no actor at {address}")
        if self._run_here(address, message):
            return
        try:
            ref.tell(message)
        except pykka.ActorDeadError:
            raise DatabaseClosed(f"actor {address} has stopped") from None

    def _inbox(self, address: M.Address) -> Mailbox:
        ref = self._refs.get(address)
        if ref is None or not ref.is_alive():
            raise DatabaseClosed(f"no actor at {address}")
        return _mailbox(ref)

    def offer(self, address: M.Address, message: object) -> bool:
        """Send ``message`` if the mailbox has room; False (nothing sent) if not."""
        return self._inbox(address).offer(Envelope(message))

    def force(self, address: M.Address, message: object) -> None:
        """Send ``message`` past the mailbox's capacity, without waiting for room (or
        handle it here, as `tell`)."""
        inbox = self._inbox(address)
        if not self._run_here(address, message):
            inbox.force(Envelope(message))

    def has_room(self, address: M.Address) -> bool:
        return self._inbox(address).has_room()

    def reserve(self, address: M.Address) -> None:
        """Wait for room at ``address`` and hold it (see `Mailbox.reserve`)."""
        self._inbox(address).reserve()

    def release(self, address: M.Address) -> None:
        ref = self._refs.get(address)
        if ref is not None:
            _mailbox(ref).release()

    def put_reserved(self, address: M.Address, message: object) -> None:
        """Send ``message`` into the room reserved for it (or handle it here, as
        `tell`, and give the room back)."""
        inbox = self._inbox(address)
        if self._run_here(address, message):
            inbox.release()
        else:
            inbox.put_reserved(Envelope(message))

    def unit_s(self, address: M.Address) -> float:
        """The actor's measured seconds per unit of load (0.0 until measured)."""
        ref = self._refs.get(address)
        return 0.0 if ref is None else _mailbox(ref).unit_s

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
                    _mailbox(ref)._call_room_waiters()  # nobody waits on a stopped actor
        self._refs.clear()
        for actor in self._actors:
            if actor.thread is not None and actor.thread is not threading.current_thread():
                actor.thread.join(timeout=30)
        self._stopped.set()
