"""Re-materializations of purged cohorts in event time, for replays.

The runtime re-materializes a purged cohort ``Config.rematerialize_after_ms`` after
the purge in *wall* time (a timer on the coordinator); the rebuild stamps its
``PurgeStatus.rematerialized_at_ns`` with the database clock, which during a replay
is the event time. Left to the timer, that stamp would depend on how fast the
replay ran. :class:`EventTimeRebuilds` makes it a function of the log alone: the
replay opens the runtime with the timer off and lets this schedule run each rebuild
itself when the *event* time reaches the purge's ``ts_ns`` plus the same delay.

The rules (they mirror the runtime's timer, with event time for wall time):

- a purge of cohort ``c`` at ``ts`` makes ``c`` due at ``ts + delay`` unless ``c`` is
  already due (later purges within the delay are coalesced into that rebuild);
- before the first row with ``ts_ns >= due`` is applied, the signals before it are
  flushed and ``c`` is re-materialized with the clock set to ``due``, so every
  purge it completes records ``rematerialized_at_ns == due``;
- :meth:`EventTimeRebuilds.finish` (a replay that reached the end of its log) runs
  the rebuilds still due, each at its due time; with the delay off (``None``) they
  all run there, at the last event time;
- a replay stopped early keeps :meth:`EventTimeRebuilds.pending` (the settings file
  holds it) so that a later ``--append`` of the rest of the log continues them:
  the store then equals one uninterrupted replay's.

It drives any object with ``flush()`` and ``rematerialize(cohort)`` (``TidalDb`` or
the reference model) and must not know how the database works inside.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from tidal_actors._clock import ManualClock
from tidal_actors._errors import InvalidArgument, UnknownCohort

__all__ = ["NEVER", "EventTimeRebuilds", "delay_ns_of"]

NEVER = 2**63
"""``next_due_ns`` when nothing is due (above every valid timestamp)."""
_MAX_TS = 2**63 - 1


def delay_ns_of(rematerialize_after_ms: float | None) -> int | None:
    """``Config.rematerialize_after_ms`` (float ms, or None: off) as int ns (or None)."""
    if rematerialize_after_ms is None:
        return None
    return round(float(rematerialize_after_ms) * 1_000_000)


class EventTimeRebuilds:
    """The purged cohorts waiting for their re-materialization, by event time.

    Args:
        delay_ns: int ns from a cohort's first pending purge to its rebuild (>= 0),
            or None: rebuild only in :meth:`finish`, at the end of the log.
        pending: cohorts already waiting (from a stopped replay's settings file):
            cohort name -> due time (int ns since the epoch), or None for "at the end".

    Attributes:
        next_due_ns: the earliest due time (int ns), :data:`NEVER` if none; a caller
            compares each row's ``ts_ns`` with it and calls :meth:`run_due`.
        done: ``(cohort, at_ns)`` of each rebuild run, in order.

    Raises:
        InvalidArgument: a negative delay, or a bad ``pending`` entry (field named).
    """

    def __init__(
        self, delay_ns: int | None, pending: Mapping[str, int | None] | None = None
    ) -> None:
        if delay_ns is not None and (
            isinstance(delay_ns, bool) or not isinstance(delay_ns, int) or delay_ns < 0
        ):
            raise InvalidArgument("delay_ns", delay_ns, "must be None or an int >= 0")
        self.delay_ns = delay_ns
        self._due: dict[str, int | None] = {}
        for cohort, due in dict(pending or {}).items():
            if not isinstance(cohort, str) or not (
                due is None
                or (isinstance(due, int) and not isinstance(due, bool) and 0 <= due <= _MAX_TS)
            ):
                raise InvalidArgument(
                    "pending_rematerializations",
                    {cohort: due},
                    "must map cohort names to int ns or null",
                )
            self._due[cohort] = due
        self.done: list[tuple[str, int]] = []
        self.next_due_ns = NEVER
        self._update()

    def _update(self) -> None:
        self.next_due_ns = min((d for d in self._due.values() if d is not None), default=NEVER)

    def purged(self, cohort: str, ts_ns: int) -> None:
        """Note a purge of ``cohort`` applied at event time ``ts_ns`` (int ns)."""
        if cohort in self._due:
            return  # coalesced into the rebuild already due
        self._due[cohort] = None if self.delay_ns is None else min(ts_ns + self.delay_ns, _MAX_TS)
        self._update()

    def pending(self) -> dict[str, int | None]:
        """The cohorts still waiting: name -> due time (int ns) or None (at the end)."""
        return dict(self._due)

    def run_due(self, db: Any, clock: ManualClock, now_ns: int) -> None:
        """Run every rebuild due at or before ``now_ns`` (int ns), earliest first, each
        with ``clock`` at its due time. The caller has sent every row before ``now``.

        Raises:
            Whatever ``db.flush`` or ``db.rematerialize`` raises (``UnknownCohort``,
            a cohort that never had a contribution, is not an error: nothing to do).
        """
        due = sorted((d, c) for c, d in self._due.items() if d is not None and d <= now_ns)
        for at, cohort in due:
            self._run(db, clock, cohort, at)

    def finish(self, db: Any, clock: ManualClock, end_ns: int) -> None:
        """Run every rebuild still waiting: at its due time, or at ``end_ns`` (int ns,
        the last event time) for those with no delay. Raises as :meth:`run_due`."""
        waiting = sorted((end_ns if d is None else d, c) for c, d in self._due.items())
        for at, cohort in waiting:
            self._run(db, clock, cohort, at)

    def _run(self, db: Any, clock: ManualClock, cohort: str, at_ns: int) -> None:
        # every signal sent so far reaches the ledgers first, so what the rebuild
        # reads (and the floats it sums) does not depend on the actors' timing
        db.flush()
        clock.set(at_ns)
        with contextlib.suppress(UnknownCohort):
            db.rematerialize(cohort)
        del self._due[cohort]
        self.done.append((cohort, at_ns))
        self._update()
