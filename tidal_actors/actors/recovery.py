"""Restarting a shard from durable state: the messages of the exchange and the report.

A membership or ledger shard whose handler failed unexpectedly may have half-updated
state, so its supervisor does not resume it: it rebuilds the shard from what the
store holds, through the restore step of the shard itself
(:meth:`LedgerShard.restarted <tidal_actors.actors.ledger.LedgerShard.restarted>`,
:meth:`MembershipShard.restarted <tidal_actors.actors.membership.MembershipShard.restarted>`),
and reports what was lost in a :class:`FaultReport`. The supervisors are the pykka
host (``runtime.supervision``) and the deterministic host of the test harness
(``testing.faults``); both run the same exchange and the same restore step.

What a restarted shard needs besides the store:

* A ledger shard: the purges in flight (their markers may have reached the failed
  incarnation, which held the pairs' rows for them and trimmed the log no further
  than their bounds) and, per membership shard, the newest purge that has ended (so
  a marker or an end of a purge that ended before the restart is recognised). The
  coordinator owns both and answers :class:`RecoverLedger` with a
  :class:`LedgerRecovery`; it first ends what depended on the failed incarnation's
  memory: a purge waiting for that shard's preparation is abandoned, a
  re-materialization running there fails (their callers get ``ActorFailure``), and a
  purge whose commit is under way is waited for, so the store read afterwards holds
  its tombstones.
* A membership shard: nothing; it waits until every record it numbered is committed
  (a durable barrier through the ledgers to persistence), so the record numbers read
  back from the history are never handed out again.

Then the store is read by its owner, persistence (:class:`LoadStore`: it commits
what waits first).

Restore by handshake. Where a host runs restart-safe links into the ledgers
(`runtime.links`: a sender keeps each message until it is durable at the receiver,
`actors.ledger_durability`; the deterministic test host does, for a crashed ledger
shard, and the Ray host, for a ledger whose process died: `runtime.ray_restart`),
a restarted ledger takes nothing from the failed incarnation's memory: it
restores from the store, asks the coordinator (:class:`RecoverLedger`), and then its
senders drop what the store shows survived and re-send the rest, on a new epoch of
each link, in the order first sent (`LedgerShard.restarted` with ``handshake``).
Why every purge's manifest is then exact:

1. A purge's preparation acts only once the purge's marker has come on the link
   from the user's membership shard, which sent the marker right after every
   record of the user's before the purge (FIFO per link).
2. A marker is durable at the ledger only once its purge has ended there, so for
   every purge in flight at the restart its marker is kept by its sender and comes
   again. The coordinator's answer registers those purges only to bound trimming
   (their pairs' records are not trimmed past their bounds), never as if their
   markers had come.
3. The records before such a marker on its link are either durable (their history
   batch committed: in the restored state, and the handshake drops them from the
   re-sent messages, so none is applied twice) or re-sent before the marker (a
   new epoch keeps the order of the kept messages). So when the re-sent marker is
   handled, every record the user sent before the purge is in the state, and the
   preparation that waited for it lists each one (or counts it evicted) exactly as
   without the crash.
4. A purge whose marker came before the coordinator had its request is not in the
   coordinator's answer, and needs not be: its marker is kept and re-sent too.
5. What the coordinator ends at the restart (a purge prepared there, a rebuild
   running there) is in ``ended_upto`` / ``ended_remats``: its marker, preparation,
   end or start handled again is ignored; a retraction (`ApplyPurge`) handled again
   is a no-op (the restored state, read after the commit, leaves those records out),
   and an eviction update or an abandonment of a purge that ended before the restart
   is ignored (the restored state holds that eviction state or a later one).

A ledger whose handler failed (the pykka host's supervision, and the harness's for a
handler failure) keeps its mailbox and links, and restarts as before: markers it
took are inherited (`LedgerShard.marker_notes`), the coordinator's purges in flight
registered as come: that relies on one mailbox per receiver (the purge's records
are ahead of its preparation there), as the pykka host has; FIFO per pair only
needs the handshake above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tidal_actors.actors.messages import Address, PurgeMarker, RematToken, SignalTuple
from tidal_actors.actors.reply import Reply
from tidal_actors.core.contrib_log import LogRecord

__all__ = [
    "CoordinatorLost",
    "FaultReport",
    "ForgetMarkers",
    "LedgerRecovery",
    "LoadStore",
    "MarkerCount",
    "RecoverLedger",
    "RecoverMembership",
    "SeenRecords",
]


@dataclass(frozen=True, slots=True)
class RecoverLedger:
    """Supervisor -> coordinator: ledger shard ``ledger`` restarts; ``reply`` gets a
    :class:`LedgerRecovery` once nothing the failed incarnation held is pending."""

    ledger: int
    reply: Reply


@dataclass(frozen=True, slots=True)
class LedgerRecovery:
    """What a restarting ledger shard learns from the coordinator.

    Attributes:
        in_flight: the purges in progress or waiting, as their markers.
        ended_upto: membership shard -> the marker number (``marker[1]``) of its
            newest purge that has ended (committed or abandoned); a shard's purges
            end in the order they were taken.
        failed: labels of the replies the coordinator failed because of the
            restart (a purge prepared there, a rebuild running there), for
            `FaultReport.failed`.
        ended_remats: the tokens of the re-materializations it ended because of
            the restart: a start of one still on its way to the shard is ignored.
    """

    in_flight: tuple[PurgeMarker, ...] = ()
    ended_upto: dict[int, int] = field(default_factory=dict)
    failed: tuple[str, ...] = ()
    ended_remats: tuple[RematToken, ...] = ()


@dataclass(frozen=True, slots=True)
class RecoverMembership:
    """A restarting membership shard -> coordinator (under the Ray host, whose failed
    incarnation's memory is gone: `runtime.ray_membership_restart`): the purges of
    ``mshard`` not committed are abandoned (their callers get ``ActorFailure``
    saying nothing of them was committed), one whose commit is under way is waited
    for; then every ledger is told to forget the markers of ``mshard`` numbered
    below ``below`` (`ForgetMarkers`: a marker the failed incarnation sent to a
    ledger before it died, whose purge the coordinator never got), and ``reply``
    gets None."""

    mshard: int
    below: int
    reply: Reply


@dataclass(frozen=True, slots=True)
class ForgetMarkers:
    """Coordinator -> every ledger, after `RecoverMembership`: every purge of
    membership shard ``mshard`` with a marker numbered below ``below`` has ended;
    the markers of them still held here (no end will come for them) are dropped as
    if abandoned, and later copies of such markers are ignored."""

    mshard: int
    below: int


@dataclass(frozen=True, slots=True)
class CoordinatorLost:
    """A restarting coordinator -> a ledger shard (through its mailbox, after every
    message the failed incarnation got into it): the rebuilds running here are
    dropped, and ``reply`` gets ``[(PreparePurge, Prepared), ...]``, the purges
    prepared here and not applied yet (`runtime.ray_coordinator_restart`)."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class MarkerCount:
    """A restarting coordinator -> a membership shard (through its mailbox): ``reply``
    gets the number of its newest purge marker; every purge it marks later goes to
    the new incarnation (`runtime.ray_coordinator_restart`)."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class SeenRecords:
    """A restarting membership shard -> a ledger shard (through its mailbox, after
    every message it took before): ``reply`` gets the highest record sequence
    (``rseq``) it holds from membership shard ``mshard``, durable or not (-1: none).
    The restarted shard numbers its records above every ledger's answer, so no
    number held anywhere is handed out twice (`runtime.ray_membership_restart`)."""

    mshard: int
    reply: Reply


@dataclass(frozen=True, slots=True)
class LoadStore:
    """Supervisor -> persistence: commit what waits, then ``reply`` gets ``store.load()``
    (with ``read`` false: None; a shard that reads its own part of a ``shards``
    store, `storage.shard_part`, after the writes persistence held for it)."""

    reply: Reply
    read: bool = True


@dataclass
class FaultReport:
    """What a shard failure, or an injected crash, did, for the application or the
    test to account for.

    Attributes:
        address: the actor that failed.
        action: ``"restarted"`` (rebuilt from the store), ``"resumed"`` (kept as it
            was: an actor that cannot restart, or a database with no durable
            state), ``"fenced"`` (its restart failed every time: every message to it
            fails until the database is reopened, `runtime.supervision.Fenced`), or ``"down"`` (an injected crash waiting for its restart).
        cause: the exception's ``repr`` (empty for an injected crash).
        dropped: descriptions of the messages lost (the one a handler failed on;
            for an injected crash, the mailbox and stash, in the trace's notation).
        lost_signals: signals dropped before their membership shard handled them,
            as ``(user, entity, signal_type, weight, timestamp_ns, context)``.
        lost_records: attributions dropped before their ledger shard applied them.
        failed: labels of the handles or replies that got an error because of it.
        in_doubt: labels of control operations whose write was already on its way
            to persistence; each is answered by the write's outcome on restart. Also
            a message the failure hit after part of it took effect, described, and
            then not in ``dropped``/``lost_signals``/``lost_records``: an attribution
            whose history write was sent (it is in the store, so it survives the
            restart; the flush reports no loss for it), or a signal batch some ledger
            shards got their records of before its membership shard failed (those
            records are applied, the others lost; the flush reports the batch lost).
        lost_writes: writes persistence had taken but not committed (persistence
            crash only); their writers got a ``StorageError``.
    """

    address: Address
    action: Literal["restarted", "resumed", "fenced", "down"] = "down"
    cause: str = ""
    dropped: list[str] = field(default_factory=list)
    lost_signals: list[SignalTuple] = field(default_factory=list)
    lost_records: list[LogRecord] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    in_doubt: list[str] = field(default_factory=list)
    lost_writes: int = 0
