"""The publishing half of a ledger shard: its `PublishedView`, kept current while read.

A shard publishes only while its views are read: a reader that answers from
``view``, or finds none, adds one to ``reads`` (an attribute write, no clock read;
not atomic between reader threads, and need not be: a lost increment hides a read
only from a look that saw another read at the same moment). The shard notes the
time (``time.monotonic()``) when it sees ``reads`` moved (``wanted``): after each
message it handles, and whenever the flusher thread looks (`unread`, every quarter
of ``WANTED_S``). After a message the shard handled, if a reader wanted a view in
the last ``WANTED_S`` seconds, the shard publishes the keys changed since its last
publication (`core.publisher.Publisher`) once ``PUBLISH_EVERY_S`` and twice the last
publication's duration (``PUBLISH_SPACING``) have passed since it (so publishing
takes at most about a third of a busy shard's time); else it notes that changes
wait (``unpublished``: the flusher thread then sends a `Publish`, and the shard
publishes when it goes idle). When nobody has read a view for ``WANTED_S``, the
shard drops its view (``view = None``: readers ask the shard, and want one again)
and stops noting changes: ingestion then pays one time read per message. A shard
that handles no message meanwhile is sent a `Publish` by the flusher thread
(``unread``), so that an idle shard frees its view's buffers too.

A change that must not be missed is published at once, whatever the time: a
retraction (a purge, a leave) and a rebuild set ``view = None`` before they change
anything, so no reader answers from the state before them once they are applied,
and publish after; a barrier (a flush, a read that waited) publishes before it
completes, so what its sender submitted before it is in the view. A message whose
handler raised publishes nothing; the next publication copies every key.

Under the deterministic host (``publish_every_s`` 0) a shard publishes after every
message; under a host whose readers cannot share the shard's memory (no
``publish_every_s``, as the Ray host) it never publishes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.core.key_state import DEAD
from tidal_actors.core.published import PublishedView, unique_ids
from tidal_actors.core.publisher import Publisher
from tidal_actors.core.states import LedgerState

__all__ = ["PUBLISH_EVERY_S", "WANTED_S", "LedgerViews"]

# changes are published at most this often (seconds) under the pykka host...
PUBLISH_EVERY_S = 0.005
# ... and at least this many times the last publication's duration apart
PUBLISH_SPACING = 2.0
# a shard keeps publishing while a reader wanted a view within this many seconds
WANTED_S = 1.0


class LedgerViews(Behaviour):
    """The published view of `LedgerShard` (a base class of it)."""

    state: LedgerState

    def _init_views(self) -> None:
        self._publisher = Publisher(self.state.aggregates)
        every = getattr(self.ctx, "publish_every_s", None)
        self._never = every is None  # readers cannot share this memory
        self._always = every == 0.0  # the deterministic host: after every message
        self._every = float(every or 0.0)
        self.view: PublishedView | None = None  # what readers answer from
        self.reads = 0  # readers that wanted a view: each adds one
        self._reads_seen = 0  # ``reads`` when ``wanted`` was last noted
        self.wanted = -math.inf  # time.monotonic() when ``reads`` was last seen moved
        self._on = False  # publishing (changes are noted)
        self._dirty: list[np.ndarray] = []
        self._dirty_all = True
        self._urgent = False
        self._published_at = -math.inf
        self._cost = 0.0  # seconds the last publication took
        # changes wait for a publication (read by the flusher thread: `Publish`)
        self.unpublished = False
        self.publications = 0  # views published by this incarnation
        self.publish_s = 0.0  # CPU seconds spent building them
        self.on(M.Publish, self._on_publish)
        if self._always:
            self.publish()

    def receive(self, message: object) -> None:
        errors = self.handler_errors
        super().receive(message)
        if self.handler_errors != errors:
            # the state may be half-updated: publish nothing from it now; whatever
            # comes next (a resumed shard) is published afresh
            self._dirty_all = True
            self._dirty.clear()
            return
        self._after()

    def _after(self) -> None:
        """Publish, drop the view or note that changes wait (see the module doc)."""
        if self._never:
            return
        if self._always:
            if self._dirty or self._dirty_all or self.view is None:
                self.publish()
            return
        now = time.monotonic()
        if self._idle_for(now) > WANTED_S:
            if self._on:  # nobody reads the views: stop publishing
                self._on = False
                self.view = None
                self._publisher.release()
                self._dirty.clear()
                self._dirty_all = True
                self.unpublished = False
            return
        if not (self._dirty or self._dirty_all or self.view is None):
            return
        wait = max(self._every, self._cost * PUBLISH_SPACING)
        if self._urgent or self.view is None or now - self._published_at >= wait:
            self.publish()
        elif not self.unpublished:
            self.unpublished = True
            wake = getattr(self.ctx, "wake_ticker", None)
            if wake is not None:  # the flusher thread may sleep: it sends the `Publish`
                wake()

    def stop_publishing(self) -> None:
        """The shard was fenced (`runtime.supervision.Fenced`): no view (its reads go
        to the fence, and fail), and nothing for the flusher thread to send it."""
        self.view = None
        self._on = self.unpublished = False

    def _idle_for(self, now: float) -> float:
        """Seconds since readers were last seen wanting a view (``now``:
        ``time.monotonic()``); notes ``now`` as ``wanted`` if ``reads`` moved. Called
        by the shard's thread and the flusher thread: both note a time at or after
        the reads they saw, so either order leaves a recent one."""
        reads = self.reads
        if reads != self._reads_seen:
            self._reads_seen = reads
            self.wanted = now
        return now - self.wanted

    def unread(self, now: float) -> bool:
        """Whether the shard keeps a view nobody wanted for ``WANTED_S`` (``now``:
        ``time.monotonic()``); read by the flusher thread, which then sends a
        `Publish` so that an idle shard drops it too."""
        return self._on and self._idle_for(now) > WANTED_S

    def on_idle(self) -> None:
        if self.fault is None:
            self._after()

    def _on_publish(self, _msg: M.Publish) -> None:
        """Nothing to do here: `receive` publishes after it if the changes are due."""

    def publish_now(self) -> None:
        """Publish the changes noted so far if views are being published (a barrier
        completes: what its sender submitted before it must be in the view)."""
        if self._on or self._always:
            self.publish()

    def publish(self) -> None:
        """Publish the state now (the changes noted since the last publication)."""
        started = time.thread_time()  # the shard thread's CPU (not its GIL waits)
        if self._dirty_all or not self._on:
            ks = None
        elif self._dirty:
            ks = self._dirty[0] if len(self._dirty) == 1 else np.concatenate(self._dirty)
            ks = unique_ids(ks)
        else:
            ks = np.zeros(0, dtype=np.int64)
        view = self._publisher.publish(ks)
        self._on = True
        self._dirty.clear()
        self._dirty_all = False
        self._urgent = False
        self.unpublished = False
        self._published_at = time.monotonic()
        self.publications += 1
        self._cost = time.thread_time() - started
        self.publish_s += self._cost
        self.view = view  # one assignment: readers see the old view or this one

    def note_rows(self, rows: range) -> None:
        """Note the keys of detail rows ``rows`` just added (before anything settles)."""
        if not (self._on and len(rows)):
            return
        agg = self.state.aggregates
        dk = agg.view("row_key")
        self._dirty.append(
            dk[rows.start - agg.row_base : rows.stop - agg.row_base].astype(np.int64)
        )
        del dk  # no buffer export may outlive the call

    def note_retraction(self, rows: Sequence[int]) -> None:
        """Note the keys of detail rows about to be retracted (a key left with no
        contribution is dropped: its columns zeroed, its index entry removed)."""
        if not len(rows):
            return
        self.view = None  # no reader answers from the state before the retraction
        self._urgent = True
        if not self._on:
            return
        agg = self.state.aggregates
        r = np.asarray(rows, dtype=np.int64) - agg.row_base
        r = r[(r >= 0) & (r < agg.held)]  # a settled row makes the retraction raise
        dk = agg.view("row_key")
        ks = unique_ids(dk[r].astype(np.int64))
        del dk
        self._dirty.append(ks[ks != DEAD])

    def rebuilding(self) -> None:
        """A rebuild is about to rewrite a cohort's keys: published at once after, in
        full (the groups made again: keys dropped and installed again)."""
        self._publisher.regroup()
        self.view = None
        self._dirty_all = True
        self._urgent = True
