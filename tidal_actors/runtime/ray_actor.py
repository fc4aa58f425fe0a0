"""One behaviour in one Ray actor (one process): `ShardActor`, for `runtime.ray_host`.

Inside the actor the behaviour runs unchanged on a one-actor `PykkaHost`
(`LocalHost`): the same bounded mailbox (capacity and time budget), the same
``on_idle`` (persistence's group commit), the same handler-failure hook. Its
context's ``tell`` goes to the local actor for the actor's own address and through
`ray_links.Links` to every other. ``deliver`` (the one Ray method that carries
messages) puts each message into the local mailbox, waiting for room as a pykka
sender does, so per-sender FIFO and backpressure hold end to end. Each call carries
its sender's name and its number on that link: the actor keeps a
`runtime.links.LinkReceiver` per sender, which discards a duplicate and holds back
a call after a gap (neither arises while Ray's per-caller order holds), and returns
the number it has taken up to, the sender's acknowledgement (`runtime.ray_links`).

What the host adds around the behaviour, none of it known to the behaviour:

* persistence relays the history marks to the ledgers after each commit
  (`ray_stores.Marks`);
* the coordinator ticks itself while a re-materialization is due (the pykka host's
  flusher thread reads ``remat_due`` in process; here the coordinator's process does);
* a membership or ledger shard of a durable database whose handler failed with an
  unexpected error is fenced, not restarted (`supervision.Fenced`): a half-updated
  shard is never served. The `FaultReport` goes to the facade;
* a ledger's, a membership shard's or the coordinator's actor of a durable
  database whose process died is restarted by Ray (``max_restarts``) and restores
  (`ray_restart`: by handshake, its messages reported durable, `DurableEnds`;
  `ray_membership_restart`; `ray_coordinator_restart`) on a thread the constructor
  starts, holding meanwhile what it is sent (`ray_restoring`);
* a clock other than `SystemClock` is the facade's time as last carried by a call
  (`Stamped`): every call carries its sender's time;
* an actor of a durable database holds the store's ``actors.lock`` shared from its
  start until its stop (`storage.actor_lock`): a new open waits for the actors of a
  facade that died.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
from typing import Any

import ray

from tidal_actors._clock import SystemClock
from tidal_actors._config import Config
from tidal_actors._errors import ActorFailure
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour, replies_of
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.recovery import FaultReport
from tidal_actors.actors.reply import Reply
from tidal_actors.runtime.links import LinkReceiver
from tidal_actors.runtime.ray_links import RETRY_S, Links
from tidal_actors.runtime.ray_local import (
    Counters,
    DurableFlag,
    FencingSupervisor,
    LocalHost,
    Stamped,
    writable,
)
from tidal_actors.runtime.ray_membership_restart import next_epoch
from tidal_actors.runtime.ray_replies import portable, register_serializers, send_fault
from tidal_actors.runtime.ray_restart import (
    CoordinatorRestart,
    DurableEnds,
    Fences,
    LedgerRestart,
    MembershipRestart,
    announce,
    origin_epoch,
)
from tidal_actors.runtime.ray_restoring import Held, early_answer, fail, run, take_notices
from tidal_actors.runtime.ray_shipping import dumps, loads, unbox
from tidal_actors.runtime.ray_stores import (
    MarkRelay,
    Marks,
    actor_store,
    owns_history,
    take_marks,
)
from tidal_actors.storage.actor_lock import ActorHold
from tidal_actors.storage.shard_part import Part, coordinator_part
from tidal_actors.storage.stores import NullStore

__all__ = ["TICK_S", "Counters", "ShardActor", "Stamped"]

log = logging.getLogger("tidal_actors")

TICK_S = 0.05  # how often the coordinator looks whether a re-materialization is due (seconds)


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class ShardActor:
    """Hosts one behaviour (see the module).

    Args:
        db: the database's actor name prefix.
        address: the behaviour's address.
        payload: the behaviour, pickled by `ray_shipping.dumps` (names ``ctx``,
            ``store``, ``clock``), boxed (`ray_shipping.box`: read only by the
            first incarnation; a restart restores from the store).
        config: the database's settings.
        durable: whether the database has a durable store.
        path: the LMDB directory (None: ephemeral).
        sink: the facade's reply sink's name.
        system_clock: the facade's clock is a `SystemClock` (else `Stamped`).
        opened: the epoch of every actor's first incarnation (int ns).
    """

    def __init__(
        self,
        db: str,
        address: M.Address,
        payload: list[Any],
        config: Config,
        durable: bool,
        path: str | None,
        sink: str,
        system_clock: bool,
        opened: int = 0,
    ) -> None:
        register_serializers()
        self.address = address
        self.sink = sink
        self.clock: Any = SystemClock() if system_clock else Stamped()
        # a ledger or membership shard of a durable database restarts in place
        # (`ray_restart`, `ray_membership_restart`)
        restartable = address[0] in (M.LEDGER, M.MEMBERSHIP, M.COORDINATOR) and path is not None
        restarted = restartable and ray.get_runtime_context().was_current_actor_reconstructed
        try:
            self.epoch = next_epoch(db, address, opened) if restarted else opened
        except Exception as exc:  # noqa: BLE001 - Ray restarts it again
            fail(address, sink, exc)
        origin = f"{address[0]}-{address[1]}"
        self.links = Links(
            db,
            self._stamp,
            origin=f"{origin}@{self.epoch}" if restartable else origin,
            opened=opened,
            restart_safe=lambda a: path is not None and a[0] == M.LEDGER,
        )
        self._ends: dict[str, LinkReceiver[list[object]]] = {}
        self._fences = Fences()
        self._asks: dict[tuple[int, int], Reply] = {}
        self._ask_ids = itertools.count(1)
        self.durable_ends = DurableEnds() if restartable and address[0] == M.LEDGER else None
        self.host = LocalHost(
            config, self.clock, durable, self.links, self.durable_ends, address[1], self.epoch
        )
        if address[0] == M.LEDGER and path is not None and owns_history(path, config):
            # the shards layout: this ledger commits its history in its own environment
            self.host.commit_history = lambda ops: self._resolve("store").commit(ops)
        elif address[0] in (M.MEMBERSHIP, M.COORDINATOR) and path and owns_history(path, config):
            # the shards layout: its control writes go to its own environment
            self.host.commit_control = lambda w: self._resolve("store").commit_writes(w)
        self.host.supervisor = FencingSupervisor(config, self.host.ctx, DurableFlag(durable))
        self.host.supervisor.on_fault = self._fault
        self.store: Any = None
        self._opening = threading.Lock()  # `_resolve`'s open of the store
        self._path = path
        # held while this process may write the store: a new open waits for it
        self._hold = ActorHold(path) if path is not None else None
        self._config = config
        self._relay = MarkRelay()
        self._stop_tick = threading.Event()
        self._held = Held(holding=restarted)
        threading.Thread(target=self._retry, name="tidal-retry", daemon=True).start()
        if restarted:
            threading.Thread(target=run, args=(self,), name="tidal-restore", daemon=True).start()
        else:
            self.begin(loads(unbox(payload), self._resolve), None)

    def begin(
        self,
        behaviour: Behaviour,
        notice: LedgerRestart | MembershipRestart | CoordinatorRestart | None,
    ) -> None:
        """Start ``behaviour`` (the first incarnation's, or a restart's restored one),
        then let what was held meanwhile into its mailbox, in order, and tell the
        other actors of a restart (``notice``)."""
        if isinstance(behaviour, Persistence):
            idle = behaviour.on_idle

            def on_idle() -> None:
                idle()
                self._relay.relay(self.store, self.links)

            behaviour.on_idle = on_idle  # type: ignore[method-assign]
        self.host.start([behaviour])
        self._held.release()
        if self.address == M.COORD_ADDR:
            threading.Thread(target=self._tick, name="tidal-tick", daemon=True).start()
        if notice is not None:
            announce(self, notice)

    # -- restart in place (`runtime.ray_restart`) ---------------------------------------

    def _durable(self, token: Any) -> bool:
        durable = getattr(self.host.behaviours.get(self.address), "durable", None)
        return durable is not None and bool(durable(token))

    def fence(self, name: str, epoch: int) -> None:
        """Discard from now on the calls of ``name``'s incarnations before ``epoch``."""
        self._fences.fence(name, epoch)

    def coordinator_part(self) -> Part | None:
        """(The coordinator's actor, in the ``shards`` layout.) Its environment's
        records a restarting shard restores with (`storage.shard_part`), read once
        its control writes handed over before are committed; None in another layout."""
        if self.host.commit_control is None:
            return None
        self.host.drain_control()
        return coordinator_part(self._resolve("store"))

    def known_epochs(self) -> dict[M.Address, int]:
        """The epochs of the actors that restarted, as this actor's links number for
        them (`ray_membership_restart.restore`)."""
        return self.links.known_epochs()

    def epochs(self, name: str, address: M.Address) -> int:
        """The highest epoch (int ns) of the actor ``address`` (named ``name`` on its
        links) this actor knows of: of the calls it took from it, of its fences, and
        of the incarnation its links number for (`ray_membership_restart.next_epoch`)."""
        known = [self.links.epoch(address), self._fences.floor(name)]
        known += [e for n, e in map(origin_epoch, self._ends) if n == name]
        return max(known)

    def ask(self, make: Any, label: str) -> tuple[int, int]:
        """Put ``make(reply)`` into the mailbox (held until the behaviour is up, unless
        `ray_restoring.early_answer` answers it); returns the id `answer` takes (its
        incarnation's epoch and a number)."""
        rid = (self.epoch, next(self._ask_ids))
        reply = self._asks[rid] = Reply(label)
        msg = make(reply)
        early = functools.partial(early_answer, self.address, self.epoch, msg)
        self._held.ask(functools.partial(self.host.tell, self.address, msg), early)
        return rid

    def answer(self, rid: tuple[int, int]) -> tuple[bool, Any, Any] | None:
        """``(done, value, error)`` of the reply of `ask` ``rid``; None if this
        incarnation was not asked it (the asker asks again)."""
        reply = self._asks.get(rid)
        if reply is None:
            return None
        if not reply.done:
            return (False, None, None)
        del self._asks[rid]
        if reply.error is not None:
            return (True, None, portable(reply.error))
        return (True, reply.result(), None)

    def _resolve(self, name: str) -> Any:
        if name == "ctx":
            return self.host.ctx
        if name == "clock":
            return self.clock
        if name == "store":
            # opened on first use, which may come from two threads at once (a commit
            # thread, `ray_history` or `ray_control`, and a Ray call such as
            # `coordinator_part`): opened once, since two opens of one LMDB
            # environment in one process break its locks
            with self._opening:
                if self.store is None:
                    if self._path is None:
                        self.store = NullStore()
                    else:
                        host = self.host
                        writer = self.address == M.PERSIST_ADDR or (
                            host.commit_history is not None or host.commit_control is not None
                        )
                        self.store = actor_store(self._path, self._config, writer=writer)
            return self.store
        raise KeyError(name)

    def _stamp(self) -> int | None:
        return None if isinstance(self.clock, SystemClock) else self.clock.now

    def _fault(self, report: FaultReport) -> None:
        send_fault(self.sink, report)

    def _tick(self) -> None:
        while not self._stop_tick.wait(TICK_S):
            b = self.host.behaviours.get(M.COORD_ADDR)
            if b is not None and getattr(b, "remat_due", False):
                try:
                    self.host.tell(M.COORD_ADDR, M.Tick())
                except Exception:  # noqa: BLE001 - stopped
                    return

    def _retry(self) -> None:
        while not self._stop_tick.wait(RETRY_S):
            try:
                self.links.retry()
            except Exception:  # noqa: BLE001 - stopped
                return

    def ready(self) -> bool:
        return True

    def deliver(
        self, stamp: int | None, origin: str, epoch: int, seq: int, messages: list[object]
    ) -> tuple[int, int, list[int]] | None:
        """Take call ``seq`` of the link from ``origin``: put its ``messages`` (and
        those of the calls after it held back) into the local mailbox, in order
        (waits for room); a duplicate is discarded, and so is a call numbered for
        another ``epoch`` than this incarnation's or from a fenced incarnation
        (then None). Returns ``(epoch, applied, durable)``: the number taken up to
        on that link (the acknowledgement) and, at a ledger of a durable database,
        the numbers durable here since the last return to ``origin``."""
        if stamp is not None and isinstance(self.clock, Stamped) and stamp > self.clock.now:
            self.clock.now = stamp
        if epoch != self.epoch or self._fences.fenced(origin):
            take_notices(self.links, messages)
            return None
        end = self._ends.get(origin)
        if end is None:
            end = self._ends[origin] = LinkReceiver()
        first = end.applied + 1
        for k, batch in enumerate(end.accept(seq, messages)):  # held while restoring
            self._held.take(functools.partial(self._take, origin, first + k, batch))
        ends = self.durable_ends
        durable = [] if ends is None else ends.report(origin, self._durable)
        return (self.epoch, end.applied, durable)

    def _take(self, origin: str, seq: int, messages: list[object]) -> None:
        ends = self.durable_ends
        for msg in messages:
            t = type(msg)
            notice = t is LedgerRestart or t is MembershipRestart or t is CoordinatorRestart
            if ends is not None and (t is Marks or t is Counters or notice):
                ends.now(origin, seq)  # nothing of it to restore: durable at once
            if notice:
                self.links.restarted(msg)  # type: ignore[arg-type]
                continue
            if t is Marks:
                if self.store is not None and self.address != M.PERSIST_ADDR:
                    take_marks(self.store, msg, self.address[1])  # type: ignore[arg-type]
                continue
            if t is Counters:
                b = self.host.behaviours[self.address]
                msg.reply.set_result(  # type: ignore[attr-defined]
                    {
                        "handler_errors": b.handler_errors,
                        "commits": getattr(b, "commits", 0),
                        "failed_writes": getattr(b, "failed_writes", 0),
                        **self.host.own_counts(),
                    }
                )
                continue
            try:
                msg = writable(msg)
                if ends is not None:
                    ends.taken(origin, seq, msg)
                self.host.tell(self.address, msg)
            except Exception as exc:  # a host defect: its caller hears it, never a hang
                err = ActorFailure(
                    f"{self.address[0]}[{self.address[1]}] could not take {t.__name__}: {exc!r}"
                )
                log.error("%s", err)
                for reply in replies_of(msg):
                    reply.set_exception(err)

    def stop(self) -> bytes:
        """Drain and stop the behaviour, wait for what it sent, close the store; the
        behaviour as it ended, pickled by `ray_shipping.dumps`.

        Raises:
            ActorFailure: a restart's restore has not brought the behaviour up within
                60 s."""
        if not self._held.up.wait(60):
            raise ActorFailure(f"{self.address[0]}[{self.address[1]}] is still restoring")
        self._stop_tick.set()
        self.host.stop([self.address[0]])
        self.links.drain(timeout=60)
        self.links.closed = True
        b = self.host.behaviours[self.address]
        b.__dict__.pop("room_made", None)  # the local mailbox's wake-up
        b.__dict__.pop("on_idle", None)
        b.__dict__.pop("receive", None)  # `ray_restart.track`'s
        b.fault = None
        data = dumps(b, {"ctx": self.host.ctx, "store": self.store, "clock": self.clock})
        if self.store is not None:
            self.store.close()
        if self._hold is not None:
            self._hold.release()
        return data

    def pid(self) -> int:
        """The actor's process id (tests kill it)."""
        return os.getpid()

    def node(self) -> str:
        """The id of the Ray node the actor runs on (hex)."""
        return str(ray.get_runtime_context().get_node_id())
