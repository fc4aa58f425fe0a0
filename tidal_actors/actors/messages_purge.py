"""The purge protocol's messages: a purge's request, its two phases at the ledgers
(prepare, apply), the eviction update that follows its commit, and the markers that
keep a purge behind the user's earlier records.

Part of the actor protocol (`actors.messages`, which re-exports every name here). A
purge's path: membership (`PurgeRequest` in, `PurgeMarker` to every ledger, `Purge` to
the coordinator) -> coordinator (`PreparePurge`, `ApplyPurge` to the cohort's ledger,
`EvictionUpdate` or `PurgeAbandoned` to every ledger).
"""

from __future__ import annotations

from dataclasses import dataclass

from tidal_actors.actors.reply import Reply
from tidal_actors.core.contrib_log import Prepared

__all__ = [
    "ApplyPurge",
    "EvictionUpdate",
    "Marker",
    "PreparePurge",
    "Purge",
    "PurgeAbandoned",
    "PurgeMarker",
    "PurgePrepared",
    "PurgeRequest",
    "QueryPurge",
]

# a purge's marker: (membership shard, a number from its token counter, increasing)
Marker = tuple[int, int]


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
class QueryPurge:
    purge_id: int
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
