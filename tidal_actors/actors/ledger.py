"""The ledger shard: folds signals into cohort aggregates, retracts, settles, serves reads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Context
from tidal_actors.actors.ledger_durability import ended_before
from tidal_actors.actors.ledger_purges import LedgerPurges
from tidal_actors.actors.ledger_remat import LedgerRebuilds
from tidal_actors.actors.ledger_views import LedgerViews
from tidal_actors.actors.recovery import (
    CoordinatorLost,
    ForgetMarkers,
    LedgerRecovery,
    SeenRecords,
)
from tidal_actors.core.contrib_log import Prepared
from tidal_actors.core.states import LedgerState
from tidal_actors.storage.format import batch_op, membership_capacity


class LedgerShard(LedgerViews, LedgerRebuilds, LedgerPurges):
    """Aggregates, contribution log and durable history of the cohorts hashed here,
    and the view of them it publishes (`LedgerViews`); its purge handlers are in
    `LedgerPurges`, its rebuilds in `LedgerRebuilds`."""

    history_failed = False
    """A history write this shard committed itself failed (the Ray host's ``shards``
    layout; set by its host, `LocalHost.stop`): its state holds signals the store
    does not, so no snapshot is written of it at close."""

    def __init__(self, ctx: Context, index: int, state: LedgerState | None = None) -> None:
        super().__init__(ctx)
        self.index = index
        self.address = (M.LEDGER, index)
        self.state = state or LedgerState(ctx.config)
        cfg = ctx.config
        self._caps = [
            membership_capacity(cfg.max_contribution_log_entries, i, cfg.membership_shards)
            for i in range(cfg.membership_shards)
        ]
        self.records_in = 0
        self.retracted = 0
        self.purges_applied = 0  # purges applied here since the open (one ApplyPurge each)
        self.history_batches = 0
        for kind, fn in (
            (M.Attribute, self._on_attribute),
            (M.BarrierPart, self._on_barrier_part),
            (M.PreparePurge, self._on_prepare),
            (M.ApplyPurge, self._on_apply),
            (M.EvictionUpdate, self._on_eviction),
            (M.PurgeMarker, self._on_marker),
            (M.PurgeAbandoned, self._on_abandoned),
            (SeenRecords, self._on_seen),
            (ForgetMarkers, self._on_forget),
            (CoordinatorLost, self._on_coordinator_lost),
        ):
            self.on(kind, fn)
        self._markers: set[M.Marker] = set()
        self._parked: dict[M.Marker, M.PreparePurge] = {}
        # purges in flight by membership shard, marker -> bound (their marker came,
        # their eviction update or abandonment not yet); those whose end came first
        self._in_flight: dict[int, dict[M.Marker, int]] = {}
        self._ended_early: set[M.Marker] = set()
        self._init_rebuilds()
        self._init_views()
        # barrier id -> (barrier, parts received, losses they reported)
        self._barrier_parts: dict[int, tuple[M.Barrier, int, tuple[BaseException, ...]]] = {}
        # purges prepared by this incarnation, not applied yet (`_on_apply`), with
        # their preparation (a restarted coordinator applies a committed one from it)
        self._prepared: dict[int, tuple[M.PreparePurge, Prepared]] = {}
        # set by `restarted`: markers already registered, and per membership shard
        # the marker number of its newest purge ended before the restart
        self._restored: set[M.Marker] = set()
        self._ended_upto: dict[int, int] = {}
        # whether the attribution being handled has sent its history write, and so
        # survives a failure after it (`on_error`); read by the supervisor
        self._sent_write = False
        self._applied = False  # ... and whether it was applied whole
        self.fault_in_doubt: str | None = None
        # the markers this incarnation registered as in flight, until their purge
        # ends: a next incarnation takes them over (`restarted`, ``inherited``)
        self._notes: dict[M.Marker, M.PurgeMarker] = {}
        # restored by handshake: purges in flight whose marker is still to come on
        # its link (registered for trimming only, `restarted`)
        self._awaiting: set[M.Marker] = set()
        self._last_batch: int | None = None  # the history batch of the last Attribute

    COUNTERS = ("records_in", "retracted", "purges_applied", "history_batches", "handler_errors")

    @classmethod
    def restarted(
        cls,
        ctx: Context,
        index: int,
        state: LedgerState,
        recovery: LedgerRecovery,
        counters: Mapping[str, int] | None = None,
        inherited: Iterable[M.PurgeMarker] = (),
        handshake: bool = False,
    ) -> LedgerShard:
        """The shard rebuilt after a failure (`actors.recovery`).

        Args:
            ctx: the host's context.
            index: the shard's index.
            state: its state as restored from the store (``build_states``), read
                after every write of the failed incarnation was committed.
            recovery: the coordinator's answer: each purge in flight is registered
                as if its marker had just come (the pair held at its cohort's shard,
                trimming bounded by it); a marker or an end of a purge that ended
                before is recognised by its number; the start of a re-materialization
                it ended is ignored.
            counters: the ``stats()`` counters to carry over (`COUNTERS`).
            inherited: the markers the failed incarnation took and whose purge had
                not ended (`marker_notes`). They do not come again, and a purge whose
                marker came before the coordinator got its request is not in
                ``recovery.in_flight`` (the membership shard tells the ledgers first):
                each is registered as if it had just come.
            handshake: restored with its links (a restart from the store only,
                `actors.recovery`, "Restore by handshake"): the links re-send every
                message not durable here, each purge's marker among them until its
                purge ends, after the records it follows. So ``inherited`` is not
                used, and each purge in flight only bounds trimming until its marker
                comes again: its preparation waits for that marker.
        """
        new = cls(ctx, index, state)
        new._ended_upto = dict(recovery.ended_upto)
        new._ended_remats = set(recovery.ended_remats)
        if handshake:
            for marker in recovery.in_flight:
                new._in_flight.setdefault(marker.mshard, {})[marker.marker] = marker.bound
                new._awaiting.add(marker.marker)
            new._carry_counters(counters)
            state.raise_floors(new._caps, new._in_flight)
            return new
        taken = {note.marker: note for note in inherited}
        for marker in recovery.in_flight:
            new._on_marker(marker)
            if marker.marker not in taken:
                new._restored.add(marker.marker)
        known = {marker.marker for marker in recovery.in_flight}
        for key, note in taken.items():
            if key not in known and not new._ended_before(key):
                new._on_marker(note)
        new._carry_counters(counters)
        state.raise_floors(new._caps, new._in_flight)
        return new

    def _carry_counters(self, counters: Mapping[str, int] | None) -> None:
        for name in self.COUNTERS:
            if counters is not None and name in counters:
                setattr(self, name, counters[name])

    def counters(self) -> dict[str, int]:
        """The ``stats()`` counters of this incarnation (`COUNTERS`)."""
        return {name: getattr(self, name) for name in self.COUNTERS}

    def marker_notes(self) -> list[M.PurgeMarker]:
        """The markers this incarnation took whose purge has not ended here."""
        return list(self._notes.values())

    def held_messages(self) -> list[object]:
        """The messages received and not fully handled: purge preparations waiting
        for their marker, and the parts of barriers still waiting for others."""
        parts: list[object] = []
        for b, n, lost in self._barrier_parts.values():
            parts += [M.BarrierPart(b, lost)] + [M.BarrierPart(b)] * (n - 1)
        return [*self._parked.values(), *parts]

    def _ended_before(self, marker: M.Marker) -> bool:
        """Whether ``marker``'s purge ended before this incarnation started."""
        return ended_before(self._ended_upto, marker)

    def _on_attribute(self, msg: M.Attribute) -> None:
        self._sent_write = self._applied = False
        self._last_batch = None
        st = self.state
        m, rs, us = msg.mshard, msg.rseqs, msg.users
        rows = st.aggregates.add_columns(
            m, rs, us, msg.cohorts, msg.entities, msg.types, msg.weights, msg.timestamps
        )
        self.note_rows(rows)
        # a rebuild step failing here ends that rebuild (`_advance`), not this batch:
        # the batch is applied first, then the failure is raised (so counted and the
        # shard restarted) with the batch written (`on_error`)
        step_error: Exception | None = None
        if self._jobs:
            for token in list(self._jobs):
                try:
                    self._advance(token)
                except Exception as exc:  # noqa: BLE001 - raised below
                    step_error = step_error or exc
        log = st.log
        log.append_columns(us, msg.cohorts, rows)
        self.records_in += len(rows)
        if self.ctx.durable:
            self._persist(
                (m, rs, us, msg.cohorts, msg.entities, msg.types, msg.weights, msg.timestamps),
                msg.contexts,
                rows.start,
            )
        seen = st.rseq_seen
        last = int(rs[-1])  # rseqs increase within a message
        if last >= seen.get(m, -1):
            seen[m] = last
        st.raise_floors(self._caps, self._in_flight)
        self._settle()
        if step_error is not None:
            self._applied = True
            raise step_error
        self._sent_write = False  # handled: nothing of it is in doubt

    def _on_seen(self, msg: SeenRecords) -> None:
        msg.reply.set_result(self.state.rseq_seen.get(msg.mshard, -1))

    def _settle(self) -> None:
        """Drop detail rows no purge can name (`LedgerState.settle`); not while a
        re-materialization runs here (it reads the held rows and the history by the
        boundary between them, which must stay put)."""
        if not self._jobs:
            self.state.settle(self.ctx.durable)

    def _persist(
        self, cols: tuple[Any, ...], contexts: dict[int, Any] | None, first_row: int
    ) -> None:
        seq = self.state.batch_seq
        self.state.batch_seq += 1
        if self.state.history is not None:  # what `LedgerState.settle` pops
            self.state.unconfirmed.append((seq, first_row))
        self.history_batches += 1
        self._last_batch = seq
        self.ctx.tell(M.PERSIST_ADDR, M.Write([batch_op(self.index, seq, cols, contexts)]))
        self._sent_write = True

    def on_error(self, message: object, err: BaseException) -> None:
        if isinstance(message, M.Attribute):
            doubt = None
            if self._applied:  # a rebuild step failed after it (`_on_attribute`)
                doubt = "Attribute (applied; a re-materialization step failed)"
            elif self._sent_write:
                # its history write is on its way, committed before a restart reads
                # the store: the batch is not lost (whether it commits, the flush says)
                doubt = "Attribute (its history write was sent)"
            if doubt is not None:
                if self.fault is not None and self.fault[0] is message:  # for the supervisor
                    self.fault_in_doubt = doubt
            else:
                self.note_loss(err, message)
            self._sent_write = self._applied = False

    def _on_barrier_part(self, msg: M.BarrierPart) -> None:
        b = msg.barrier
        key = b.barrier_id
        _, n, lost = self._barrier_parts.get(key, (b, 0, ()))
        n, lost = n + 1, lost + msg.lost
        if n < b.parts:
            self._barrier_parts[key] = (b, n, lost)
            return
        self._barrier_parts.pop(key, None)
        self.publish_now()  # what the barrier's sender submitted before it is in the view
        if b.action is not None:
            self._read(b.action)
            return
        # persistence counts the ledgers reached (and commits first, if durable)
        self.ctx.tell(M.PERSIST_ADDR, M.BarrierPart(b, lost + self.take_loss(b)))

    def on_idle(self) -> None:
        # history batches committed since the last message may let rows settle
        self._settle()
        super().on_idle()  # publish what is not yet

    def _read(self, r: M.Read) -> None:
        self._settle()  # so that stats() after a flush shows what is settled
        try:
            agg = self.state.aggregates
            if r.kind == "score":
                value: Any = agg.decay_score(*r.args)
            elif r.kind == "window":
                value = agg.window(*r.args)
            elif r.kind == "top":
                value = agg.top(*r.args)
            elif r.kind == "rows":
                value = list(agg.rows(*r.args))
            elif r.kind == "key_counts":
                value = agg.key_counts(*r.args)
            elif r.kind == "stats":
                value = {
                    "records_in": self.records_in,
                    "retracted": self.retracted,
                    "log_records": self.state.log.live_count(),
                    "keys": agg.key_count(),
                    "handler_errors": self.handler_errors,
                    "log_bytes": self.state.log.nbytes(),
                    "detail_rows": agg.held,
                    "settled_buckets": len(agg.settled),
                }
            elif r.kind == "cohorts":
                value = sorted(agg.cohorts)
            else:
                raise ValueError(f"unknown read {r.kind!r}")
        except Exception as exc:
            r.reply.set_exception(self.failure(r, exc))
            raise
        r.reply.set_result(value)


# -- purge coordinator ----------------------------------------------------------------
