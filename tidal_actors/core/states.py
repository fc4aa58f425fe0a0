"""The restorable states of the shards and of the purge coordinator.

Each is what storage restores on open (``runtime.engine.build_states``) and what a
behaviour (``actors``) mutates; none knows how it is hosted or stored. The settle
rule of a ledger (which detail rows no purge can name any more) lives here, in
:meth:`LedgerState.settle`.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

import numpy as np

from tidal_actors._config import Config
from tidal_actors._types import MembershipStatus, PurgeStatus
from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.contrib_log import ContributionLog

__all__ = [
    "SETTLE_MIN",
    "SETTLE_STEP",
    "CoordinatorState",
    "HistorySource",
    "LedgerState",
    "MembershipState",
]


class HistorySource(Protocol):
    """What a ledger reads its durable history through (``storage.history.HistoryReader``)."""

    def committed(self) -> int:
        """One past the highest batch sequence of this shard committed since the open."""
        ...

    def settled_detail(
        self, key: tuple[str, int, int], t_lo: int, t_hi: int, settled_upto: dict[int, int]
    ) -> list[tuple[int, float]]:
        """``(ts, w)`` of the settled records of ``key`` with ``t_lo <= ts <= t_hi``."""
        ...

    def retracted(self, mshards: list[int], rseqs: list[int]) -> None:
        """The records ``(mshards[i], rseqs[i])`` a committed purge retracted live here."""
        ...


class MembershipState:
    """Restorable state of one membership shard."""

    def __init__(self) -> None:
        self.status: dict[int, tuple[MembershipStatus, int | None]] = {}
        self.history: dict[int, list[list[int | None]]] = {}
        self.cohorts: dict[int, tuple[str, ...]] = {}
        self.next_rseq = 0


# settle detail rows once at least this many can go, at most SETTLE_STEP a
# message (`LedgerState.settle`)
SETTLE_MIN = 16_384
SETTLE_STEP = 32_768


class LedgerState:
    """Restorable state of one ledger shard."""

    def __init__(self, config: Config) -> None:
        self.aggregates = Aggregates(
            config.half_life_for, config.window_width_ns, config.window_buckets
        )
        self.log = ContributionLog(self.aggregates)
        self.batch_seq = 0
        # membership shard -> the highest rseq received from it
        self.rseq_seen: dict[int, int] = {}
        # membership shard -> (watermark, drained count), from its last eviction update
        self.watermarks: dict[int, tuple[int, int]] = {}
        # the durable history, read back by re-materialization and by reads inside
        # settled buckets (None: an ephemeral database, or not wired yet)
        self.history: HistorySource | None = None
        # (batch seq, first detail row) of the history batches written since the
        # open and not yet known committed: their rows are not settled
        self.unconfirmed: deque[tuple[int, int]] = deque()

    def raise_floors(self, caps: list[int], in_flight: dict[int, dict[Any, int]]) -> None:
        """Trim from the log what is surely evicted: a lower bound of each membership
        shard's watermark from the records seen and its share of the log cap.

        Args:
            caps: each membership shard's share of ``max_contribution_log_entries``.
            in_flight: membership shard -> {marker: bound} of purges in flight.
        """
        log = self.log
        for m, seen in self.rseq_seen.items():
            next_rseq = seen + 1  # the record count this ledger knows of
            open_ = in_flight.get(m)
            if open_:
                # a purge in flight drains records, room no ledger can count yet: trim
                # only what was evicted when the first of them was taken (the
                # watermark never goes back; the purges before it have committed)
                next_rseq = min(next_rseq, min(open_.values()))
            watermark, drained = self.watermarks.get(m, (0, 0))
            floor = max(watermark, next_rseq - caps[m] - drained)
            if floor > log.floor.get(m, 0):
                log.set_floor(m, floor)

    def wire_history(self, reader: HistorySource) -> None:
        """Read settled records back from ``reader`` (a durable store's history)."""
        self.history = reader
        agg = self.aggregates
        agg.settled_detail = lambda k, lo, hi: reader.settled_detail(
            agg.key(k), lo, hi, agg.settled_upto
        )

    def settle(self, durable: bool, force: bool = False) -> int:
        """Drop the detail rows no purge can name any more (`Aggregates.settle`):
        before the contribution log's first row (its head, once compacted, and the
        rows held for purges in flight) and, in a durable database, before the first row of a
        history batch not yet committed (a row is dropped only once the history
        holds it). Only once at least ``SETTLE_MIN`` rows can go, and at most
        ``SETTLE_STEP`` a call, unless ``force``. Returns the rows dropped."""
        agg = self.aggregates
        if durable and self.history is None:
            return 0  # nothing to read them back from: keep them
        limit = agg.row_end
        if durable:
            assert self.history is not None
            top = self.history.committed()
            pending = self.unconfirmed
            while pending and pending[0][0] < top:
                pending.popleft()
            if pending:
                limit = pending[0][1]
        low = self.log.first_row()
        cut = min(limit, agg.row_end if low is None else low) - agg.row_base
        if cut <= 0 or (not force and cut < SETTLE_MIN):
            return 0
        self.log.compact_head()  # may move held pairs' rows to held_rows: ask again
        low = self.log.first_row()
        upto = min(limit, agg.row_end if low is None else low)
        if not force:  # a bounded step per message, so no handler stalls on it
            upto = min(upto, agg.row_base + SETTLE_STEP)
        return agg.settle(upto)


class CoordinatorState:
    """Restorable state of the purge coordinator."""

    def __init__(self, membership_shards: int) -> None:
        # per membership shard: its eviction watermark
        self.watermarks = [0] * membership_shards
        # per membership shard: rseqs drained by purges at or above its watermark
        # (sorted int64 arrays; rebuilt at restore from the purges' tombstones)
        self.drained: list[np.ndarray] = [
            np.zeros(0, dtype=np.int64) for _ in range(membership_shards)
        ]
        # user -> encoded manifests (`encode_manifest`, as stored), in purge id order:
        # bytes, not PurgeManifest objects, whose ContributionRecord entries (tuple
        # subclasses, never untracked) the cyclic GC would walk in every full
        # collection, a thousand more after each purge
        self.manifests: dict[int, list[bytes]] = {}
        self.last_purge_id = 0
        # purge id -> (status, rseq bound of the purge)
        self.statuses: dict[int, tuple[PurgeStatus, int]] = {}

    def covered(self, cohort: str) -> dict[int, int]:
        """user -> highest rseq bound over that user's purges of ``cohort``."""
        out: dict[int, int] = {}
        for status, bound in self.statuses.values():
            if status.cohort == cohort and bound > out.get(status.user_id, -1):
                out[status.user_id] = bound
        return out
