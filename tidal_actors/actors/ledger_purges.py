"""The purge side of a ledger shard (`LedgerShard`'s base class): a purge's marker
holds the user's records in the log, its preparation lists them for the coordinator
(retroactive-purge FR-2), its application retracts them, and its eviction update or
abandonment ends it here; restore by handshake's messages (`CoordinatorLost`,
`ForgetMarkers`) end what a failed incarnation left (`actors.recovery`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tidal_actors.actors import messages as M
from tidal_actors.actors.ledger_durability import LedgerDurability
from tidal_actors.actors.recovery import CoordinatorLost, ForgetMarkers
from tidal_actors.core.contrib_log import EMPTY, Prepared
from tidal_actors.storage.format import ledger_shard_of

__all__ = ["LedgerPurges"]


class LedgerPurges(LedgerDurability):
    """Purge handlers of `LedgerShard` (which sets the attributes below)."""

    index: int
    retracted: int
    purges_applied: int
    _markers: set[M.Marker]
    _parked: dict[M.Marker, M.PreparePurge]
    _in_flight: dict[int, dict[M.Marker, int]]
    _ended_early: set[M.Marker]
    _prepared: dict[int, tuple[M.PreparePurge, Prepared]]
    _restored: set[M.Marker]
    _ended_upto: dict[int, int]
    _awaiting: set[M.Marker]
    _jobs: dict[Any, Any]

    if TYPE_CHECKING:

        def _settle(self) -> None: ...

        def note_retraction(self, rows: Sequence[int]) -> None: ...

    def _on_marker(self, msg: M.PurgeMarker) -> None:
        if msg.marker in self._restored:  # registered at the restart already
            self._restored.discard(msg.marker)
            return
        if msg.marker in self._ended_early:
            self._ended_early.discard(msg.marker)
            self._parked.pop(msg.marker, None)  # its purge is over: nothing to hold
            return
        elif self._ended_before(msg.marker):
            return
        else:
            self._awaiting.discard(msg.marker)
            self._in_flight.setdefault(msg.mshard, {})[msg.marker] = msg.bound
            self._notes[msg.marker] = msg
        if not self._owns(msg.cohort):
            return
        self.state.log.hold(msg.user, msg.cohort, msg.bound)
        self._markers.add(msg.marker)
        parked = self._parked.pop(msg.marker, None)
        if parked is not None:
            self._on_prepare(parked)

    def _on_prepare(self, msg: M.PreparePurge) -> None:
        if msg.marker not in self._markers:
            if self._ended_before(msg.marker):
                return  # abandoned when this shard restarted: nobody waits for it
            self._parked[msg.marker] = msg  # the user's earlier records are still coming
            return
        self._markers.discard(msg.marker)
        try:
            prepared = self.state.log.prepare(msg.user, msg.cohort, msg.watermark, msg.bound)
            self._prepared[msg.purge_id] = (msg, prepared)
            self.ctx.tell(M.COORD_ADDR, M.PurgePrepared(msg.purge_id, prepared))
        except Exception as exc:
            self.ctx.tell(M.COORD_ADDR, M.PurgePrepared(msg.purge_id, EMPTY, exc))
            raise

    def _owns(self, cohort: str) -> bool:
        """Whether ``cohort``'s aggregates and log live on this ledger shard."""
        return ledger_shard_of(cohort, self.ctx.config.ledger_shards) == self.index

    def _end_purge(self, mshard: int, marker: M.Marker) -> None:
        """The purge of ``marker`` committed or failed: trimming ``mshard`` may resume."""
        self._notes.pop(marker, None)
        open_ = self._in_flight.get(mshard)
        if open_ is not None and marker in open_:
            del open_[marker]
            if not open_:
                del self._in_flight[mshard]
            if marker in self._awaiting:  # its marker is still to come: then ignored
                self._awaiting.discard(marker)
                self._ended_early.add(marker)
        elif not self._ended_before(marker):
            self._ended_early.add(marker)

    def _on_coordinator_lost(self, msg: CoordinatorLost) -> None:
        self._jobs.clear()  # nothing of a rebuild is visible before it finishes
        msg.reply.set_result(list(self._prepared.values()))
        self._settle()

    def _on_abandoned(self, msg: M.PurgeAbandoned) -> None:
        for pid in [k for k, (p, _) in self._prepared.items() if p.marker == msg.marker]:
            del self._prepared[pid]
        if self._ended_before(msg.marker):
            return  # a copy re-sent after a restart: nothing of that purge is held here
        if self._owns(msg.cohort):
            self.state.log.release(msg.user, msg.cohort, msg.bound)
        self._end_purge(msg.mshard, msg.marker)

    def _on_forget(self, msg: ForgetMarkers) -> None:
        m, below = msg.mshard, msg.below
        for marker, note in list(self._notes.items()):
            if marker[0] == m and marker[1] < below:
                self._on_abandoned(M.PurgeAbandoned(marker, m, note.user, note.cohort, note.bound))
        for marker in [k for k in self._parked if k[0] == m and k[1] < below]:
            del self._parked[marker]
        self._ended_upto[m] = max(self._ended_upto.get(m, -1), below - 1)

    def _on_apply(self, msg: M.ApplyPurge) -> None:
        if msg.purge_id not in self._prepared:
            # prepared by an incarnation before a restart: its rows are not this
            # state's, and the state restored after the commit leaves them out already
            return
        del self._prepared[msg.purge_id]
        if self.state.history is not None:  # left out of what is read back from now on
            self.state.history.retracted(msg.prepared.mshards, msg.prepared.rseqs)
        self.note_retraction(msg.prepared.rows)
        self.state.aggregates.retract_rows(msg.prepared.rows)
        self.state.log.apply(msg.user, msg.cohort, msg.prepared)
        self.retracted += len(msg.prepared.records)
        self.purges_applied += 1
        self._settle()

    def _on_eviction(self, msg: M.EvictionUpdate) -> None:
        if self._ended_before(msg.marker):
            return  # a copy re-sent after a restart: the restored state has it, or later
        self.state.watermarks[msg.mshard] = (msg.watermark, msg.drained)
        self.state.log.set_floor(msg.mshard, msg.watermark)
        self._end_purge(msg.mshard, msg.marker)
        self._settle()
