"""Applying an event log: :func:`apply_events` drives any object with the database
API (``TidalDb`` or the reference model, :class:`EventSink`) through typed rows
(`rows`) in event time, counting what it applied; :func:`settle_rematerializations`
runs the rebuilds of purged cohorts now, before a comparison. It must not know how
the database works inside.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from tidal_actors._clock import ManualClock
from tidal_actors._errors import UnknownCohort
from tidal_actors._types import PurgeId, PurgeManifest, Signal
from tidal_actors.eventlog.rows import AssignRow, EventRow, LeaveRow, RejoinRow, SignalRow

__all__ = ["ApplyCounts", "EventSink", "apply_events", "settle_rematerializations"]


class EventSink(Protocol):
    """The part of the database API that :func:`apply_events` drives."""

    def assign_cohort(self, user_id: int, cohort: str) -> None: ...

    def signal_batch(self, signals: Iterable[Signal]) -> None: ...

    def leave_community_layer(self, user_id: int) -> None: ...

    def rejoin_community_layer(self, user_id: int) -> None: ...

    def request_community_purge(
        self, user_id: int, cohort_name: str
    ) -> tuple[PurgeId, PurgeManifest]: ...


@dataclass
class ApplyCounts:
    """What :func:`apply_events` has applied so far (updated in place as it goes).

    ``manifest_entries`` is the number of contribution records listed in the
    manifests returned, ``manifest_evicted`` the sum of their ``evicted`` (records
    of the purged pairs the log had evicted before the purge); ``first_ts_ns`` / ``max_ts_ns`` bound the event times seen
    (int ns, None before the first row); ``last_ts_ns`` is the last row's time and
    ``back_in_time`` counts the rows earlier than the row before them (legal: each
    row is applied at its own ``ts_ns``; an equal time is not earlier).
    """

    rows: int = 0
    signals: int = 0
    assigns: int = 0
    leaves: int = 0
    rejoins: int = 0
    purges: int = 0
    manifests: int = 0
    manifest_entries: int = 0
    manifest_evicted: int = 0
    first_ts_ns: int | None = None
    max_ts_ns: int | None = None
    last_ts_ns: int | None = None
    back_in_time: int = 0


def apply_events(
    db: EventSink,
    rows: Iterable[EventRow],
    clock: ManualClock,
    *,
    batch_size: int = 1024,
    counts: ApplyCounts | None = None,
    manifests: list[PurgeManifest] | None = None,
    on_call: Callable[..., None] | None = None,
    rebuilds: Any = None,
) -> ApplyCounts:
    """Apply ``rows`` to ``db`` in order, each at its own event time.

    ``clock`` (the database's clock) is set to each row's ``ts_ns`` before the row
    is applied, so a leave's ``left_at_ns`` and a manifest's ``created_at_ns`` are
    their rows' times. Signals carry their row's ``ts_ns`` explicitly and are sent
    with ``db.signal_batch`` in runs of at most ``batch_size``; a pending run is sent
    before any control row, so every operation sees exactly the signals before it.

    Args:
        db: a ``TidalDb`` or anything with the same API (:class:`EventSink`).
        rows: typed rows, e.g. from :class:`EventLogReader`.
        clock: the ``ManualClock`` the database was opened with.
        batch_size: the longest run of signals sent in one ``signal_batch`` (>= 1).
        counts: updated in place (so a caller still has the counts if a row raises);
            a new one is made if None.
        manifests: if given, every manifest returned by a purge is appended to it.
        on_call: if given, called after each database call as ``on_call(op,
            seconds)`` (``op``: ``"assign"``, ``"leave"``, ``"rejoin"``, ``"purge"``),
            or ``on_call("signal", seconds, n)`` for a run of ``n`` signals; wall
            seconds from ``time.perf_counter``.
        rebuilds: if given, a :class:`~tidal_actors.eventlog.rebuilds.EventTimeRebuilds`:
            told of every purge applied, and run (pending signals sent first) before
            the first row whose ``ts_ns`` reaches its ``next_due_ns``, so purged
            cohorts are re-materialized at event times the log alone determines.

    Returns:
        ``counts``.

    Raises:
        Whatever ``rows`` raises (e.g. :class:`EventLogError`) or ``db`` raises; every
        row before the failing one has been applied (pending signals are sent first).
    """
    if counts is None:
        counts = ApplyCounts()
    batch_size = max(1, int(batch_size))
    pending: list[Signal] = []

    now = time.perf_counter

    def send() -> None:
        run = list(pending)
        pending.clear()
        t = now()
        db.signal_batch(run)
        if on_call is not None:
            on_call("signal", now() - t, len(run))

    try:
        for row in rows:
            ts = row.ts_ns
            if rebuilds is not None and ts >= rebuilds.next_due_ns:
                if pending:
                    send()
                rebuilds.run_due(db, clock, ts)
            if counts.first_ts_ns is None:
                counts.first_ts_ns = ts
            if counts.max_ts_ns is None or ts > counts.max_ts_ns:
                counts.max_ts_ns = ts
            if counts.last_ts_ns is not None and ts < counts.last_ts_ns:
                counts.back_in_time += 1
            counts.last_ts_ns = ts
            if isinstance(row, SignalRow):
                clock.set(ts)
                pending.append(Signal(row.user_id, row.entity_id, row.signal_type, row.weight, ts))
                counts.signals += 1
                counts.rows += 1
                if len(pending) >= batch_size:
                    send()
                continue
            if pending:
                send()
            clock.set(ts)
            t = now()
            if isinstance(row, AssignRow):
                db.assign_cohort(row.user_id, row.cohort)
                op = "assign"
                counts.assigns += 1
            elif isinstance(row, LeaveRow):
                db.leave_community_layer(row.user_id)
                op = "leave"
                counts.leaves += 1
            elif isinstance(row, RejoinRow):
                db.rejoin_community_layer(row.user_id)
                op = "rejoin"
                counts.rejoins += 1
            else:
                _, manifest = db.request_community_purge(row.user_id, row.cohort)
                op = "purge"
                counts.purges += 1
                counts.manifests += 1
                counts.manifest_entries += len(manifest.entries)
                counts.manifest_evicted += manifest.evicted
                if manifests is not None:
                    manifests.append(manifest)
                if rebuilds is not None:
                    rebuilds.purged(row.cohort, ts)
            if on_call is not None:
                on_call(op, now() - t)
            counts.rows += 1
    finally:
        if pending:
            send()
    return counts


def settle_rematerializations(db: Any, cohorts: Iterable[str | None]) -> None:
    """Re-materialize each purged cohort now (runtime or reference model), so that a
    comparison does not depend on when the background rebuilds ran.

    A purge retracts the pair's live records at once; its cohort's re-materialization
    (which also leaves out the records the log had evicted) follows
    ``Config.rematerialize_after_ms`` later in the runtime, and only on request in the
    reference model. Once the log has evicted records, the aggregates differ until
    both have run it; a reopen resumes a pending one. Settling before every
    comparison (the check, and the figures taken before a close) compares the same
    thing on both sides. A cohort that never had a contribution is skipped.
    """
    for cohort in sorted({c for c in cohorts if c is not None}):
        with contextlib.suppress(UnknownCohort):
            db.rematerialize(cohort)
