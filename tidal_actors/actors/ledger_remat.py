"""The re-materialization half of a ledger shard: the rebuilds it runs for the
coordinator (`core.remat` for the plan, `storage.rematerialize.RematJob` for the
job reading the history), one chunk a step, dropped when the coordinator says so.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tidal_actors._errors import UnknownCohort
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.core.states import LedgerState

if TYPE_CHECKING:
    from tidal_actors.storage.rematerialize import RematJob

__all__ = ["LedgerRebuilds"]


class LedgerRebuilds(Behaviour):
    """The rebuilds half of `LedgerShard` (its base class)."""

    state: LedgerState
    address: M.Address

    def _init_rebuilds(self) -> None:
        self._jobs: dict[M.RematToken, RematJob] = {}
        # re-materializations the coordinator ended at the restart (`_on_remat_start`)
        self._ended_remats: set[M.RematToken] = set()
        for kind, fn in (
            (M.RematStart, self._on_remat_start),
            (M.RematStep, self._on_remat_step),
            (M.RematAbort, self._on_remat_abort),
        ):
            self.on(kind, fn)

    def _settle(self) -> None:
        """Settle what may be settled (`LedgerShard._settle`)."""
        raise NotImplementedError

    def rebuilding(self) -> None:
        """`LedgerViews.rebuilding`."""
        raise NotImplementedError

    def _on_remat_start(self, msg: M.RematStart) -> None:
        from tidal_actors.storage.rematerialize import RematJob

        if msg.token in self._ended_remats:
            # ended by the coordinator when this shard restarted: nobody commits it
            self._ended_remats.discard(msg.token)
            return
        try:
            self._jobs[msg.token] = RematJob(self.state, msg.cohort, msg.covered, self.ctx.config)
        except Exception as exc:  # answer the coordinator (and its caller), then count it
            self.ctx.tell(
                M.COORD_ADDR, M.RematDone(msg.token, msg.cohort, error=self.failure(msg, exc))
            )
            raise
        self.ctx.tell(self.address, M.RematStep(msg.token))

    def _on_remat_step(self, msg: M.RematStep) -> None:
        if msg.token in self._jobs and not self._advance(msg.token):
            self.ctx.tell(self.address, M.RematStep(msg.token))  # let other messages in

    def _on_remat_abort(self, msg: M.RematAbort) -> None:
        # nothing of a rebuild is visible before `RematJob.finish`: dropping it
        # leaves the live state as it is (settling resumes)
        if self._jobs.pop(msg.token, None) is not None:
            self._settle()

    def _advance(self, token: M.RematToken) -> bool:
        """One chunk of a running re-materialization; True once it has finished.

        Called from its own step messages and after each attribution batch, so a
        busy mailbox cannot starve it."""
        job = self._jobs[token]
        try:
            if not job.step():
                return False
            # known: something was ever attributed here (the key table only grows)
            known = job.read > 0 or self.state.aggregates.cohort_id(job.cohort) is not None
            self.rebuilding()  # it may rewrite the cohort's keys: views republished
            read, excluded, matched, per_user = job.finish()
            del self._jobs[token]
            self.ctx.tell(
                M.COORD_ADDR,
                M.RematDone(
                    token,
                    job.cohort,
                    read,
                    excluded,
                    matched,
                    per_user,
                    time.perf_counter() - job.t0,
                    None
                    if known
                    else UnknownCohort(f"nothing was ever attributed to cohort {job.cohort!r}"),
                ),
            )
        except Exception as exc:
            self._jobs.pop(token, None)
            # a TidalError as is, anything else as ActorFailure (the caller's error)
            self.ctx.tell(
                M.COORD_ADDR,
                M.RematDone(token, job.cohort, error=self.failure(M.RematStep(token), exc)),
            )
            raise
        return True
