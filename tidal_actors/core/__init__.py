"""The domain core: the rules of the semantics, as pure computation (no threads, no I/O).

Rules index
===========
Each rule is stated once, in the docstring of the place named here; the actors
(``tidal_actors.actors``) only carry the messages that apply them. Specs:
leave-stop-forward (``spec/leave-stop-forward.md``), retroactive-purge
(``spec/retroactive-purge.md``, FR-1 .. FR-6).

1. Gate: who may contribute.
   A user whose membership status is ``Left`` contributes nothing: their route is
   the empty route ``GATED`` (`core.routes.RouteTable`; the status picks it in
   `actors.membership_fanout.SignalFanOut._update_route`). A user not known, or
   ``Active``, contributes. Leave and rejoin change the status once committed
   (`MembershipShard._on_leave`, `MembershipShard._on_rejoin`); each leave opens a
   leave epoch ``[left_at, rejoined_at | None]`` in the user's leave history, which
   is kept for reads (`tidal_actors._types.LeaveEpoch`) and gates nothing: only the
   current status does.

2. Attribution order: which cohorts a signal fans out to, in what order.
   A signal of a user who may contribute becomes one record per cohort of the
   user's route: the user's cohorts in assignment order, then ``@community``
   (`core.routes.RouteTable.route_of`; a user in no cohort has ``COMMUNITY_ONLY``).
   A batch fans out signal by signal, each signal's route in order
   (`RouteTable.expand`), and its records take consecutive rseqs of the membership
   shard in that order (`actors.membership_fanout.SignalFanOut._number`, for both
   fan-out paths of `SignalFanOut._on_signals`).
   Assignment appends a cohort, unassignment removes it
   (`MembershipShard._on_assign`, `MembershipShard._on_unassign`).

3. Forward decay and retraction.
   ``score(at) = sum(w_i * 2 ** (-(at - t_i) / half_life))`` over contributions with
   ``t_i <= at``, never below 0.0 (retroactive-purge FR-2), kept as forward-decayed
   sums against a landmark (Cormode, Shkapenyuk, Srivastava, Xu, "Forward Decay: A
   Practical Time Decay Model for Streaming Systems", ICDE 2009), so that add and
   retract are exact, order-independent inverses. The formula and the layout:
   `core.aggregates` (theory of operation) and `core.key_columns.KEY_COLUMNS`; adding
   and moving the landmark: `core.adds.Adds` (vectorized),
   `core.bucket_adds.BucketAdds._add_one` (one record: the definition) and
   `core.record_adds.RecordAdds` (small batches, record by record); retracting, with its exactness bound
   (``REFOLD_AT``): `core.retraction.Retraction.retract_rows`; reading:
   `core.reads.Reads` (``_score``). Weights are rounded to float32 once, at intake
   (`core.validate.check_weight`), so the weight retracted is the weight added.

4. Window: bucketed window counts.
   Bucket ``b(t) = t // window_width_ns``; the window read at ``at`` covers buckets
   ``b(at) - window_buckets + 1 .. b(at)`` whole, a count and a weight sum per
   bucket (`core.reads.Reads._window`, and `Reads.rows` on columns). Every bucket
   with a contribution is kept (`core.aggregates`, theory of operation; a key's
   earlier buckets: `core.older_buckets.OlderBuckets`).

5. Log eviction: the contribution log's capacity and the watermark.
   Each membership shard's records are a FIFO of capacity
   ``membership_capacity(max_contribution_log_entries, ...)`` (retroactive-purge
   FR-1; `storage.format.membership_capacity`); records drained by a purge free
   their place. The *watermark* (glossary below) is computed lazily at each purge by
   `core.eviction.advance_watermark` (`actors.coordinator.PurgeCoordinator._on_purge`)
   and committed with the purge. A ledger trims its log up to a *floor*, a lower
   bound of the watermark it can prove by itself
   (`core.states.LedgerState.raise_floors`,
   `core.contrib_log.ContributionLog.set_floor`).
   An evicted record is unretractable.

6. Purge accounting: what a purge covers and what it reports.
   A purge of ``(user, cohort)`` covers the pair's records with ``rseq < bound``,
   where the bound is the user's membership shard's record count when the purge was
   taken (`actors.membership.MembershipShard._on_purge`); later records are left to
   the next purge. Of the covered records, those at or above the watermark and not
   retracted yet are the manifest's entries and are retracted; those below the
   watermark count as evicted, each reported by exactly one manifest; those
   retracted already (by an earlier purge) are neither
   (`core.contrib_log.ContributionLog.prepare`, `ContributionLog.apply`; the pair's
   count of trimmed records is item 0 of its index entry, `core.pair_store`). While
   a purge is in flight its pair's trimmed rows are held, not counted
   (`core.pair_index.PairIndex.hold`). A second purge of the same pair retracts
   nothing again (FR-5). Order: prepare, commit manifest + tombstones + watermark in
   one transaction, then apply (`actors.coordinator.PurgeCoordinator`).

7. Re-materialization.
   After purges of a cohort (coalesced over ``rematerialize_after_ms``,
   `Rematerializer._schedule_remat`) its aggregates are rebuilt from the records
   no purge covers (per user the highest bound, `CoordinatorState.covered`):
   `core.remat.Rebuild`, run by `storage.rematerialize.RematJob`; installed unless equal
   (`core.aggregates.Aggregates.same_cohort`, `Aggregates.install_cohort`). Without
   a durable history the evicted records stay.

8. Settling (bounded memory).
   Detail rows no purge can name any more (out of the log, not held, committed to
   the history when there is one) are folded into per-(key, bucket) sums:
   `core.settling.Settling.settle`, when: `core.states.LedgerState.settle`; the
   sums: `core.settled.SettledBuckets`.

9. Intake: what a public argument must be.
   Ids, weights, timestamps, cohort names, contexts and ``k`` are checked before
   any message is sent, a failed check raising `InvalidArgument` and changing
   nothing: `core.validate` (``check_*``; ``signal_columns`` for a batch).

10. Published views: what a read answered in the caller's thread may show.
   A ledger shard publishes immutable views of its aggregates while they are read
   (`core.published.PublishedView`, numpy copies built by `core.publisher.Publisher`);
   a read answered from one equals the shard's own read on the state it was
   published from, bit for bit, or is left to the shard (None). Top-k orders each
   (cohort, type)'s keys by forward-decay rank (`core.published_top`, its theory of
   operation). When a shard publishes, and what each consistency level sees:
   docs/semantics.md, "Read consistency".

Glossary of eviction terms
==========================
One name per concept (``rseq``: a record's sequence number in its membership shard,
from 0); a collection of one value per membership shard takes the plural.

*record count* (``next_rseq``)
    The number of records a membership shard has sent so far, i.e. the rseq its next
    record gets (`MembershipState.next_rseq`, `advance_watermark`). A ledger knows
    a lower bound of it: one past the highest rseq it has received
    (`LedgerState.rseq_seen`, `LedgerState.raise_floors`).

*bound*
    A purge's bound: its membership shard's record count when the purge was taken.
    The purge covers the pair's records below it (`Purge.bound`, `PurgeMarker.bound`,
    `PreparePurge.bound`: the purge protocol's messages, `actors.messages_purge`;
    `Prepared.bound`, `ContributionLog.prepare`); a purge
    status is stored with it (`CoordinatorState.statuses`).

*watermark*
    Per membership shard, the rseq below which the contribution log has evicted:
    a record is live while ``rseq >= watermark`` (`advance_watermark`,
    `CoordinatorState.watermarks`, `LedgerState.watermarks`, `Prepared.watermark`,
    `PreparePurge.watermark`, `EvictionUpdate.watermark`, the argument of
    `ContributionLog.prepare`).

*floor*
    A ledger's lower bound of a membership shard's watermark: every record below it
    is surely evicted, so the log may trim it before the next purge says so
    (`ContributionLog.floor`, `ContributionLog.set_floor`, `LedgerState.raise_floors`).

*drained*
    Records at or above the watermark that a purge retracted: they leave the FIFO
    and free their place (`CoordinatorState.drained`, their rseqs;
    `EvictionUpdate.drained`, their count).
"""
