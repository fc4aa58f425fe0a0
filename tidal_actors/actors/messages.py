"""Messages exchanged between actors: immutable dataclasses, one per intent.

Owns the protocol only. Addresses are ``(kind, index)`` tuples: ``("membership", i)``,
``("ledger", i)``, ``("coordinator", 0)``, ``("persistence", 0)``. Hot-path batches
carry plain tuples (`SignalBatch`) or numpy columns (`Attribute`), not one object per
signal (DESIGN.md "What things cost here").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tidal_actors.actors.reply import Reply
from tidal_actors.core.contrib_log import LogRecord, Prepared

Address = tuple[str, int]
MEMBERSHIP, LEDGER, COORDINATOR, PERSISTENCE = "membership", "ledger", "coordinator", "persistence"
COORD_ADDR: Address = (COORDINATOR, 0)
PERSIST_ADDR: Address = (PERSISTENCE, 0)

# a purge's marker: (membership shard, a number from its token counter, increasing)
Marker = tuple[int, int]
# a re-materialization's token: ("remat", sequence number at the coordinator)
RematToken = tuple[str, int]

# one signal on the wire: (user, entity, signal_type, weight_f32, ts_ns, context msgpack bytes|None)
SignalTuple = tuple[int, int, int, float, int, Any]


@dataclass(frozen=True, slots=True)
class SignalBatch:
    signals: list[SignalTuple]


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


@dataclass(frozen=True, slots=True)
class PurgeRequest:
    user: int
    cohort: str
    now_ns: int
    reply: Reply


@dataclass(frozen=True, slots=True)
class Purge:
    """Membership -> coordinator: ``bound`` is the shard's record count then."""

    user: int
    cohort: str
    mshard: int
    bound: int
    now_ns: int
    reply: Reply
    marker: Marker


@dataclass(frozen=True, slots=True)
class Attribute:
    """Membership -> ledger: one membership shard's records, in attribution order, as
    columns (one numpy array per field, so the ledger never transposes per record).

    ``rseqs`` (int64) increase; ``users``, ``entities``, ``types`` are uint64;
    ``weights`` float64 holding float32 values; ``timestamps`` int64 ns; ``cohorts``
    a list of names. ``contexts`` maps a record's index in the batch to its context's
    msgpack bytes (packed at the call, `core.validate.check_context`).
    """

    mshard: int
    rseqs: np.ndarray
    users: np.ndarray
    cohorts: list[str]
    entities: np.ndarray
    types: np.ndarray
    weights: np.ndarray
    timestamps: np.ndarray
    contexts: dict[int, bytes] | None = None

    def __len__(self) -> int:
        return len(self.cohorts)

    @property
    def records(self) -> list[LogRecord]:
        """The records one by one (for traces and tests; the hot path reads columns)."""
        return [
            LogRecord(self.mshard, r, u, c, e, t, w, ts)
            for r, u, c, e, t, w, ts in zip(
                self.rseqs.tolist(),
                self.users.tolist(),
                self.cohorts,
                self.entities.tolist(),
                self.types.tolist(),
                self.weights.tolist(),
                self.timestamps.tolist(),
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
class PreparePurge:
    purge_id: int
    user: int
    cohort: str
    watermark: int
    bound: int
    marker: Marker


@dataclass(frozen=True, slots=True)
class PurgePrepared:
    purge_id: int
    prepared: Prepared
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class ApplyPurge:
    purge_id: int
    user: int
    cohort: str
    prepared: Prepared


@dataclass(frozen=True, slots=True)
class EvictionUpdate:
    """Coordinator -> ledgers: membership shard ``mshard``'s watermark and drained count,
    after the purge of ``marker`` committed."""

    mshard: int
    watermark: int
    drained: int
    marker: Marker


@dataclass(frozen=True, slots=True)
class Read:
    """kind: "score" | "window" | "top" | "rows" | "stats"; args per kind."""

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
class QueryPurge:
    purge_id: int
    reply: Reply


@dataclass(frozen=True, slots=True)
class RematStart:
    """Coordinator -> ledger: rebuild ``cohort`` leaving out the covered records."""

    cohort: str
    covered: dict[int, int]
    token: RematToken


@dataclass(frozen=True, slots=True)
class RematAbort:
    """Coordinator -> ledger: drop the running re-materialization ``token`` (a purge
    of its cohort goes first; the cohort is rebuilt again after it). A no-op if the
    rebuild has finished or never started."""

    token: RematToken


@dataclass(frozen=True, slots=True)
class RematStep:
    """Ledger -> itself: fold the next chunk of a running re-materialization."""

    token: RematToken


@dataclass(frozen=True, slots=True)
class RematDone:
    token: RematToken
    cohort: str
    read: int = 0
    excluded: int = 0
    matched: bool = True
    per_user: dict[int, int] | None = None
    seconds: float = 0.0
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Rematerialize:
    """Facade -> coordinator: re-materialize ``cohort`` now; reply with the report."""

    cohort: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class EraseHistory:
    """Coordinator -> persistence: erase the covered records of ``cohort`` from the
    history and commit ``ops`` in the same transaction; ``reply`` as in `Write`."""

    cohort: str
    covered: dict[int, int]
    ops: list[tuple[str, bytes, bytes | None]]
    reply: Any


@dataclass(frozen=True, slots=True)
class Compact:
    """Facade -> persistence: commit, then rewrite the environment compactly."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class ResumeRematerialization:
    """Facade -> coordinator at open: finish re-materializations a crash interrupted."""


@dataclass(frozen=True, slots=True)
class Tick:
    """Host -> coordinator, every few tens of ms while a re-materialization is due."""


@dataclass(frozen=True, slots=True)
class Publish:
    """Facade -> ledger, from the flusher thread: publish the changes not yet in the
    shard's view (`actors.ledger_views`)."""


@dataclass(frozen=True, slots=True)
class Drain:
    """Facade -> coordinator at close: reply once no purge is in flight or waiting."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class PurgeAbandoned:
    """Coordinator -> every ledger: the purge of ``marker`` failed. Each ledger stops
    waiting for its eviction update; the cohort's ledger drops its hold
    (`ContributionLog.release`)."""

    marker: Marker
    mshard: int
    user: int
    cohort: str
    bound: int


@dataclass(frozen=True, slots=True)
class PurgeMarker:
    """Membership -> every ledger, right after the user's earlier records.

    At the cohort's ledger the purge's preparation waits for it, so it never overtakes
    them even where only per-pair FIFO holds (the coordinator's path to the ledger is
    another pair); it names the pair and the purge's bound, so that ledger can tell the
    pair's records that come after it (`ContributionLog.hold`). At every ledger it
    says a purge of membership shard ``mshard`` is in flight: the purge will drain
    records, which leaves the log more room than the ledger can know of, so until the
    purge's eviction update (or `PurgeAbandoned`) comes the ledger trims that shard's
    records only as far as the watermark when the purge was taken (at ``bound``)."""

    marker: Marker
    mshard: int
    user: int
    cohort: str
    bound: int
