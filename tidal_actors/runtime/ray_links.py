"""Links between Ray actors: ordered sends and a credit window.

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

Sequence numbers: each call carries its sender's name (``origin``), the epoch of
the receiver's incarnation it is numbered for, and the next number of the link from
that sender to that receiver (`runtime.links.LinkSender`); the receiver applies only
the next number, discards a duplicate and holds back a message after a gap
(`runtime.links.LinkReceiver`, in `runtime.ray_actor`), discards a call numbered for
another epoch, and returns ``(epoch, applied, durable)``: the number it has taken up
to and, on a restart-safe link, the numbers of messages durable there since its last
return to that sender. The sender keeps each message until a returned number covers
it (read as finished calls are pruned, `Links.kept`), or on a restart-safe link (into
a ledger of a durable database) until it is reported durable. While the receiver
lives, Ray neither loses, duplicates nor reorders one caller's calls, so no gap and
no duplicate arises. When a ledger's process dies, Ray restarts it and it restores by
handshake (`runtime.ray_restart`): `Links.restarted` drops what survived there and
re-sends the rest on the new epoch, numbered afresh.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ray

from tidal_actors._errors import ActorFailure, DatabaseClosed
from tidal_actors.actors import messages as M
from tidal_actors.actors.reply import Reply
from tidal_actors.runtime.links import LinkSender
from tidal_actors.runtime.ray_in_flight import InFlight
from tidal_actors.runtime.ray_replies import NAMESPACE, ReplyPath, sending
from tidal_actors.runtime.ray_restart import CoordinatorRestart, LedgerRestart, MembershipRestart

__all__ = ["NOTICES", "PRUNE_AT", "RETRY_S", "WINDOW", "Links", "actor_name", "is_load"]

NOTICES = (LedgerRestart, MembershipRestart, CoordinatorRestart)
"""The restart notices (host level: `Links.restarted` takes them)."""

WINDOW = 4
"""Load-carrying calls a sender keeps outstanding per receiver."""
RETRY_S = 0.2
"""How often a sender reads its finished calls and re-sends after a failed one (s)."""
PRUNE_AT = 64  # outstanding calls to one receiver before finished ones are looked for


def actor_name(db: str, address: M.Address) -> str:
    """The Ray actor name of ``address`` in database ``db`` (namespace `NAMESPACE`)."""
    return f"{db}-{address[0]}-{address[1]}"


def is_load(msg: object) -> bool:
    """Whether ``msg`` carries load (a bounded mailbox holds it back when full)."""
    t = type(msg)
    return t is M.SignalBatch or t is M.Attribute or (t is M.Write and msg.reply is None)  # type: ignore[attr-defined]


class Links:
    """A process's sends to the actors of one database (thread-safe).

    Args:
        db: the database's name prefix (`actor_name`).
        stamp: returns the time to carry with each call (the sender's clock, int ns),
            or None.
        path: the facade's `ReplyPath` (None in an actor's process).
        origin: the sender's name on its links (the facade, or the actor's name).
        opened: the epoch of every receiver's first incarnation (int ns).
        restart_safe: whether the links into an address keep each message until it
            is durable there (a ledger of a durable database).
        followed: whether the replies of the calls into an address are followed, to
            be failed if it restarts (`restarted`; the facade's links into the
            membership shards of a durable database).

    Attributes:
        in_flight: the calls followed (`ray_in_flight.InFlight`).
    """

    def __init__(
        self,
        db: str,
        stamp: Callable[[], int | None],
        path: ReplyPath | None = None,
        origin: str = "facade",
        opened: int = 0,
        restart_safe: Callable[[M.Address], bool] = lambda address: False,
        followed: Callable[[M.Address], bool] = lambda address: False,
    ) -> None:
        self.db = db
        self.origin = origin
        self.opened = opened
        self._restart_safe = restart_safe
        self._epochs: dict[M.Address, int] = {}  # receivers restarted: their epoch
        self._failed: set[M.Address] = set()  # a call to it failed since the last `retry`
        self.resent = 0  # messages sent again (after a failed call or a restart)
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
        self._followed = followed
        self.in_flight = InFlight()

    def epoch(self, address: M.Address) -> int:
        """The epoch (int ns) of ``address``'s incarnation these links number for."""
        return self._epochs.get(address, self.opened)

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
        why = None
        with self._seq_lock:
            end = self._ends.get(address)
            if end is None:
                end = self._ends[address] = LinkSender(self._restart_safe(address))
            if self._followed(address):
                why = self.in_flight.sent(address, msg)
            ref = self._call(h, address, end.stamp(msg), msg)
        if why is not None:  # settled outside the lock: its callbacks may send
            msg.reply.set_exception(ActorFailure(why))  # type: ignore[attr-defined]
        return ref

    def _call(self, h: Any, address: M.Address, seq: int, msg: object) -> Any:
        """One ``deliver`` call (under ``_seq_lock``: numbering and submission are one
        step, so Ray's per-caller order is the numbering's)."""
        epoch = self._epochs.get(address, self.opened)
        if self._path is not None:
            with sending(self._path):
                return h.deliver.remote(self._stamp(), self.origin, epoch, seq, [msg])
        return h.deliver.remote(self._stamp(), self.origin, epoch, seq, [msg])

    def _prune(self, address: M.Address, refs: list[Any]) -> list[Any]:
        """The calls of ``refs`` not finished; the finished ones acknowledge (those
        numbered for the receiver's current epoch)."""
        if not refs:
            return refs
        done, left = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        returns = []
        for ref in done:
            try:
                returns.append(ray.get(ref, timeout=0))
            except Exception:  # noqa: BLE001 - a failed call acknowledges nothing
                self._failed.add(address)  # and its message may be lost: `retry`
                continue
        if returns:
            with self._seq_lock:
                end = self._ends.get(address)
                epoch = self._epochs.get(address, self.opened)
                mine = [r for r in returns if r is not None and r[0] == epoch]
                if end is not None and mine:
                    upto = max(r[1] for r in mine)
                    if upto < end.next_seq:
                        end.ack(upto)
                    durable = [seq for r in mine for seq in r[2] if seq <= end.acked]
                    if durable:
                        end.settle(durable)
        return left

    def retry(self) -> int:
        """Read the finished calls to every receiver; where one failed (the receiver's
        process died, or a call to its restarted process was lost), send every
        message not acknowledged again (`runtime.links`, rule 4: the receiver
        discards what it has). Called every `RETRY_S` by each process's sender.
        Returns the messages sent again."""
        with self._lock:
            for address in list(self._pending):
                self._pending[address] = self._prune(address, self._pending[address])
            for address in list(self._other):
                self._other[address] = self._prune(address, self._other[address])
            failed, self._failed = self._failed, set()
        n = 0
        for address in failed:
            if self.closed:
                return n
            h = self.handle(address)
            with self._seq_lock:
                end = self._ends.get(address)
                items = [] if end is None else end.resend()
                refs = [self._call(h, address, seq, m) for seq, m in items]
            with self._lock:
                self._other.setdefault(address, []).extend(refs)
            self.resent += len(refs)
            n += len(refs)
        return n

    def restarted(self, notice: LedgerRestart | MembershipRestart | CoordinatorRestart) -> int:
        """Restore by handshake with the restarted receiver ``notice.address``
        (`runtime.links`, rule 6): of what its link keeps, drop what survived there
        (`LedgerRestart.survived`), and send the rest again on its new epoch,
        numbered afresh from 1 in their order. A restarted membership shard gets
        nothing again (`restarted_membership`). A notice of an epoch not newer than
        the one this link numbers for is ignored. Returns the messages sent again."""
        if isinstance(notice, MembershipRestart):
            self.restarted_membership(notice)
            return 0
        address = notice.address
        if self.closed:
            return 0
        h = self.handle(address)
        with self._seq_lock:
            epoch = self._epochs.get(address, self.opened)
            if notice.epoch <= epoch:
                return 0
            self._epochs[address] = notice.epoch
            end = self._ends.get(address)
            if end is None:
                return 0
            drop = {s for s, m in end.kept() if notice.survived(self.origin, epoch, s, m)}
            end = self._ends[address] = end.renumbered(drop)
            refs = [self._call(h, address, seq, m) for seq, m in end.unacked()]
        self.resent += len(refs)
        with self._lock:
            self._other.setdefault(address, []).extend(refs)
        return len(refs)

    def restarted_membership(self, notice: MembershipRestart) -> list[Reply]:
        """The membership shard ``notice.address`` restarted from the store: from now
        on calls go to its new epoch, numbered from 1; what the link kept for the
        failed incarnation is dropped (`ray_membership_restart`), but the restart
        notices (of a ledger, the coordinator, another membership shard restarted
        meanwhile), sent again on the new epoch. Returns the
        replies of the calls sent to it and not answered (followed links only: the
        caller fails them), and notes that the next flush through it fails if
        signals were sent to it since the last flush (`InFlight`). A notice of an epoch not newer
        than the one the link numbers for changes nothing."""
        address = notice.address
        if self.closed:
            return []
        h = self.handle(address)
        refs: list[Any] = []
        with self._seq_lock:
            if notice.epoch <= self._epochs.get(address, self.opened):
                return []
            self._epochs[address] = notice.epoch
            end = self._ends.get(address)
            if end is not None:
                # restart notices are all it gets again: the new incarnation must
                # number its calls for the current incarnations of the actors that
                # restarted with it (`ray_restoring`)
                notices = [m for _, m in end.kept() if type(m) in NOTICES]
                end = self._ends[address] = LinkSender(end.durable_acks)
                refs = [self._call(h, address, end.stamp(m), m) for m in notices]
                self.resent += len(refs)
            replies = self.in_flight.restarted(address)
        if refs:
            with self._lock:
                self._other.setdefault(address, []).extend(refs)
        return replies

    def restarted_coordinator(self, notice: CoordinatorRestart) -> list[Reply]:
        """The coordinator restarted (`ray_coordinator_restart`): what its link keeps
        is sent again on its new epoch (`restarted`); returns the replies of the calls
        followed into it and of the purge requests followed into the membership
        shards, not answered (the caller fails them)."""
        self.restarted(notice)
        with self._seq_lock:
            return self.in_flight.coordinator_restarted(notice.address)

    def known_epochs(self) -> dict[M.Address, int]:
        """The epochs of the receivers that restarted, as these links number for them."""
        with self._seq_lock:
            return dict(self._epochs)

    def adopt_epochs(self, epochs: dict[M.Address, int]) -> None:
        """Number for the receivers' incarnations in ``epochs`` (a restarted sender
        learns them from an actor that heard every restart's notice), where newer."""
        with self._seq_lock:
            for address, epoch in epochs.items():
                if epoch > self._epochs.get(address, self.opened):
                    self._epochs[address] = epoch

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
