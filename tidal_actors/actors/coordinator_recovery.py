"""The purge coordinator's side of a shard's restart (`actors.recovery`): a ledger's
(`RecoverLedger`) and a membership shard's (`RecoverMembership`), and the end of a
purge they wait for (`_ended`). The base of `PurgeCoordinator`, which owns the
purges these end."""

from __future__ import annotations

from tidal_actors._errors import ActorFailure
from tidal_actors.actors import messages as M
from tidal_actors.actors.coordinator_purges import PendingPurge
from tidal_actors.actors.recovery import (
    ForgetMarkers,
    LedgerRecovery,
    RecoverLedger,
    RecoverMembership,
)
from tidal_actors.actors.rematerializer import Rematerializer
from tidal_actors.storage.format import ledger_shard_of

__all__ = ["CoordinatorRecovery"]


class CoordinatorRecovery(Rematerializer):
    """The restart half of `PurgeCoordinator` (its base class)."""

    _pending: PendingPurge | None
    _waiting: list[M.Purge]
    # restarts waiting for the purge being committed (`_on_recover`)
    _recoveries: list[RecoverLedger | RecoverMembership]
    # membership shard -> marker number of its newest purge ended (`LedgerRecovery`)
    _ended_upto: dict[int, int]

    def _fail_pending(self, exc: BaseException) -> None:
        raise NotImplementedError

    def _abandon(self, req: M.Purge, exc: BaseException) -> None:
        raise NotImplementedError

    def _ended(self, req: M.Purge) -> None:
        """``req`` committed or was abandoned: a restarting ledger hears of it, and
        the ledger restarts waiting for its commit go ahead."""
        m, n = req.mshard, req.marker[1]
        self._ended_upto[m] = max(self._ended_upto.get(m, -1), n)
        recoveries, self._recoveries = self._recoveries, []
        for msg in recoveries:
            if type(msg) is RecoverMembership:
                self._on_recover_membership(msg)
            else:
                self._on_recover(msg)  # type: ignore[arg-type]

    def _on_recover_membership(self, msg: RecoverMembership) -> None:
        """A membership shard restarts with its memory gone (`RecoverMembership`)."""
        m, p = msg.mshard, self._pending
        if p is not None and p.request.mshard == m and p.commit is not None:
            self._recoveries.append(msg)  # answered once the commit is in (`_ended`)
            return
        err = ActorFailure(
            f"membership[{m}] restarted during this purge; nothing of it was committed: "
            "request it again"
        )
        for q in [q for q in self._waiting if q.mshard == m]:
            self._waiting.remove(q)
            self._abandon(q, err)
        if p is not None and p.request.mshard == m:
            self._fail_pending(err)
        self._ended_upto[m] = max(self._ended_upto.get(m, -1), msg.below - 1)
        for li in range(self.ctx.config.ledger_shards):
            self.ctx.tell((M.LEDGER, li), ForgetMarkers(m, msg.below))
        msg.reply.set_result(None)

    def _on_recover(self, msg: RecoverLedger) -> None:
        """A ledger shard restarts from the store (`actors.recovery`): end what waits on
        the failed incarnation's memory, wait for a commit under way, then answer with
        the purges in flight."""
        li = msg.ledger
        p = self._pending
        on_li = (
            p is not None and ledger_shard_of(p.request.cohort, self.ctx.config.ledger_shards) == li
        )
        if p is not None and p.commit is not None:
            self._recoveries.append(msg)  # answered once the commit is in (`_ended`)
            return
        failed: list[str] = []  # the replies failed here, for the FaultReport
        if on_li:  # its preparation may have died with the shard: nothing is committed
            assert p is not None
            failed.append(p.request.reply.label or "purge")
            self._fail_pending(
                ActorFailure(
                    f"ledger[{li}] restarted during this purge; nothing of it was "
                    "committed: request it again"
                )
            )
        r = self._remat  # a rebuild whose job died with the shard (no result yet)
        nl = self.ctx.config.ledger_shards
        ended: tuple[M.RematToken, ...] = ()
        if r is not None and r.updates is None and ledger_shard_of(r.cohort, nl) == li:
            failed += [w.label or "rematerialize" for w in self._remat_waiters.get(r.cohort, [])]
            ended = (r.token,)  # its start may still be on its way to the shard
            self._remat_finished(
                error=ActorFailure(
                    f"ledger[{li}] restarted during this re-materialization; nothing of "
                    "it was applied: start it again"
                )
            )
        purges = [self._pending.request] if self._pending is not None else []
        in_flight = tuple(
            M.PurgeMarker(q.marker, q.mshard, q.user, q.cohort, q.bound)
            for q in purges + self._waiting
        )
        msg.reply.set_result(
            LedgerRecovery(in_flight, dict(self._ended_upto), tuple(failed), ended)
        )
