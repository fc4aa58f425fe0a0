"""Messages exchanged between actors: immutable dataclasses, one per intent.

Owns the protocol only. Addresses are ``(kind, index)`` tuples: ``("membership", i)``,
``("ledger", i)``, ``("coordinator", 0)``, ``("persistence", 0)``. Hot-path batches
carry plain tuples (`SignalBatch`) or numpy columns (`Attribute`), not one object per
signal (DESIGN.md "What things cost here").

The purge protocol's messages live in `actors.messages_purge`, the
re-materialization's in `actors.messages_remat`; both are re-exported here, so
``messages.X`` names every message.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tidal_actors.actors.messages_purge import (
    ApplyPurge,
    EvictionUpdate,
    Marker,
    PreparePurge,
    Purge,
    PurgeAbandoned,
    PurgeMarker,
    PurgePrepared,
    PurgeRequest,
    QueryPurge,
)
from tidal_actors.actors.messages_remat import (
    EraseHistory,
    RematAbort,
    RematDone,
    Rematerialize,
    RematStart,
    RematStep,
    RematToken,
    ResumeRematerialization,
    Tick,
)
from tidal_actors.actors.reply import Reply
from tidal_actors.core.contrib_log import LogRecord

__all__ = [
    "COORDINATOR",
    "COORD_ADDR",
    "LEDGER",
    "MEMBERSHIP",
    "PERSISTENCE",
    "PERSIST_ADDR",
    "Address",
    "ApplyPurge",
    "Assign",
    "Attribute",
    "Barrier",
    "BarrierPart",
    "Column",
    "Committed",
    "Compact",
    "Drain",
    "EraseHistory",
    "EvictionUpdate",
    "FlushStore",
    "Leave",
    "Marker",
    "PreparePurge",
    "Publish",
    "Purge",
    "PurgeAbandoned",
    "PurgeMarker",
    "PurgePrepared",
    "PurgeRequest",
    "QueryManifests",
    "QueryPurge",
    "QueryUser",
    "Read",
    "Rejoin",
    "RematAbort",
    "RematDone",
    "RematStart",
    "RematStep",
    "RematToken",
    "Rematerialize",
    "ResumeRematerialization",
    "SignalBatch",
    "SignalTuple",
    "Tick",
    "Unassign",
    "Write",
    "column_list",
]

Address = tuple[str, int]
MEMBERSHIP, LEDGER, COORDINATOR, PERSISTENCE = "membership", "ledger", "coordinator", "persistence"
COORD_ADDR: Address = (COORDINATOR, 0)
PERSIST_ADDR: Address = (PERSISTENCE, 0)

# one signal on the wire: (user, entity, signal_type, weight_f32, ts_ns, context msgpack bytes|None)
SignalTuple = tuple[int, int, int, float, int, Any]


@dataclass(frozen=True, slots=True)
class SignalBatch:
    """Facade -> membership: signals in submission order. ``batches``: how many
    batches the facade sent that this message holds (more than 1 once a mailbox
    merged them, `runtime.mailbox.coalesce`): a failure loses that many."""

    signals: list[SignalTuple]
    batches: int = 1


@dataclass(frozen=True, slots=True)
class Assign:
    user: int
    cohort: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class Unassign:
    user: int
    cohort: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class Leave:
    user: int
    now_ns: int
    reply: Reply


@dataclass(frozen=True, slots=True)
class Rejoin:
    user: int
    now_ns: int
    reply: Reply


@dataclass(frozen=True, slots=True)
class QueryUser:
    """kind: "status" | "history" | "cohorts"."""

    user: int
    kind: str
    reply: Reply


Column = list[Any] | np.ndarray
"""An `Attribute` column: a numpy array, or a list of Python numbers (a small batch)."""


def column_list(col: Column) -> list[Any]:
    """An `Attribute` column as a list of Python numbers (the list itself if it is one)."""
    return col if type(col) is list else col.tolist()  # type: ignore[union-attr]


@dataclass(frozen=True, slots=True)
class Attribute:
    """Membership -> ledger: one membership shard's records, in attribution order, as
    columns (so the ledger never transposes per record).

    ``rseqs`` (int64) increase; ``users``, ``entities``, ``types`` are uint64;
    ``weights`` float64 holding float32 values; ``timestamps`` int64 ns; ``cohorts``
    a list of names. Each numeric column is a numpy array of that dtype or, for the
    few records of a small signal batch (`membership_fanout.FEW_SIGNALS`), a list of Python
    ints or floats holding the same values (`Column`; numpy's cost a call outweighs
    the work there, and the ledger's per-record fold reads Python numbers).
    ``contexts`` maps a record's index in the batch to its context's
    msgpack bytes (packed at the call, `core.validate.check_context`). ``batches``:
    how many of the facade's signal batches these records come from (the
    `SignalBatch.batches` they were attributed from, summed where a mailbox merged
    attributions): a failure loses that many.
    """

    mshard: int
    rseqs: Column
    users: Column
    cohorts: list[str]
    entities: Column
    types: Column
    weights: Column
    timestamps: Column
    contexts: dict[int, bytes] | None = None
    batches: int = 1

    def __len__(self) -> int:
        return len(self.cohorts)

    @property
    def records(self) -> list[LogRecord]:
        """The records one by one (for traces and tests; the hot path reads columns)."""
        return [
            LogRecord(self.mshard, r, u, c, e, t, w, ts)
            for r, u, c, e, t, w, ts in zip(
                column_list(self.rseqs),
                column_list(self.users),
                self.cohorts,
                column_list(self.entities),
                column_list(self.types),
                column_list(self.weights),
                column_list(self.timestamps),
            )
        ]

    @classmethod
    def of_records(
        cls, records: list[LogRecord], contexts: dict[int, Any] | None = None
    ) -> Attribute:
        """The message carrying ``records`` (all from one membership shard)."""
        ms, rs, us, cs, es, ts_, ws, tss = zip(*records)
        if len(set(ms)) != 1:
            raise ValueError(
                f"records from membership shards {sorted(set(ms))}: one message holds one shard's"
            )
        return cls(
            ms[0],
            np.array(rs, dtype=np.int64),
            np.array(us, dtype=np.uint64),
            list(cs),
            np.array(es, dtype=np.uint64),
            np.array(ts_, dtype=np.uint64),
            np.array(ws, dtype=np.float64),
            np.array(tss, dtype=np.int64),
            contexts,
        )


@dataclass(frozen=True, slots=True)
class Read:
    """kind: "score" | "window" | "top" | "rows" | "key_counts" | "stats"; args per kind."""

    kind: str
    args: tuple[Any, ...]
    reply: Reply


_barrier_ids = itertools.count(1)


def _next_barrier_id() -> int:
    return next(_barrier_ids)


@dataclass(frozen=True, slots=True, eq=False)
class Barrier:
    """Travels membership -> ledgers (-> persistence); the action runs once every
    membership shard's part has reached a ledger, so everything sent before it has
    been applied there (FIFO per sender/receiver pair).

    ``action`` is a :class:`Read` run at the single target ledger, or None for a sync
    of ``ledgers`` that replies once all of them are reached (persistence counts
    them; with ``durable`` it first commits everything sent before, then sends
    ``then``, an ``(address, message)``, if given).

    A barrier holds no shared mutable state: each receiver counts the parts it got
    by ``barrier_id`` (unique in the process), and the losses it reports travel in
    the parts (:class:`BarrierPart`), so a copy of it serves as well as the object.
    """

    ledgers: tuple[int, ...]
    parts: int
    reply: Reply
    action: Read | None = None
    durable: bool = False
    then: tuple[Address, object] | None = None
    # a flush's (and close's) barrier: the shards report the signals they lost
    reports_loss: bool = False
    barrier_id: int = field(default_factory=_next_barrier_id)

    def __repr__(self) -> str:
        kind = self.action.kind if self.action else ("flush" if self.durable else "sync")
        return f"Barrier({kind}, ledgers={list(self.ledgers)})"


@dataclass(frozen=True, slots=True)
class BarrierPart:
    """One sender's part of ``barrier``, with the losses it reports: signals lost on
    their way (a handler failed on their batch) at the senders so far, said to the
    caller of a barrier that ``reports_loss``."""

    barrier: Barrier
    lost: tuple[BaseException, ...] = ()


@dataclass(frozen=True, slots=True)
class Write:
    """Ops: ``(keyspace, key, value)``; value None deletes. Reply: a Reply, or an
    ``(address, token)`` to which a :class:`Committed` is told, or None. ``ahead``:
    it depends on no write queued before it, so persistence may commit it first
    (`Persistence`; a membership shard's control write, `ControlWrites._write`)."""

    ops: list[tuple[str, bytes, bytes | None]]
    reply: Any = None
    ahead: bool = False


@dataclass(frozen=True, slots=True)
class Committed:
    """Persistence -> a writer: the write ``token`` committed (``error`` None) or
    failed with ``error``; ``more``: the tokens of further writes of the same writer
    that the same commit carried with the same outcome, in the order sent (control
    writes, ``Write.ahead``: one message per commit per membership shard)."""

    token: Any
    error: BaseException | None = None
    more: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class FlushStore:
    reply: Reply


@dataclass(frozen=True, slots=True)
class QueryManifests:
    user: int
    reply: Reply


@dataclass(frozen=True, slots=True)
class Compact:
    """Facade -> persistence: commit, then rewrite the environment compactly."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class Publish:
    """Facade -> ledger, from the flusher thread: publish the changes not yet in the
    shard's view (`actors.ledger_views`)."""


@dataclass(frozen=True, slots=True)
class Drain:
    """Facade -> coordinator at close: reply once no purge is in flight or waiting."""

    reply: Reply
