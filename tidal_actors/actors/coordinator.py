"""The purge coordinator: prepare, commit, re-materialize, erase; the history's watermark."""

from __future__ import annotations

import numpy as np

from tidal_actors._errors import ActorFailure, UnknownPurge
from tidal_actors._types import (
    PurgeId,
    PurgeManifest,
    PurgeStatus,
)
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Context
from tidal_actors.actors.coordinator_purges import PendingPurge, PurgeCommit
from tidal_actors.actors.coordinator_recovery import CoordinatorRecovery
from tidal_actors.actors.recovery import RecoverLedger, RecoverMembership
from tidal_actors.actors.reply import Reply
from tidal_actors.core.contrib_log import Prepared
from tidal_actors.core.eviction import advance_watermark
from tidal_actors.core.states import CoordinatorState
from tidal_actors.storage.format import (
    decode_manifest,
    encode_manifest,
    eviction_state_op,
    ledger_shard_of,
    manifest_op,
    membership_capacity,
    status_op,
    tombstone_op,
)


class PurgeCoordinator(CoordinatorRecovery):
    """Serializes purges: prepare at the ledger, commit manifest, apply, reply.

    Owns purge ids, manifests, and each membership shard's eviction watermark (the
    ``rseq`` below which the contribution log has evicted) with its drained set.
    Order of a purge: the ledger lists what it would retract (nothing changes yet);
    the manifest, the tombstones of those records and the new watermark are committed
    in one transaction; only then is the retraction applied and the caller answered.
    A failed commit changes nothing; a crash after it is completed on restore (the
    tombstones keep the records out of the rebuilt state).
    """

    address = M.COORD_ADDR

    def __init__(self, ctx: Context, state: CoordinatorState | None = None) -> None:
        super().__init__(ctx)
        self.state = state or CoordinatorState(ctx.config.membership_shards)
        self._pending: PendingPurge | None = None
        # purges not started yet, in arrival order (`_next_purge`)
        self._waiting: list[M.Purge] = []
        self._drains: list[Reply] = []
        self._init_remat()
        # restarts waiting for the purge being committed (`_on_recover`)
        self._recoveries: list[RecoverLedger | RecoverMembership] = []
        # membership shard -> marker number of its newest purge ended (`LedgerRecovery`)
        self._ended_upto: dict[int, int] = {}
        self.purges = 0
        cfg = ctx.config
        self._caps = [
            membership_capacity(cfg.max_contribution_log_entries, i, cfg.membership_shards)
            for i in range(cfg.membership_shards)
        ]
        for kind, fn in (
            (M.Purge, self._on_purge),
            (M.PurgePrepared, self._on_prepared),
            (M.Committed, self._on_committed),
            (M.QueryManifests, self._on_query),
            (M.QueryPurge, self._on_query_purge),
            (M.Drain, self._on_drain),
            (RecoverLedger, self._on_recover),
            (RecoverMembership, self._on_recover_membership),
        ):
            self.on(kind, fn)

    def receive(self, message: object) -> None:
        if type(message) is M.Purge:
            if message.marker[1] <= self._ended_upto.get(message.mshard, -1):
                # marked before a restart of this coordinator (or of its membership
                # shard) ended every purge so marked: the ledgers forgot its marker
                message.reply.set_exception(
                    ActorFailure(
                        "the purge coordinator restarted while this purge was on its way; "
                        "nothing of it was committed: request it again"
                    )
                )
                return
            self._waiting.append(message)
            self._next_purge()
        else:
            super().receive(message)
        if self._drains:
            self._check_drained()

    def _next_purge(self) -> None:
        """Start the first waiting purge that may run, if none is in progress.

        A rebuild of the purge's cohort in progress gives way to it
        (`Rematerializer._yield_remat`) unless it has given way ``REMAT_YIELDS`` times
        in a row or its result is committing; then the purge waits for the rebuild,
        and so do the later purges of its membership shard: each purge's watermark is
        the shard's as of its bound, so one shard's purges commit in the order they
        were taken. Purges of other shards go ahead."""
        while self._pending is None and self._waiting:
            blocked: set[int] = set()
            for i, p in enumerate(self._waiting):
                if p.mshard in blocked:
                    continue
                remat = self._remat.cohort if self._remat is not None else None
                if p.cohort == remat and not self._yield_remat():
                    blocked.add(p.mshard)
                    continue
                del self._waiting[i]
                super().receive(p)
                break
            else:
                return

    def _on_purge(self, msg: M.Purge) -> None:
        st = self.state
        pid = PurgeId(max(st.last_purge_id + 1, msg.now_ns << 64))
        watermark = advance_watermark(
            st.watermarks[msg.mshard], st.drained[msg.mshard], msg.bound, self._caps[msg.mshard]
        )
        self._pending = PendingPurge(msg, pid, watermark)
        li = ledger_shard_of(msg.cohort, self.ctx.config.ledger_shards)
        self.ctx.tell(
            (M.LEDGER, li),
            M.PreparePurge(pid, msg.user, msg.cohort, watermark, msg.bound, msg.marker),
        )

    def _fail_pending(self, exc: BaseException) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._abandon(pending.request, exc)
        self._start_remat()
        self._next_purge()

    def _abandon(self, req: M.Purge, exc: BaseException) -> None:
        """``req`` failed before its commit: every ledger stops waiting for it (its
        marker came to each), and its caller gets ``exc``."""
        gone = M.PurgeAbandoned(req.marker, req.mshard, req.user, req.cohort, req.bound)
        for li in range(self.ctx.config.ledger_shards):
            self.ctx.tell((M.LEDGER, li), gone)
        req.reply.set_exception(exc)
        self._ended(req)

    def _on_prepared(self, msg: M.PurgePrepared) -> None:
        p = self._pending
        if p is None or p.purge_id != msg.purge_id:
            return
        if msg.error is not None:
            err = ActorFailure(f"purge prepare failed: {msg.error!r}")
            err.__cause__ = msg.error
            self._fail_pending(err)
            return
        req = p.request
        prepared: Prepared = msg.prepared
        manifest = PurgeManifest(
            p.purge_id,
            req.user,
            req.cohort,
            req.now_ns,
            tuple(prepared.records),
            prepared.evicted,
        )
        watermark = p.watermark
        old = self.state.drained[req.mshard]
        old = old[int(np.searchsorted(old, watermark)) :]
        # the retracted records were live, so not drained yet: a sorted merge, O(n)
        new = np.sort(np.array(prepared.rseqs, dtype=np.int64))
        drained = np.insert(old, np.searchsorted(old, new), new)
        encoded = encode_manifest(manifest)
        pid = p.purge_id
        status = PurgeStatus(pid, req.user, req.cohort, len(prepared.records), False, None, 0)
        p.commit = PurgeCommit(manifest, encoded, prepared, drained, status)
        ops: list[tuple[str, bytes, bytes | None]] = [
            manifest_op(req.user, pid, encoded),
            eviction_state_op(req.mshard, watermark, req.bound),  # drained: from tombstones
        ]
        if prepared.records:
            ops.append(tombstone_op(req.user, pid, prepared.mshards, prepared.rseqs))
        ops.append(status_op(status, req.bound))
        self.ctx.tell(M.PERSIST_ADDR, M.Write(ops, (self.address, pid)))

    def _on_committed(self, msg: M.Committed) -> None:
        if self._remat is not None and msg.token == self._remat.token:
            self._remat_committed(msg)
            return
        p = self._pending
        if p is None or p.purge_id != msg.token:
            return
        if msg.error is not None:
            self._fail_pending(msg.error)
            return
        self._purge_committed(p)

    def _purge_committed(self, p: PendingPurge) -> None:
        """``p``'s manifest, tombstones and watermark are committed: the purge is done,
        whatever fails from here on. So each step runs even if one before it failed
        (the first failure is raised at the end): the state takes the commit, the
        ledgers retract and move their watermark, the caller gets the manifest, and
        the next rebuild or purge starts."""
        c = p.commit
        assert c is not None  # the write is sent once the purge is prepared
        req = p.request
        self._pending = None

        def take() -> None:
            st = self.state
            st.last_purge_id = max(st.last_purge_id, int(p.purge_id))
            st.watermarks[req.mshard] = p.watermark
            st.drained[req.mshard] = c.drained
            st.manifests.setdefault(req.user, []).append(c.manifest_bytes)
            st.statuses[int(p.purge_id)] = (c.status, req.bound)
            self.purges += 1

        def retract() -> None:
            li = ledger_shard_of(req.cohort, self.ctx.config.ledger_shards)
            self.ctx.tell(
                (M.LEDGER, li), M.ApplyPurge(int(p.purge_id), req.user, req.cohort, c.prepared)
            )

        def evict() -> None:
            update = M.EvictionUpdate(req.mshard, p.watermark, len(c.drained), req.marker)
            for i in range(self.ctx.config.ledger_shards):
                self.ctx.tell((M.LEDGER, i), update)

        def answer() -> None:
            req.reply.set_result((p.purge_id, c.manifest))
            self._ended(req)

        def go_on() -> None:
            self._schedule_remat(req.cohort)
            self._start_remat()  # one held back while this purge was in progress

        failure: Exception | None = None
        for step in (take, retract, evict, answer, go_on, self._next_purge):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - raised once every step ran
                failure = failure or exc
        if failure is not None:
            raise failure

    def _purging_cohort(self) -> str | None:
        return self._pending.request.cohort if self._pending is not None else None

    def on_error(self, message: object, err: BaseException) -> None:
        """A failure while a purge or a re-materialization waits on this message ends
        it with the error, so its caller is answered and later purges proceed."""
        token = getattr(message, "purge_id", None) or getattr(message, "token", None)
        if type(message) is M.Purge:  # failed while starting
            try:
                if self._pending is not None and self._pending.request is message:
                    self._fail_pending(err)
                else:
                    self._abandon(message, err)
            except Exception as exc:  # noqa: BLE001 - counted
                self.handler_errors += 1
                self.last_error = exc
        elif self._remat is not None and token == self._remat.token:
            self._remat_finished(error=err)
        elif self._pending is not None and token == self._pending.purge_id:
            p = self._pending
            if type(message) is M.Committed and message.error is None and p.commit is not None:
                # its write committed: the purge is completed, never abandoned
                try:
                    self._purge_committed(p)
                except Exception as exc:  # noqa: BLE001 - counted; each step ran
                    self.handler_errors += 1
                    self.last_error = exc
            else:
                self._fail_pending(err)
        # a failure after a purge or rebuild ended (past its commit) skipped starting
        # the next one: the purges and rebuilds waiting would wait for another message
        try:
            self._start_remat()
            self._next_purge()
        except Exception as exc:  # noqa: BLE001 - counted; the next message tries again
            self.handler_errors += 1
            self.last_error = exc

    def _on_drain(self, msg: M.Drain) -> None:
        self._drains.append(msg.reply)
        self._check_drained()

    def _check_drained(self) -> None:
        """Answer drains once nothing purge-related is in flight or waiting."""
        if self._drains and self._pending is None and self._remat is None and not self._waiting:
            drains, self._drains = self._drains, []
            for r in drains:
                r.set_result(None)

    def _on_query_purge(self, msg: M.QueryPurge) -> None:
        entry = self.state.statuses.get(msg.purge_id)
        if entry is None:  # the caller's mistake, not a handler failure: not counted
            msg.reply.set_exception(
                UnknownPurge(f"no purge with id {PurgeId(msg.purge_id)} in this store")
            )
        else:
            msg.reply.set_result(entry[0])

    def _on_query(self, msg: M.QueryManifests) -> None:
        if msg.user == -1:
            msg.reply.set_result({"purges": self.purges, "handler_errors": self.handler_errors})
            return
        msg.reply.set_result(
            [decode_manifest(raw) for raw in self.state.manifests.get(msg.user, [])]
        )
