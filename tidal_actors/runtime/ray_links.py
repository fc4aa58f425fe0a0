"""Links between Ray actors: ordered sends, a credit window, and shipping behaviours.

One Ray method per actor, ``deliver(stamp, messages)`` (`runtime.ray_actor`). A
synchronous Ray actor runs one caller's calls in submission order, so a `Links`
keeps the per sender/receiver FIFO the ordering argument needs
(docs/architecture.md) as long as the receiver lives. ``max_task_retries=0``: a
retried call could overtake later ones.

Backpressure: ``deliver`` puts each message into the receiving actor's local bounded
mailbox (`runtime.mailbox`) and returns once it is in, waiting for room as the pykka
host's senders do. A sender counts its calls not returned yet per receiver and
sends load (signal batches, attributions, history writes) only while fewer than
``WINDOW`` are outstanding, waiting with ``ray.wait`` otherwise; control traffic and
replies never wait. So what queues in Ray in front of a mailbox is at most
``WINDOW`` calls per sender: no unbounded growth.

Sequence numbers: each call carries its sender's name (``origin``) and the next
number of the link from that sender to that receiver (`runtime.links.LinkSender`);
the receiver applies only the next number, discards a duplicate and holds back a
message after a gap (`runtime.links.LinkReceiver`, in `runtime.ray_actor`), and
returns the number it has taken up to. The sender keeps each message until a
returned number covers it (read as finished calls are pruned, `Links.kept`). While
the receiver lives, Ray neither loses, duplicates nor reorders one caller's calls,
so no gap and no duplicate arises; nothing re-sends yet, as nothing restarts an
actor (docs/cluster.md).

Behaviours cross once, at start (facade -> actor) and at stop (actor -> facade), as
pickles in which the host's context, the store and the clock are named, not copied
(`dumps`, `loads`): each process puts its own in their place.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Callable
from typing import Any

import ray
from ray import cloudpickle

from tidal_actors._errors import DatabaseClosed
from tidal_actors.actors import messages as M
from tidal_actors.runtime.links import LinkSender
from tidal_actors.runtime.ray_replies import NAMESPACE, ReplyPath, sending

__all__ = ["PRUNE_AT", "WINDOW", "Links", "actor_name", "dumps", "is_load", "loads"]

WINDOW = 4
"""Load-carrying calls a sender keeps outstanding per receiver."""
PRUNE_AT = 64  # outstanding calls to one receiver before finished ones are looked for


def actor_name(db: str, address: M.Address) -> str:
    """The Ray actor name of ``address`` in database ``db`` (namespace `NAMESPACE`)."""
    return f"{db}-{address[0]}-{address[1]}"


def is_load(msg: object) -> bool:
    """Whether ``msg`` carries load (a bounded mailbox holds it back when full)."""
    t = type(msg)
    return t is M.SignalBatch or t is M.Attribute or (t is M.Write and msg.reply is None)  # type: ignore[attr-defined]


class _Pickler(cloudpickle.CloudPickler):
    def __init__(self, buf: io.BytesIO, names: dict[int, str]) -> None:
        super().__init__(buf, protocol=5)  # type: ignore[no-untyped-call]
        self._names = names

    def persistent_id(self, obj: Any) -> str | None:  # noqa: D102
        return self._names.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, buf: io.BytesIO, resolve: Callable[[str], Any]) -> None:
        super().__init__(buf)
        self._resolve = resolve

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        return self._resolve(str(pid))


def dumps(obj: object, named: dict[str, object]) -> bytes:
    """``obj`` pickled, each object of ``named`` (name -> object) left as its name."""
    buf = io.BytesIO()
    pickler = _Pickler(buf, {id(v): k for k, v in named.items() if v is not None})
    pickler.dump(obj)  # type: ignore[no-untyped-call]
    return buf.getvalue()


def loads(data: bytes, resolve: Callable[[str], Any]) -> Any:
    """What `dumps` made, each name replaced by ``resolve(name)``."""
    return _Unpickler(io.BytesIO(data), resolve).load()


class Links:
    """A process's sends to the actors of one database (thread-safe).

    Args:
        db: the database's name prefix (`actor_name`).
        stamp: returns the time to carry with each call (the sender's clock, int ns),
            or None.
        path: the facade's `ReplyPath` (None in an actor's process).
        origin: the sender's name on its links (the facade, or the actor's name).
    """

    def __init__(
        self,
        db: str,
        stamp: Callable[[], int | None],
        path: ReplyPath | None = None,
        origin: str = "facade",
    ) -> None:
        self.db = db
        self.origin = origin
        self._stamp = stamp
        self._path = path
        self._lock = threading.Lock()
        # numbering and submission of a call are one step (taken after `_lock`)
        self._seq_lock = threading.Lock()
        self._ends: dict[M.Address, LinkSender[object]] = {}
        self._handles: dict[M.Address, Any] = {}
        self._pending: dict[M.Address, list[Any]] = {}  # load calls not returned yet
        self._other: dict[M.Address, list[Any]] = {}  # other calls not returned yet
        self.reserved: dict[M.Address, int] = {}
        self.closed = False

    def handle(self, address: M.Address) -> Any:
        h = self._handles.get(address)
        if h is None:
            try:
                h = ray.get_actor(actor_name(self.db, address), namespace=NAMESPACE)
            except ValueError:
                raise DatabaseClosed(f"no actor at {address}") from None
            self._handles[address] = h
        return h

    def add(self, address: M.Address, handle: Any) -> None:
        self._handles[address] = handle

    def _submit(self, address: M.Address, msg: object) -> Any:
        if self.closed:
            raise DatabaseClosed(f"actor {address} has stopped")
        h = self.handle(address)
        with self._seq_lock:
            end = self._ends.get(address)
            if end is None:
                end = self._ends[address] = LinkSender()
            seq = end.stamp(msg)
            if self._path is not None:
                with sending(self._path):
                    return h.deliver.remote(self._stamp(), self.origin, seq, [msg])
            return h.deliver.remote(self._stamp(), self.origin, seq, [msg])

    def _prune(self, address: M.Address, refs: list[Any]) -> list[Any]:
        """The calls of ``refs`` not finished; the finished ones acknowledge."""
        if not refs:
            return refs
        done, left = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        if done:
            try:
                upto = max(ray.get(done, timeout=0))
            except Exception:  # noqa: BLE001 - a failed call acknowledges nothing
                return left
            with self._seq_lock:
                end = self._ends.get(address)
                if end is not None and upto < end.next_seq:
                    end.ack(upto)
        return left

    def kept(self, address: M.Address) -> int:
        """Messages sent to ``address`` and not acknowledged yet (finished calls are
        read first)."""
        with self._lock:
            self._pending[address] = self._prune(address, self._pending.get(address, []))
            self._other[address] = self._prune(address, self._other.get(address, []))
        with self._seq_lock:
            end = self._ends.get(address)
            return 0 if end is None else len(end)

    def outstanding(self, address: M.Address) -> int:
        """Load calls to ``address`` not returned yet, plus the room reserved there."""
        with self._lock:
            refs = self._pending.get(address, [])
            if refs:
                refs = self._pending[address] = self._prune(address, refs)
            return len(refs) + self.reserved.get(address, 0)

    def has_room(self, address: M.Address) -> bool:
        return self.outstanding(address) < WINDOW

    def wait_room(self, address: M.Address, extra: int = 0) -> None:
        """Wait until fewer than ``WINDOW - extra`` load calls to ``address`` are out."""
        while True:
            with self._lock:
                refs = list(self._pending.get(address, []))
                limit = WINDOW - extra - self.reserved.get(address, 0)
                if len(refs) < max(1, limit):
                    return
            ray.wait(refs, num_returns=len(refs) - max(1, limit) + 1, fetch_local=False)
            with self._lock:
                self._pending[address] = self._prune(address, self._pending.get(address, []))

    def send(self, address: M.Address, msg: object, wait: bool = True) -> None:
        """Send ``msg``; a load message first waits for the window (unless not ``wait``)."""
        if is_load(msg):
            if wait:
                self.wait_room(address)
            ref = self._submit(address, msg)
            with self._lock:
                self._pending.setdefault(address, []).append(ref)
            return
        ref = self._submit(address, msg)
        with self._lock:
            refs = self._other.setdefault(address, [])
            refs.append(ref)
            if len(refs) >= PRUNE_AT:
                self._other[address] = self._prune(address, refs)

    def offer(self, address: M.Address, msg: object) -> bool:
        """Send ``msg`` if the window has room; False (nothing sent) if not."""
        with self._lock:
            refs = self._pending.get(address, [])
            if len(refs) + self.reserved.get(address, 0) >= WINDOW:
                refs = self._pending[address] = self._prune(address, refs)
                if len(refs) + self.reserved.get(address, 0) >= WINDOW:
                    return False
            ref = self._submit(address, msg)
            self._pending.setdefault(address, []).append(ref)
        return True

    def drain(self, timeout: float | None = None) -> None:
        """Wait for every call sent so far to return (errors of stopped receivers ignored)."""
        with self._lock:
            refs = [r for rs in self._pending.values() for r in rs]
            refs += [r for rs in self._other.values() for r in rs]
            self._pending.clear()
            self._other.clear()
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=False)
