"""The publishing half of a ledger shard: its `PublishedView`, kept current.

A ledger shard notes the keys each message changes (an attribution's records, a
retraction's rows, a rebuild's rewritten cohort) and publishes a new view
(`core.publisher.Publisher`) after a message was handled: at once when the change is
not an attribution (a purge's retraction, a rebuild) or when a barrier (a read that
waits, a flush) is complete there; after attributions once ``publish_every_s`` (the
host context's, ``PUBLISH_EVERY_S`` under the pykka host, 0 under the deterministic
one), and twice the last publication's duration (``PUBLISH_SPACING``), have passed
since the last publication: checked after each message, when the mailbox goes idle,
and on a `Publish` the flusher thread sends while changes wait (`unpublished`). So
under flat-out ingestion publishing takes at most about a third of the shard's time,
and a view lags the shard by about three publications' durations. A publication
costs about a microsecond or two per key changed since the last one (more for keys
entering a (cohort, type)'s best), so a workload where most records touch a key no
recent record touched pays the most (docs/performance.md, "Reads"). A message whose handler raised publishes nothing: the next
publication is built afresh from the state (a restarted shard builds its own at
start). Readers in other threads take ``view`` (one attribute read) and never wait.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.core.key_state import DEAD
from tidal_actors.core.published import PublishedView
from tidal_actors.core.publisher import Publisher
from tidal_actors.core.states import LedgerState

__all__ = ["PUBLISH_EVERY_S", "LedgerViews"]

# attributions are published at most this often (seconds), under the pykka host...
PUBLISH_EVERY_S = 0.002
# ... and at least this many times the last publication's duration apart (so that
# publishing takes at most a third of a busy shard's time)
PUBLISH_SPACING = 2.0


class LedgerViews(Behaviour):
    """The published view of `LedgerShard` (a base class of it)."""

    state: LedgerState

    def _init_views(self) -> None:
        self._publisher = Publisher(self.state.aggregates)
        self._dirty: list[np.ndarray] = []
        # key id -> (cohort, entity, type) of keys a retraction may have dropped
        self._dirty_names: dict[int, tuple[str, int, int]] = {}
        self._dirty_all = False
        self._urgent = False  # a change published at once: a retraction, a rebuild
        self._published_at = 0.0
        self._every = float(getattr(self.ctx, "publish_every_s", 0.0))
        self._cost = 0.0  # seconds the last publication took
        # changes wait for a publication (read by the flusher thread: `Publish`)
        self.unpublished = False
        self.publications = 0  # views published by this incarnation
        self.publish_s = 0.0  # seconds spent building them
        self.view: PublishedView = self._publisher.publish_all()
        self.on(M.Publish, self._on_publish)

    def receive(self, message: object) -> None:
        errors = self.handler_errors
        super().receive(message)
        if self.handler_errors != errors:
            # the state may be half-updated: publish nothing from it now; whatever
            # comes next (a resumed shard) is published afresh
            self._dirty_all = True
            self._dirty.clear()
            self._dirty_names.clear()
            return
        if not (self._dirty or self._dirty_all):
            return
        if self._urgent or self._due():
            self.publish()
        else:
            self.unpublished = True

    def _due(self) -> bool:
        """Whether attributions may be published now (see the module doc)."""
        if not self._every:
            return True
        wait = max(self._every, self._cost * PUBLISH_SPACING)
        return time.perf_counter() - self._published_at >= wait

    def on_idle(self) -> None:
        if (self._dirty or self._dirty_all) and self.fault is None:
            if self._due():
                self.publish()
            else:
                self.unpublished = True

    def _on_publish(self, _msg: M.Publish) -> None:
        """Nothing to do here: `receive` publishes after it if the changes are due."""

    def publish(self) -> None:
        """Publish the changes noted since the last publication (if any)."""
        started = time.perf_counter()
        if self._dirty_all:
            view = self._publisher.publish_all()
        elif self._dirty:
            ks = self._dirty[0] if len(self._dirty) == 1 else np.concatenate(self._dirty)
            view = self._publisher.publish(np.unique(ks), self._dirty_names)
        else:
            return
        self._dirty.clear()
        self._dirty_names.clear()
        self._dirty_all = False
        self._urgent = False
        self.unpublished = False
        self._published_at = now = time.perf_counter()
        self.publications += 1
        self._cost = now - started
        self.publish_s += self._cost
        self.view = view  # one assignment: readers see the old view or this one

    def note_rows(self, rows: range) -> None:
        """Note the keys of detail rows ``rows`` just added (before anything settles)."""
        if not len(rows):
            return
        agg = self.state.aggregates
        dk = agg.view("row_key")
        self._dirty.append(
            dk[rows.start - agg.row_base : rows.stop - agg.row_base].astype(np.int64)
        )
        del dk  # no buffer export may outlive the call

    def note_retraction(self, rows: Sequence[int]) -> None:
        """Note the keys of detail rows about to be retracted, with their names (a
        key left with no contribution is dropped, its columns zeroed)."""
        if not len(rows):
            return
        agg = self.state.aggregates
        r = np.asarray(rows, dtype=np.int64) - agg.row_base
        r = r[(r >= 0) & (r < agg.held)]  # a settled row makes the retraction raise
        dk = agg.view("row_key")
        ks = np.unique(dk[r]).astype(np.int64)
        del dk
        ks = ks[ks != DEAD]
        for k in ks.tolist():
            self._dirty_names[k] = agg.key(k)
        self._dirty.append(ks)
        self._urgent = True

    def cohort_keys(self, cohort: str) -> tuple[np.ndarray, dict[int, tuple[str, int, int]]]:
        """The ids and names of ``cohort``'s live keys (before a rebuild rewrites them)."""
        agg = self.state.aggregates
        ks = agg.cohort_key_ids(cohort)
        return np.array(ks, dtype=np.int64), {k: agg.key(k) for k in ks}

    def note_keys(self, ks: np.ndarray, names: dict[int, tuple[str, int, int]]) -> None:
        """Note keys ``ks`` changed, ``names`` naming those that may have been dropped."""
        self._dirty_names.update(names)
        self._dirty.append(ks)
        self._urgent = True
