"""The set-up of a scenario with ``assign_upfront``: every user joins its cohorts
before the measured run, from many callers at once on the threaded runtime, so
the persistence actor commits the assignments in groups (not measured).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

from tidal_actors._clock import ManualClock
from tidal_actors.eventlog.log import ApplyCounts, AssignRow, EventRow
from tidal_actors.loadsim.phases import PhaseFn, Tick, no_phase

__all__ = ["SETUP_CALLERS", "assign_from", "set_up"]

SETUP_CALLERS = 64
"""Threads the set-up assigns from: each waits for its own commit, so a commit
carries at most this many assigns."""


def assign_from(db: Any, per_user: list[tuple[int, list[str]]], callers: int, tick: Tick) -> None:
    """Assign each user its cohorts (in order) from ``callers`` threads, user ``k`` by
    thread ``k % callers``; ``tick`` (in this thread, every 0.1 s) sees the assigns
    done. Raises the first error a thread met (the others stop at their next user)."""
    done = [0] * callers
    errors: list[BaseException] = []

    def work(k: int) -> None:
        assign = db.assign_cohort
        try:
            for user, cohorts in per_user[k::callers]:
                if errors:
                    return
                for cohort in cohorts:
                    assign(user, cohort)
                done[k] += len(cohorts)
        except BaseException as exc:  # noqa: BLE001 - raised by the caller's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(k,), name=f"tidal-simulate-setup-{k}", daemon=True)
        for k in range(callers)
    ]
    for t in threads:
        t.start()
    ticked = 0
    for t in threads:
        while t.is_alive():
            t.join(0.1)
            now = sum(done)
            tick(now - ticked)
            ticked = now
    tick(sum(done) - ticked)
    if errors:
        raise errors[0]


def set_up(
    db: Any,
    events: list[EventRow],
    clock: ManualClock,
    counts: ApplyCounts,
    rows: Iterator[EventRow],
    phase: PhaseFn = no_phase,
) -> int:
    """Apply the leading ``assign`` rows (``assign_upfront``), taking them from
    ``rows``; returns how many. On the runtime, `SETUP_CALLERS` at once (`assign_from`:
    one user's rows stay in order), so the persistence actor commits them in
    groups. ``phase`` sees the assignments done."""
    n = 0
    while n < len(events) and isinstance(events[n], AssignRow):
        n += 1
    if not n:
        return 0
    per_user: dict[int, list[str]] = {}
    taken = 0  # fewer than n if ``rows`` stops early (a stop asked for)
    for row in itertools.islice(rows, n):
        assert isinstance(row, AssignRow)  # ``rows`` yields ``events`` in order
        per_user.setdefault(row.user_id, []).append(row.cohort)
        taken += 1
    if not taken:
        return 0
    n = taken
    clock.set(events[0].ts_ns)

    with phase("set-up: users join their cohorts", n, "assign") as tick:
        if getattr(db, "_core", None) is None:  # not the threaded runtime: in order
            for user, cohorts in per_user.items():
                for cohort in cohorts:
                    db.assign_cohort(user, cohort)
                tick(len(cohorts))
        else:
            assign_from(db, list(per_user.items()), SETUP_CALLERS, tick)
    counts.assigns += n
    counts.rows += n
    counts.first_ts_ns = events[0].ts_ns
    counts.max_ts_ns = events[n - 1].ts_ns
    return n
