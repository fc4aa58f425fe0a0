"""The Ray host: each behaviour in its own Ray actor (one process each).

Implements `runtime.host.Host` for `Config(host="ray")`. Each membership shard, each
ledger shard, the purge coordinator and persistence is a named Ray actor
(`runtime.ray_actor.ShardActor`, synchronous, ``max_restarts=0``,
``max_task_retries=0``) in which the behaviour runs unchanged; the facades and
`Core` are unchanged.

* Order: one Ray call per message, ``deliver``; a synchronous actor runs one
  caller's calls in submission order, which is the per sender/receiver FIFO the
  ordering argument needs (docs/architecture.md).
* Replies: a `Reply` crosses as ``(sink, reply_id)`` and is settled in this process
  by one reply path per facade (`runtime.ray_replies`): no thread per waiting call.
* Backpressure: a credit window per sender and receiver in front of the receiver's
  bounded local mailbox (`runtime.ray_links`); ``offer``, ``force``, ``reserve`` and
  ``when_room`` keep their contract (``when_room``'s callback runs on the reply
  path's thread).
* Numpy columns (`messages.Attribute`) cross as pickle-5 buffers (Ray's own
  serialization); signals travel in batches of ``Config.batch_size`` (8,192 signals
  unless ``signal_batch_size`` says otherwise: each batch is a Ray call).
* Store: opened by this process; in the ``shards`` layout (the default for a store
  made under this host, `storage.layout`) each shard's process commits its own
  environment (a ledger's history, `runtime.ray_history`; a membership shard's
  control writes and the coordinator's purges, `runtime.ray_control`) and the
  persistence actor's process a rebuild's history erasure; in the ``single`` layout
  persistence writes the one environment. The ledgers' processes read the history back from
  the store (`runtime.ray_stores`); so the actors of a durable database run where
  that directory is: this process's node, or for the ledgers the nodes advertising
  ``Config.ray_store_resource`` (`runtime.ray_placement`).
* Restarts: a ledger actor of a durable database whose process died is restarted
  by Ray (``max_restarts``) and restores by handshake; the links into it keep each
  message until it is durable there and re-send the rest after the restart
  (`runtime.ray_restart`). A membership shard's and the coordinator's actor of a
  durable database are restarted too and restore from their own environments and
  the coordinator's records (`storage.shard_part`); the calls in
  flight to them fail saying they may have been applied
  (`runtime.ray_membership_restart`, `runtime.ray_coordinator_restart`).
  Persistence's death fails every call waiting and every call after
  (`runtime.ray_faults`: what the host does on a death or a restart's notice); a
  shard whose handler failed is fenced (`runtime.ray_actor`).

Ray is started here if it is not running (``Config.ray_address``: None starts a
local instance, ``"auto"`` or ``"ray://..."`` joins a cluster).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from tidal_actors._clock import Clock, SystemClock
from tidal_actors._config import Config
from tidal_actors._errors import ActorFailure, DatabaseClosed, StorageError
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.recovery import FaultReport
from tidal_actors.actors.reply import Reply
from tidal_actors.runtime.pykka_host import HostContext
from tidal_actors.runtime.ray_actor import ShardActor
from tidal_actors.runtime.ray_faults import RayFaults
from tidal_actors.runtime.ray_links import RETRY_S, Links, actor_name
from tidal_actors.runtime.ray_local import Counters
from tidal_actors.runtime.ray_placement import check_store_resource, placement
from tidal_actors.runtime.ray_replies import NAMESPACE, ReplyPath, forget, register_serializers
from tidal_actors.runtime.ray_restart import (
    LEDGER_RESTARTS,
)
from tidal_actors.runtime.ray_shipping import box, dumps, loads
from tidal_actors.runtime.ray_start import ensure_ray
from tidal_actors.runtime.supervision import REPORTS_KEPT
from tidal_actors.storage.actor_lock import ready_for_actors

__all__ = ["START_WAIT_S", "STOP_WAIT_S", "RayHost", "ensure_ray"]

START_WAIT_S = 300.0  # how long start() waits for the actors to be up (seconds)
STOP_WAIT_S = 120.0  # how long stop() waits for each kind of actor to stop (seconds)


class RayHost(RayFaults):
    """Runs each behaviour in a Ray actor (see the module).

    Args:
        config: the database's settings (``ray_address`` says which cluster).
        clock: the facade's clock; a clock other than `SystemClock` reaches the
            actors as the time each call carries.
        durable: whether the store is durable.
    """

    def __init__(self, config: Config, clock: Clock, durable: bool) -> None:
        ensure_ray(config.ray_address)
        if durable:
            check_store_resource(config)
        self.config = config
        self.clock = clock
        self.durable = durable
        self.ctx = HostContext(config, clock, durable, self.tell)
        self.behaviours: dict[M.Address, Behaviour] = {}
        self.on_replace: Callable[[M.Address, Behaviour], None] | None = None
        self.reports: collections.deque[FaultReport] = collections.deque(maxlen=REPORTS_KEPT)
        self.on_fault: Callable[[FaultReport], None] | None = None
        self.db = f"tidal-{uuid.uuid4().hex[:12]}"
        self._system_clock = type(clock) is SystemClock
        self._waiters: dict[M.Address, list[Callable[[], None]]] = {}
        self._waiters_lock = threading.Lock()
        self.path = ReplyPath(f"{self.db}-sink", self._fault, self._poll)
        register_serializers(self.path)
        self.opened = time.time_ns()  # the epoch of each actor's first incarnation
        self._restartable = False  # ledgers restart in place: a durable database's
        self.links = Links(
            self.db,
            self._stamp,
            self.path,
            opened=self.opened,
            restart_safe=lambda a: self._restartable and a[0] == M.LEDGER,
            followed=lambda a: self._restartable and a[0] in (M.MEMBERSHIP, M.COORDINATOR),
        )
        self._actors: dict[M.Address, Any] = {}
        self._store: Any = None
        self._stopped = False
        self._dead: ActorFailure | None = None  # an actor's process died (`_watch`)
        self._probes: dict[M.Address, Any] = {}
        self._next_probe = 0.0
        self._next_retry = 0.0

    # -- lifetime -------------------------------------------------------------------

    def start(self, behaviours: list[Behaviour]) -> None:
        """One actor per behaviour (persistence first), each waited for."""
        store_path: str | None = None
        for b in behaviours:
            if isinstance(b, Persistence):
                self._store = b.store
                path = getattr(b.store, "path", None)
                store_path = None if path is None or not b.store.durable else str(path)
        named = {"ctx": self.ctx, "store": self._store, "clock": self.clock}
        boxes: list[
            list[Any]
        ] = []  # the behaviours' pickles, kept until every actor has read its own
        self._restartable = store_path is not None
        if store_path is not None:  # refused here, not inside an actor's process
            try:
                ready_for_actors(Path(store_path))
            except StorageError:
                self._give_up()
                raise
        for b in behaviours:
            self.behaviours[b.address] = b
            in_place = b.address[0] in (M.LEDGER, M.MEMBERSHIP, M.COORDINATOR)
            restarts = LEDGER_RESTARTS if self._restartable and in_place else 0
            boxes.append(box(dumps(b, named)))
            actor = ShardActor.options(  # type: ignore[attr-defined]
                name=actor_name(self.db, b.address),
                max_restarts=restarts,
                namespace=NAMESPACE,
                **placement(self.config, b.address, store_path is not None),
            ).remote(
                self.db,
                b.address,
                boxes[-1],
                self.config,
                self.durable,
                store_path,
                self.path.name,
                self._system_clock,
                self.opened,
            )
            self._actors[b.address] = actor
            self.links.add(b.address, actor)
        try:
            ray.get([a.ready.remote() for a in self._actors.values()], timeout=START_WAIT_S)
            del boxes
        except Exception as exc:  # noqa: BLE001 - an actor could not start: none is left running
            self._give_up()
            raise ActorFailure(
                f"the Ray host could not start its actors: {type(exc).__name__}: {exc}"
            ) from exc

    def _give_up(self) -> None:
        """A start that failed: every actor started so far killed, the reply path
        closed."""
        self._stopped = True
        self.links.closed = True
        for h in self._actors.values():
            with contextlib.suppress(Exception):
                ray.kill(h)
        self._actors.clear()
        self.path.close()
        forget(self.path)

    def stop(self, order: list[str]) -> None:
        """Stop the actors kind by kind in ``order`` (each drains its mailbox and waits
        for what it sent); the behaviours as they ended replace this process's copies
        (the engine reads them at close: the ledgers' state for the snapshot)."""
        if self._stopped:
            return
        self._stopped = True
        self.links.drain(timeout=STOP_WAIT_S)
        named = {"ctx": self.ctx, "store": self._store, "clock": self.clock}
        for kind in order:
            stopping = {a: h.stop.remote() for a, h in self._actors.items() if a[0] == kind}
            for address, ref in stopping.items():
                try:
                    data = ray.get(ref, timeout=STOP_WAIT_S)
                except Exception as exc:  # noqa: BLE001 - its process is gone: nothing to read back
                    self._lost(address, exc)
                    continue
                self._adopt(address, loads(data, named.__getitem__))
        self.links.closed = True
        for h in self._actors.values():
            with contextlib.suppress(Exception):  # already gone
                ray.kill(h)
        self._actors.clear()
        self.path.close()
        forget(self.path)
        self._call_waiters(everyone=True)
        adopt = getattr(self._store, "adopt_map_size", None)
        if adopt is not None:
            with contextlib.suppress(Exception):  # the snapshot write says so if it matters
                adopt()  # the actors' processes may have grown the maps

    def _adopt(self, address: M.Address, ended: Behaviour) -> None:
        local = self.behaviours.get(address)
        if local is not None and type(local) is type(ended):
            handlers = local.__dict__.get("_handlers")
            local.__dict__.update(ended.__dict__)
            if handlers is not None:
                local.__dict__["_handlers"] = handlers
            return
        self.behaviours[address] = ended
        if self.on_replace is not None:
            self.on_replace(address, ended)

    def _stamp(self) -> int | None:
        return None if self._system_clock else self.clock.now_ns()

    # -- sending --------------------------------------------------------------------

    def tell(self, address: M.Address, message: object) -> None:
        """Send ``message`` (a load message waits for the window). Raises
        DatabaseClosed once the host has stopped."""
        if type(message) is M.QueryManifests and message.user == -1:
            self._stats(message)
            return
        self._check(address)
        self.links.send(address, message)

    def _stats(self, message: M.QueryManifests) -> None:
        """The coordinator's stats, with persistence's counters brought into this
        process's copy first (`Operations.stats` reads them there); its ``commits``
        and ``failed_writes`` count too those each actor's process ran in its own
        environment (the ``shards`` layout: `LocalHost.own_counts`), which
        persistence does not see."""
        self._check(M.COORD_ADDR)
        coord = Reply("coordinator-stats")
        counts = {a: Reply(f"counters-{a[0]}-{a[1]}") for a in self._actors}
        self.links.send(M.COORD_ADDR, M.QueryManifests(-1, coord))
        for address, reply in counts.items():
            self.links.send(address, Counters(reply))
        target = message.reply
        pending = [1 + len(counts)]
        lock = threading.Lock()

        def done(_: Reply) -> None:
            with lock:
                pending[0] -= 1
                if pending[0]:
                    return
            mine = counts.get(M.PERSIST_ADDR)
            if mine is not None and mine.error is None:
                persistence = self.behaviours.get(M.PERSIST_ADDR)
                own = [r.result() for r in counts.values() if r.error is None]
                for k, v in mine.result().items():
                    if not k.startswith("own_"):
                        setattr(persistence, k, v)
                persistence.commits += sum(c["own_commits"] for c in own)  # type: ignore[union-attr]
                persistence.failed_writes += sum(c["own_failed_writes"] for c in own)  # type: ignore[union-attr]
            if coord.error is not None:
                target.set_exception(coord.error)
            else:
                target.set_result(coord.result())

        coord.add_done_callback(done)
        for reply in counts.values():
            reply.add_done_callback(done)

    def _check(self, address: M.Address) -> None:
        if self._dead is not None:
            raise self._dead
        if self._stopped or address not in self._actors:
            raise DatabaseClosed(f"no actor at {address}")

    def offer(self, address: M.Address, message: object) -> bool:
        """Send if the window has room; False (nothing sent) if not."""
        self._check(address)
        return self.links.offer(address, message)

    def force(self, address: M.Address, message: object) -> None:
        """Send past the window, without waiting."""
        self._check(address)
        self.links.send(address, message, wait=False)

    def has_room(self, address: M.Address) -> bool:
        self._check(address)
        return self.links.has_room(address)

    def reserve(self, address: M.Address) -> None:
        """Wait for room in the window at ``address`` and hold it for one `put_reserved`."""
        self._check(address)
        self.links.wait_room(address)
        with self._waiters_lock:
            self.links.reserved[address] = self.links.reserved.get(address, 0) + 1

    def release(self, address: M.Address) -> None:
        with self._waiters_lock:
            self.links.reserved[address] = max(0, self.links.reserved.get(address, 0) - 1)

    def put_reserved(self, address: M.Address, message: object) -> None:
        self.release(address)
        self._check(address)
        self.links.send(address, message, wait=False)

    def when_room(self, address: M.Address, fn: Callable[[], None]) -> bool:
        """True if there is room now; else ``fn()`` runs once there is (on the reply
        path's thread, or at stop) and False."""
        self._check(address)
        if self.links.has_room(address):
            return True
        with self._waiters_lock:
            self._waiters.setdefault(address, []).append(fn)
        return False

    def _poll(self) -> None:
        self._call_waiters()
        self._watch()
        now = time.monotonic()
        if now >= self._next_retry and not self._stopped and self._dead is None:
            self._next_retry = now + RETRY_S
            with contextlib.suppress(Exception):  # closing
                self.links.retry()

    def _call_waiters(self, everyone: bool = False) -> None:
        with self._waiters_lock:
            if not self._waiters:
                return
            ready = [
                a for a in self._waiters if everyone or self._stopped or self.links.has_room(a)
            ]
            fns = [fn for a in ready for fn in self._waiters.pop(a)]
        for fn in fns:
            with contextlib.suppress(Exception):  # a waiter gone must not stop the path
                fn()

    def settle(self, reply: Reply, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``reply`` (the reply path settles it)."""
        return bool(reply.wait(timeout))

    def pids(self) -> dict[M.Address, int]:
        """Each actor's process id."""
        refs = {a: h.pid.remote() for a, h in self._actors.items()}
        return {a: ray.get(r) for a, r in refs.items()}

    def nodes(self) -> dict[M.Address, str]:
        """The id of the Ray node each actor runs on (hex)."""
        refs = {a: h.node.remote() for a, h in self._actors.items()}
        return {a: ray.get(r) for a, r in refs.items()}
