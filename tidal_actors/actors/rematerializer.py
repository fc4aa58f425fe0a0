"""The coordinator's re-materialization of cohorts after purges, one at a time.

A purge schedules its cohort's rebuild ``Config.rematerialize_after_ms`` later (wall
time, coalescing the purges that land meanwhile); `rematerialize` asks for one now.
The rebuild runs at the cohort's ledger shard (`storage.rematerialize.RematJob`
stepping a `core.remat.Rebuild`), then the purged records are erased from the history
and the purges marked re-materialized in one transaction. A purge of the cohort being
rebuilt does not wait for the rebuild: the rebuild gives way (`_yield_remat`: dropped
at its ledger, where nothing of it is visible yet, and started again once the purge
has ended, covering it too), at most ``REMAT_YIELDS`` times in a row for one cohort so
that a cohort purged again and again is still rebuilt; past that, or once the
rebuild's result is committing, the purge waits for it
(`PurgeCoordinator._next_purge`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tidal_actors._errors import UnknownCohort
from tidal_actors._types import PurgeStatus, RematerializationReport
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.reply import Reply
from tidal_actors.core.states import CoordinatorState
from tidal_actors.storage.format import ledger_shard_of, status_op

__all__ = ["REMAT_RETRIES", "REMAT_RETRY_S", "REMAT_YIELDS", "RematInFlight", "Rematerializer"]

# a failed rebuild is tried again after REMAT_RETRY_S, doubling, at most REMAT_RETRIES
# times in a row (only while the timer is on, `Rematerializer._retry_remat`)
REMAT_RETRY_S = 0.1
REMAT_RETRIES = 6
# a rebuild gives way to a purge of its cohort at most REMAT_YIELDS times in a row
REMAT_YIELDS = 2


@dataclass(slots=True)
class RematInFlight:
    """The re-materialization in progress: its cohort, the token its messages carry,
    the purges it covers (``covered``: user -> highest bound, `CoordinatorState.covered`;
    ``upto``: the last purge id committed when it started) and, once the rebuild is
    done, what it commits: the purges' new statuses with their bounds (``updates``;
    None until then), the report, and the error its waiters get (an
    `UnknownCohort` ends its purges all the same)."""

    cohort: str
    token: M.RematToken
    covered: dict[int, int]
    upto: int
    updates: list[tuple[PurgeStatus, int]] | None = None
    report: RematerializationReport | None = None
    waiter_error: BaseException | None = None


class Rematerializer(Behaviour):
    """The re-materialization half of `PurgeCoordinator` (its base class)."""

    state: CoordinatorState

    def _init_remat(self) -> None:
        self._remat: RematInFlight | None = None
        self._remat_queue: list[str] = []
        self._remat_waiters: dict[str, list[Reply]] = {}
        self._remat_due: dict[str, float] = {}
        self._remat_seq = 0
        # cohort -> rebuilds of it failed in a row (`_retry_remat`), and given way to
        # a purge in a row (`_yield_remat`)
        self._remat_failures: dict[str, int] = {}
        self._remat_yields: dict[str, int] = {}
        # rebuilds that gave way, by token -> cohort; and per cohort the records those
        # that were swapped in anyway left out (excluded, per user), which the next
        # rebuild of the cohort no longer finds, so its report and statuses take them
        self._yielded: dict[M.RematToken, str] = {}
        self._carried: dict[str, tuple[int, dict[int, int]]] = {}
        for kind, fn in (
            (M.Rematerialize, self._on_rematerialize),
            (M.RematDone, self._on_remat_done),
            (M.ResumeRematerialization, self._on_resume),
            (M.Tick, self._on_tick),
        ):
            self.on(kind, fn)

    def _next_purge(self) -> None:
        """Start the next waiting purge (`PurgeCoordinator._next_purge`)."""
        raise NotImplementedError

    def _purging_cohort(self) -> str | None:
        """The cohort of the purge in progress, if any (`PurgeCoordinator`)."""
        raise NotImplementedError

    def _schedule_remat(self, cohort: str) -> None:
        """Re-materialize ``cohort`` ``Config.rematerialize_after_ms`` from now (wall
        time), coalescing the purges that land meanwhile into one rebuild."""
        delay = self.ctx.config.rematerialize_after_ms
        if delay is None:
            return
        if cohort not in self._remat_due:
            self._remat_due[cohort] = self._monotonic() + delay / 1000.0
            self._wake_ticker()

    def _wake_ticker(self) -> None:
        """Wake the host's flusher thread (it may sleep; it sends the `Tick`s), called
        after a rebuild was added to ``_remat_due``."""
        wake = getattr(self.ctx, "wake_ticker", None)
        if wake is not None:
            wake()

    def _monotonic(self) -> float:
        # an operational delay, not domain time: the host's monotonic seconds (the
        # deterministic harness supplies its own)
        fn = getattr(self.ctx, "monotonic", None)
        return float(fn()) if fn is not None else time.monotonic()

    def _on_tick(self, msg: M.Tick) -> None:
        now = self._monotonic()
        for cohort, due in list(self._remat_due.items()):
            if due <= now:
                del self._remat_due[cohort]
                self._queue_remat(cohort)

    @property
    def remat_due(self) -> bool:
        """Whether a scheduled re-materialization waits for a tick (read by the host)."""
        return bool(self._remat_due)

    def _queue_remat(self, cohort: str, waiter: Reply | None = None) -> None:
        self._remat_due.pop(cohort, None)
        if waiter is not None:
            self._remat_waiters.setdefault(cohort, []).append(waiter)
        running = self._remat is not None and self._remat.cohort == cohort
        if not running and cohort not in self._remat_queue:
            self._remat_queue.append(cohort)
        self._start_remat()

    def _start_remat(self) -> None:
        """Start the next queued re-materialization, skipping a cohort whose purge is
        in progress (its retraction must reach the ledger before the rebuild starts;
        it is started again when that purge ends)."""
        if self._remat is not None or not self._remat_queue:
            return
        busy = self._purging_cohort()
        ready = [c for c in self._remat_queue if c != busy]
        if not ready:
            return
        cohort = ready[0]
        self._remat_queue.remove(cohort)
        self._remat_due.pop(cohort, None)  # it covers every purge committed so far
        self._remat_seq += 1
        token = ("remat", self._remat_seq)
        # the purges it covers: every one committed so far (later ones of this cohort
        # wait, deferred, until it ends)
        covered = self.state.covered(cohort)
        self._remat = RematInFlight(cohort, token, covered, self.state.last_purge_id)
        li = ledger_shard_of(cohort, self.ctx.config.ledger_shards)
        self.ctx.tell((M.LEDGER, li), M.RematStart(cohort, covered, token))

    def _yield_remat(self) -> bool:
        """Let a purge of the cohort being rebuilt go first: drop the rebuild at its
        ledger and queue the cohort again (it starts once the purge has ended, since
        `_start_remat` skips the cohort of the purge in progress, and covers that
        purge). Its waiters wait for the next rebuild. False, and nothing changes, if
        the rebuild's result is committing or it gave way ``REMAT_YIELDS`` times in a
        row already.

        Dropping is safe wherever the rebuild stands: nothing of it is visible before
        the ledger swaps it in (`core.remat.Rebuild.finish`); if it finished before the
        `RematAbort` arrived, the swapped-in state holds every record but those of
        purges committed before it started, which is the live state those purges
        left; the purge that follows is prepared after it, at the same ledger, in
        order. Its `RematDone` then only hands on what it left out: the next rebuild
        of the cohort no longer finds those records, so its report and the purges'
        statuses count them (`_on_remat_done`)."""
        r = self._remat
        if r is None or r.updates is not None:
            return False
        n = self._remat_yields.get(r.cohort, 0)
        if n >= REMAT_YIELDS:
            return False
        self._remat_yields[r.cohort] = n + 1
        self._yielded[r.token] = r.cohort
        self._remat = None
        li = ledger_shard_of(r.cohort, self.ctx.config.ledger_shards)
        self.ctx.tell((M.LEDGER, li), M.RematAbort(r.token))
        if r.cohort not in self._remat_queue:
            self._remat_queue.insert(0, r.cohort)
        return True

    def _retry_remat(self, cohort: str) -> None:
        """A rebuild of ``cohort`` failed (a ledger restart, a failing step, a failed
        commit): its purges still wait for one, so it is scheduled again, after
        ``REMAT_RETRY_S`` doubling per failure in a row, at most ``REMAT_RETRIES``
        times (then the next open resumes it, `ResumeRematerialization`). With the
        timer off (``Config.rematerialize_after_ms`` None) nothing is retried, as
        nothing is resumed at open: rebuilds run only when `rematerialize` is
        called, and a failed one raised to its caller."""
        if self.ctx.config.rematerialize_after_ms is None:
            return
        if not any(
            s.cohort == cohort and not s.rematerialized for s, _ in self.state.statuses.values()
        ):
            return
        n = self._remat_failures.get(cohort, 0)
        if n >= REMAT_RETRIES:
            return
        self._remat_failures[cohort] = n + 1
        due = self._monotonic() + REMAT_RETRY_S * 2**n
        self._remat_due[cohort] = min(due, self._remat_due.get(cohort, due))
        self._wake_ticker()

    def _on_rematerialize(self, msg: M.Rematerialize) -> None:
        self._queue_remat(msg.cohort, msg.reply)

    def _on_resume(self, msg: M.ResumeRematerialization) -> None:
        for status, _ in sorted(self.state.statuses.values(), key=lambda x: x[0].purge_id):
            if not status.rematerialized:
                self._queue_remat(status.cohort)

    def _on_remat_done(self, msg: M.RematDone) -> None:
        r = self._remat
        if r is None or r.token != msg.token:
            cohort = self._yielded.pop(msg.token, None)
            if cohort is not None and msg.error is None and msg.per_user:
                # swapped in before it heard it gave way (`_yield_remat`); this comes
                # before the next rebuild's result (one ledger, in order)
                excluded, per = self._carried.get(cohort, (0, {}))
                per = dict(per)
                for user, n in msg.per_user.items():
                    per[user] = per.get(user, 0) + n
                self._carried[cohort] = (excluded + msg.excluded, per)
            return
        cohort = r.cohort
        if msg.error is not None and not isinstance(msg.error, UnknownCohort):
            self._remat_finished(error=msg.error)
            return
        # an unknown cohort has nothing to rebuild: its purges are done all the same
        r.waiter_error = msg.error
        now = self.ctx.clock.now_ns()
        per_user = dict(msg.per_user or {})
        for token in [t for t, c in self._yielded.items() if c == cohort]:
            del self._yielded[token]  # dropped before they finished: no result comes
        carried, carried_per_user = self._carried.get(cohort, (0, {}))
        for user, n in carried_per_user.items():
            per_user[user] = per_user.get(user, 0) + n
        updates: list[tuple[PurgeStatus, int]] = []
        for pid, (status, bound) in sorted(self.state.statuses.items(), reverse=True):
            if status.cohort != cohort or status.rematerialized or pid > r.upto:
                continue
            extra = per_user.pop(status.user_id, 0)  # counted on the pair's latest purge
            updates.append(
                (
                    PurgeStatus(
                        status.purge_id,
                        status.user_id,
                        cohort,
                        status.retracted_live,
                        True,
                        now,
                        extra,
                    ),
                    bound,
                )
            )
        r.updates = updates
        r.report = RematerializationReport(
            cohort, msg.read + carried, msg.excluded + carried, msg.seconds, msg.matched
        )
        ops: list[tuple[str, bytes, bytes | None]] = [status_op(s, b) for s, b in updates]
        # erase only what the purges this rebuild completes cover: an earlier purge's
        # records went in the same transaction that marked it re-materialized (the
        # latest purge of a pair has its highest bound, which covers the earlier ones)
        erase: dict[int, int] = {}
        for status, bound in updates:
            erase[status.user_id] = max(erase.get(status.user_id, -1), bound)
        self.ctx.tell(M.PERSIST_ADDR, M.EraseHistory(cohort, erase, ops, (self.address, msg.token)))

    def _remat_committed(self, msg: M.Committed) -> None:
        r = self._remat
        assert r is not None
        if msg.error is not None:
            self._remat_finished(error=msg.error)
            return
        assert r.updates is not None  # the history's erasure is sent once they are known
        for status, bound in r.updates:
            self.state.statuses[int(status.purge_id)] = (status, bound)
        self._carried.pop(r.cohort, None)  # counted in these statuses
        self._remat_finished(report=r.report, error=r.waiter_error)

    def _remat_finished(
        self, report: RematerializationReport | None = None, error: BaseException | None = None
    ) -> None:
        r, self._remat = self._remat, None
        assert r is not None
        self._remat_yields.pop(r.cohort, None)
        if error is None or isinstance(error, UnknownCohort):
            self._remat_failures.pop(r.cohort, None)
        else:
            self._retry_remat(r.cohort)
        for w in self._remat_waiters.pop(r.cohort, []):
            if error is None:
                w.set_result(report)
            else:
                w.set_exception(error)
        self._next_purge()
        self._start_remat()
