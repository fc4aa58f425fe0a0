"""A ledger actor restarted in place under the Ray host: restore by handshake.

A ledger shard's Ray actor of a durable database has ``max_restarts`` (Ray re-runs
its constructor in a new process when the process dies, `LEDGER_RESTARTS` times at
most). The new incarnation takes nothing from the old one's memory: it restores
from the store and the coordinator's answer, and the senders re-send what did not
survive, as the deterministic test host restores a crashed ledger
(`actors.recovery`, "Restore by handshake"; `testing.sim_links`). The pieces:

* **Epochs.** Every call carries the epoch of the receiver's incarnation the sender
  numbers for (the database's open time in ns for the first incarnation, the
  restart's wall time in ns after a restart); a ledger discards a call numbered
  for another epoch. So a message numbered for the failed incarnation never mixes
  with the new numbering.
* **Durable acknowledgements** (`runtime.links`, rule 5). Links into a ledger of a
  durable database keep each message until the ledger reports it durable: after
  handling it the ledger's actor asks the shard what it waits for
  (`LedgerShard.durability`), and reports it with the return of a later call from
  the same sender once that has happened (`LedgerShard.durable`; `DurableEnds`).
* **The link state in the store.** The history batch an attribution makes is
  written with the number of that attribution on its link (`Tag.LINK_STATE`: per
  ledger shard and sender, ``[epoch, seq]`` of the last one, in the batch's
  transaction). An attribution's report may die with the process; the store still
  says whether its batch committed. Attributions the mailbox merged into one
  message make one batch, written with the highest of their numbers
  (`DurableEnds.merged`).
* **The restart** (`restore`): the new incarnation fences the failed one's sends
  still on their way to the coordinator and persistence (`Fences`), asks the
  coordinator (`RecoverLedger`), reads its own environment and the coordinator's
  records (`storage.shard_part`; in the ``single`` layout, or a store whose
  history is not its own, persistence commits what waits and reads the whole store:
  `LoadStore`), restores (`supervision.restore_ledger` with ``handshake``),
  reads its links' states, and tells every other actor and the facade
  (`LedgerRestart`). Each sender then drops what survived (`LedgerRestart.survived`:
  an attribution whose batch is in the store; a purge's marker whose purge ended,
  `ledger_durability.ended_before`) and re-sends the rest on the new epoch,
  numbered afresh from 1 in their order (`ray_links.Links.restarted`).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.ledger_durability import Token, ended_before
from tidal_actors.actors.recovery import FaultReport, LoadStore, RecoverLedger
from tidal_actors.runtime.ray_asks import ask, call, fence
from tidal_actors.runtime.ray_replies import send_fault
from tidal_actors.runtime.supervision import restore_ledger
from tidal_actors.storage.format import Keyspace, Tag, decode_key, decode_link_state
from tidal_actors.storage.layout import ledger_env
from tidal_actors.storage.shard_part import ledger_part

__all__ = [
    "LEDGER_RESTARTS",
    "CoordinatorRestart",
    "DurableEnds",
    "Fences",
    "LedgerRestart",
    "MembershipRestart",
    "announce",
    "link_states",
    "origin_epoch",
    "restore",
    "track",
]

LEDGER_RESTARTS = 1000
"""How many times Ray restarts a ledger actor of a durable database."""


def origin_epoch(origin: str) -> tuple[str, int]:
    """A sender's name on its links, split: ``"ledger-0@<epoch>"`` -> ``("ledger-0",
    epoch)``; a name without ``@`` has epoch 0."""
    name, _, epoch = origin.partition("@")
    return name, int(epoch) if epoch else 0


@dataclass(frozen=True, slots=True)
class LedgerRestart:
    """A restarted ledger -> every other actor and the facade (host level).

    Attributes:
        address: the ledger's address.
        epoch: its new incarnation's epoch (int ns).
        committed: sender name -> ``(epoch, seq)`` of the last attribution from it
            whose history batch the store holds (`Tag.LINK_STATE`).
        ended_upto: the coordinator's `LedgerRecovery.ended_upto` (membership shard
            -> the marker number of its newest purge ended).
    """

    address: M.Address
    epoch: int
    committed: dict[str, tuple[int, int]] = field(default_factory=dict)
    ended_upto: dict[int, int] = field(default_factory=dict)

    def survived(self, sender: str, epoch: int, seq: int, message: object) -> bool:
        """Whether message ``seq`` of ``sender``'s link in ``epoch``, kept as not yet
        durable, had its effect restored: an attribution whose batch committed, a
        purge's marker whose purge ended. Anything else is sent again (a copy of a
        message durable at once is a no-op there, `actors.recovery` item 5)."""
        if type(message) is M.Attribute:
            top = self.committed.get(sender)
            return top is not None and top[0] == epoch and seq <= top[1]
        if type(message) is M.PurgeMarker:
            return ended_before(self.ended_upto, message.marker)
        return False


@dataclass(frozen=True, slots=True)
class MembershipRestart:
    """A restarted membership shard -> every other actor and the facade (host level).

    Nothing kept for the failed incarnation is sent again: its senders drop what
    they keep for it, and the facade fails the calls in flight to it, saying they
    may have been applied (`runtime.ray_membership_restart`).

    Attributes:
        address: the shard's address.
        epoch: its new incarnation's epoch (int ns).
    """

    address: M.Address
    epoch: int


@dataclass(frozen=True, slots=True)
class CoordinatorRestart:
    """The restarted coordinator -> every other actor and the facade (host level):
    the links into it send again, on its new ``epoch``, what they keep (what the
    failed incarnation had not taken)."""

    address: M.Address
    epoch: int

    def survived(self, sender: str, epoch: int, seq: int, message: object) -> bool:
        return False  # nothing kept reached it: each is sent again


def link_states(store: Any, shard: int) -> dict[str, tuple[int, int]]:
    """Sender name -> ``(epoch, seq)`` from ledger ``shard``'s LINK_STATE records.

    Raises:
        StorageError: the store cannot be read.
    """
    out: dict[str, tuple[int, int]] = {}
    envs = getattr(store, "envs", None)  # the shards layout: the ledger's own environment
    own = envs[ledger_env(shard)] if envs is not None else store
    for key, value in own.scan(Keyspace.META):
        ident, tag, suffix = decode_key(key)
        if tag == Tag.LINK_STATE and ident == shard:
            out[suffix.decode("utf-8")] = decode_link_state(value)
    return out


class DurableEnds:
    """A ledger actor's receiving side of durable acknowledgements (thread-safe).

    ``taken`` (the Ray thread) tags a message with its link and number before it
    enters the mailbox; ``merged`` (the mailbox, as the behaviour's thread takes a
    merged message out: `runtime.mailbox.Mailbox.on_merge`) gives the message it
    made of several the tags of all of them, in order, since handling it is
    handling them (`mailbox.coalesce`); ``begin`` / ``end`` (the behaviour's
    thread) bracket its handling (``current`` is meanwhile, for an attribution,
    ``[(sender, seq)]`` of the highest number per sender among its tags: the
    history write it makes carries them, `Tag.LINK_STATE`); ``report`` (the Ray
    thread) returns the numbers of a sender's messages durable since the last
    report.

    A tag holds its message, so no other message can take its ``id`` while the tag
    waits (a merged message is a new object; its parts' ids are free once merged).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tags: dict[int, tuple[object, list[tuple[str, int]]]] = {}
        self._waiting: dict[str, dict[int, Token]] = {}
        self._ready: dict[str, list[int]] = {}
        self._handling: list[tuple[str, int]] = []
        self.current: list[tuple[str, int]] = []

    def taken(self, origin: str, seq: int, message: object) -> None:
        with self._lock:
            self._tags[id(message)] = (message, [(origin, seq)])

    def merged(self, parts: list[object], message: object) -> None:
        """``message`` stands for ``parts`` (in order) from now on: it takes their tags."""
        with self._lock:
            tags: list[tuple[str, int]] = []
            for part in parts:
                entry = self._tags.pop(id(part), None)
                if entry is not None and entry[0] is part:
                    tags += entry[1]
            if tags:
                self._tags[id(message)] = (message, tags)

    def now(self, origin: str, seq: int) -> None:
        """Message ``seq`` from ``origin`` is durable at once (a host-level message)."""
        with self._lock:
            self._ready.setdefault(origin, []).append(seq)

    def begin(self, message: object) -> None:
        with self._lock:
            entry = self._tags.pop(id(message), None)
            tags = entry[1] if entry is not None and entry[0] is message else []
            self._handling = tags
            if type(message) is M.Attribute and tags:
                top: dict[str, int] = {}
                for origin, seq in tags:
                    if seq > top.get(origin, 0):
                        top[origin] = seq
                self.current = list(top.items())
            else:
                self.current = []

    def end(self, token: Token | None) -> None:
        with self._lock:
            tags, self._handling, self.current = self._handling, [], []
            for origin, seq in tags:
                if token is None:
                    self._ready.setdefault(origin, []).append(seq)
                else:
                    self._waiting.setdefault(origin, {})[seq] = token

    def report(self, origin: str, durable: Callable[[Token], bool]) -> list[int]:
        with self._lock:
            out = self._ready.pop(origin, [])
            waiting = self._waiting.get(origin)
            if waiting:
                done = [seq for seq, token in waiting.items() if durable(token)]
                for seq in done:
                    del waiting[seq]
                out += done
            return out


class Fences:
    """The epochs below which a restarted ledger's earlier incarnations are fenced
    at a receiver: their calls still on the way are discarded."""

    def __init__(self) -> None:
        self._floor: dict[str, int] = {}

    def fence(self, name: str, epoch: int) -> None:
        if epoch > self._floor.get(name, 0):
            self._floor[name] = epoch

    def floor(self, name: str) -> int:
        """The epoch below which ``name``'s incarnations are fenced (0: none)."""
        return self._floor.get(name, 0)

    def fenced(self, origin: str) -> bool:
        name, epoch = origin_epoch(origin)
        floor = self._floor.get(name)
        return floor is not None and epoch < floor


def restore(actor: Any) -> tuple[Behaviour, LedgerRestart]:
    """The new incarnation of the ledger hosted by ``actor`` (a `ShardActor` whose
    constructor Ray re-runs; run on its restore thread, `ray_restoring`): the failed incarnation's sends to the coordinator and
    persistence fenced, its links numbering for the incarnations that restarted
    before (from persistence: a new incarnation's calls numbered for a failed one's
    epoch are dropped), the coordinator asked (`RecoverLedger`), the store read once
    persistence committed what waits (`LoadStore`), restored by handshake; and the
    notice for its senders. A `FaultReport` ("restarted", its ``cause`` saying how
    long the restore took) goes to the facade.

    Raises:
        ActorFailure, StorageError: the restart failed (Ray restarts it again).
    """
    started = time.monotonic()
    i, cfg, links = actor.address[1], actor._config, actor.links
    fence(actor, [M.COORD_ADDR, M.PERSIST_ADDR], f"{M.LEDGER}-{i}")
    # the coordinator and membership shards restarted before (their notices went to
    # the failed incarnation): persistence heard every notice
    links.adopt_epochs(call(links.handle(M.PERSIST_ADDR).known_epochs.remote))
    recovery = ask(links.handle(M.COORD_ADDR), functools.partial(RecoverLedger, i), "recover")
    store = actor._resolve("store")
    restored = _own_part(actor, store) if actor.host.commit_history is not None else None
    source = "its own environment and the coordinator's records"
    if restored is None:
        source = "the whole store"
        # in the shards layout the failed incarnation wrote its own environment and
        # may have died inside a commit: persistence takes over its writes before it
        # reads (`Persistence._on_load`), else the restore would miss that batch and
        # number its next one as it, overwriting it, while the link state read below
        # says it is held
        restored = ask(links.handle(M.PERSIST_ADDR), LoadStore, "load-store")
    new = restore_ledger(cfg, actor.host.ctx, restored, store, i, recovery, None, (), True)
    notice = LedgerRestart(actor.address, actor.epoch, link_states(store, i), recovery.ended_upto)
    took = time.monotonic() - started
    cause = f"its process died (restored from {source} in {took:.3f} s)"
    send_fault(
        actor.sink, FaultReport(actor.address, "restarted", cause, failed=[*recovery.failed])
    )
    return new, notice


def _own_part(actor: Any, store: Any) -> Any:
    """The restarting ledger's part of a ``shards`` store: its own environment (its
    writes taken over first: the failed incarnation may have died inside a commit,
    and the restore must not miss that batch and number its next one as it) merged
    with the coordinator's records (`storage.shard_part`); None when the store's
    history is not self-contained (the whole store is read instead)."""
    part = call(actor.links.handle(M.COORD_ADDR).coordinator_part.remote)
    if part is None:
        return None
    return ledger_part(store, actor.address[1], part, actor._config.ledger_shards)


def announce(actor: Any, notice: LedgerRestart | MembershipRestart | CoordinatorRestart) -> None:
    """Tell every other actor of the database and the facade (by its sink, as a
    fault) that the shard ``actor`` hosts restarted."""
    cfg = actor._config
    addresses = [(M.MEMBERSHIP, i) for i in range(cfg.membership_shards)]
    addresses += [(M.LEDGER, i) for i in range(cfg.ledger_shards)]
    for address in [*addresses, M.COORD_ADDR, M.PERSIST_ADDR]:
        if address != actor.address:
            actor.links.send(address, notice)
    send_fault(actor.sink, notice)


def track(ends: DurableEnds, behaviour: Behaviour) -> None:
    """Note in ``ends``, for each message ``behaviour`` handles, what it waits for to
    be durable (`LedgerShard.durability`)."""
    receive = behaviour.receive
    durability = getattr(behaviour, "durability", lambda message: None)

    def tracked(message: object) -> None:
        ends.begin(message)
        token = None
        try:
            receive(message)
            token = durability(message)
        finally:
            ends.end(token)

    behaviour.receive = tracked  # type: ignore[method-assign]
