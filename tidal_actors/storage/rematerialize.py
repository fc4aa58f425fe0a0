"""Re-materialization's reads and writes of the durable history.

* `RematJob` steps a `core.remat.Rebuild` of one cohort on a ledger shard, reading
  the records the shard has settled back from the history (``HISTORY_BATCHES``
  batches a step, through the shard's `HistoryReader`), then its held rows; one step
  a message (the ledger behaviour sends them), so other cohorts' signals interleave.
  Nothing settled: the history is not read at all. Settled records that
  ``history_retention_ns`` has dropped from the history are not reached: the rebuilt
  cohort no longer holds them, as after a restore from the history.

The erasure of what a purge covered and retention by age are `history_rewrite`'s.

No threads; the reads go through the store the reader wraps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, cast

import numpy as np

from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.contrib_log import ContributionLog
from tidal_actors.core.remat import Rebuild, RematConfig, settled_mask
from tidal_actors.core.states import HistorySource
from tidal_actors.storage.format import HistoryBatch
from tidal_actors.storage.history import HistoryReader

__all__ = ["HISTORY_BATCHES", "RematJob"]

HISTORY_BATCHES = 8  # history batches folded a step (about 10 ms at full size)


class RematState(Protocol):
    """What a re-materialization uses of a ledger shard's state
    (``core.states.LedgerState``)."""

    aggregates: Aggregates
    log: ContributionLog
    history: HistorySource | None


class RematJob:
    """One re-materialization of ``cohort`` on a ledger shard's state.

    Args:
        state: the shard's state; ``state.history`` None means an ephemeral database
            (the rebuild only counts, see `core.remat`).
        cohort: the cohort to rebuild.
        covered: user -> rseq bound; that user's records with a lower rseq are left out.
        config: the half-lives and window width (a ``Config``).

    Raises:
        StorageError: the history's keys or tombstones cannot be read.
    """

    def __init__(
        self, state: RematState, cohort: str, covered: dict[int, int], config: RematConfig
    ) -> None:
        self.state = state
        self.cohort = cohort
        # a durable ledger's history is always wired with a `HistoryReader`
        self.history = cast(HistoryReader | None, state.history)
        self.rebuild = Rebuild(
            state.aggregates, cohort, covered, config, durable=self.history is not None
        )
        self._keys: list[bytes] = []
        self._tombs: dict[int, np.ndarray] = {}
        self._seen: dict[tuple[int, int], int] = {}  # `HistoryReader.unseen`
        self._gone = False  # a key listed was gone when read (`_fold_history`)
        self._contained = True  # `HistoryReader.contained`, with the rule `_past`
        self._past: Callable[[HistoryBatch, np.ndarray], bool] = lambda b, settled: False
        if self.history is not None and self.rebuild.settled_upto:
            self._keys = self.history.batch_keys()
            self._tombs = self.history.tombstones()
            self._contained = self.history.contained()
            self._past = self.history.past_rule(self.rebuild.settled_upto, self._tombs)
        self.t0 = time.perf_counter()

    @property
    def read(self) -> int:
        """Records of the cohort read so far (settled and held)."""
        return self.rebuild.read

    def step(self) -> bool:
        """Fold the next chunk of what existed at the start; True when all is.

        Raises:
            StorageError: a history batch does not decode.
        """
        if self._keys:
            chunk, self._keys = self._keys[:HISTORY_BATCHES], self._keys[HISTORY_BATCHES:]
            ended = self._fold_history(chunk)
            if ended:
                self._keys = [k for k in self._keys if self._shard(k) not in ended]
            if not self._keys and self._gone:
                # keys gone since the listing: a compaction merged their records into
                # a block, maybe under a key written since; read the keys after
                assert self.history is not None
                self._gone = False
                self._keys = [k for k in self.history.batch_keys() if k > chunk[-1]]
            return False
        return self.rebuild.step_held()

    def _fold_history(self, keys: list[bytes]) -> set[int]:
        """Fold the settled records of the batches at ``keys``; returns the key
        shards whose batches here have all passed every settled record
        (`HistoryReader.past_rule`: no later batch under that shard holds one; where
        the history is self-contained, only this shard's own keys end that way). A key gone
        since the listing had its records merged into a later key's block by a
        compaction (`storage.history_compact`): then none ends here, the later keys
        are read, and the keys written since the listing once the listed ones are."""
        history = self.history
        assert history is not None
        rebuild = self.rebuild
        batches = history.batches(keys)
        gone = len(batches) < len(keys)
        self._gone = self._gone or gone
        ended: set[int] = set()  # key shards whose batches here were all past
        going: set[int] = set()  # and the others
        for b in batches:
            settled = settled_mask(b, rebuild.settled_upto)
            if (b.shard == history.shard or not self._contained) and self._past(b, settled):
                ended.add(b.shard)
            else:
                going.add(b.shard)
            fresh = history.unseen(b, self._seen)  # not read at a key before a compaction
            if self.cohort in b.cohorts:
                # records a purge retracted live (tombstoned) are gone already
                kept = history.untombstoned(b, self._tombs)
                rebuild.fold_settled(b, settled & fresh, kept)
        return set() if gone else ended - going

    def _shard(self, key: bytes) -> int:
        """The ledger shard named by history key ``key``."""
        assert self.history is not None
        return self.history.key_shard_seq(key)[0]

    def finish(self) -> tuple[int, int, bool, dict[int, int]]:
        """Fold rows that arrived meanwhile, compare, swap in, erase the left-out rows.

        Returns ``(records_read, records_excluded, matched_live, excluded_per_user)``.
        """
        return self.rebuild.finish(self.state.log)
