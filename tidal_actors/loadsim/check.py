"""The differential check: what the runtime answers against what the reference
model (the oracle, injected by the caller of
:func:`~tidal_actors.loadsim.simulate.run_simulation`) answers, and the exact
comparison of a store's figures across a close and reopen."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._types import CommunityMembership, LeaveEpoch, PurgeManifest
from tidal_actors.eventlog.log import EventSink

__all__ = [
    "ABS_TOL",
    "REL_TOL",
    "CheckResult",
    "Oracle",
    "Readable",
    "ReferenceFactory",
    "compare_states",
    "differences",
    "figures",
]

REL_TOL = 1e-9
"""Relative tolerance of float comparisons in the check."""
ABS_TOL = 1e-12
"""Absolute tolerance: scores this close to 0 are equal whatever their ratio."""


@dataclass
class CheckResult:
    """The outcome of comparing the runtime with the reference model.

    Attributes:
        ok: True when nothing differed.
        aggregate_rows: aggregate rows compared (the reference's count).
        users: users whose status, leave history, cohorts and manifests were compared.
        manifests: manifests compared.
        mismatches: total number of differences found.
        details: the first differences, one line each.
    """

    ok: bool = True
    aggregate_rows: int = 0
    users: int = 0
    manifests: int = 0
    mismatches: int = 0
    details: list[str] = field(default_factory=list)

    def fail(self, message: str, keep: int = 20) -> None:
        """Record one difference."""
        self.ok = False
        self.mismatches += 1
        if len(self.details) < keep:
            self.details.append(message)


class Readable(Protocol):
    """What the check reads of the runtime and of the reference model alike."""

    def aggregate_rows(
        self, at_ns: int | None = None
    ) -> list[tuple[str, int, int, float, int, float]]: ...

    def community_layer_status(self, user_id: int) -> CommunityMembership: ...

    def community_leave_history(self, user_id: int) -> list[LeaveEpoch]: ...

    def cohorts_of(self, user_id: int) -> frozenset[str]: ...

    def list_purge_manifests(self, user_id: int) -> list[PurgeManifest]: ...

    def stats(self) -> dict[str, int]: ...


class Oracle(EventSink, Readable, Protocol):
    """The reference model as the check uses it: it takes the rows and answers the
    reads, single-threaded and in order."""


class ReferenceFactory(Protocol):
    """Builds the oracle (``tidal_actors.testing.ReferenceModel`` fits): the run's
    ``config``, the oracle's own ``clock``, and ``history`` False when the runtime it
    is compared with keeps no history to re-materialize from."""

    def __call__(self, config: Config, clock: ManualClock, *, history: bool) -> Oracle: ...


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def compare_states(
    db: Readable,
    ref: Readable,
    at_ns: int,
    users: Iterable[int],
    stats: Mapping[str, int] | None = None,
    tick: Callable[[int], None] | None = None,
) -> CheckResult:
    """Compare everything observable of ``db`` with ``ref`` at ``at_ns`` (int ns).

    Compared: every aggregate row (same keys; decay score and window weight to
    relative 1e-9, window count exactly), each of ``users``' status, ``left_at_ns``,
    leave history, cohorts and manifests (cohort, ``created_at_ns``, number of
    entries, ``evicted``, and the entries themselves as multisets), and the counters
    ``signals``, ``forwarded``, ``gated``, ``records``, ``purges``, ``retracted``
    (``stats``, if given, stands for ``db.stats()``: counters summed over the runs of a
    store that was closed and reopened). ``tick(1)`` is called after each user.

    Returns:
        A :class:`CheckResult`.
    """
    result = CheckResult()
    mine = {r[:3]: r[3:] for r in db.aggregate_rows(at_ns)}
    theirs = {r[:3]: r[3:] for r in ref.aggregate_rows(at_ns)}
    result.aggregate_rows = len(theirs)
    for key in sorted(theirs.keys() | mine.keys()):
        a, b = mine.get(key), theirs.get(key)
        if (
            a is None
            or b is None
            or not (_close(a[0], b[0]) and a[1] == b[1] and _close(a[2], b[2]))
        ):
            result.fail(f"aggregate {key}: runtime {a}, reference {b}")
    for user in users:
        result.users += 1
        for what, x, y in (
            ("status", db.community_layer_status(user), ref.community_layer_status(user)),
            (
                "leave history",
                list(db.community_leave_history(user)),
                list(ref.community_leave_history(user)),
            ),
            ("cohorts", db.cohorts_of(user), ref.cohorts_of(user)),
        ):
            if x != y:
                result.fail(f"user {user} {what}: runtime {x}, reference {y}")
        ms, rs = db.list_purge_manifests(user), ref.list_purge_manifests(user)
        if len(ms) != len(rs):
            result.fail(f"user {user}: runtime {len(ms)} manifests, reference {len(rs)}")
        for m, r in zip(ms, rs):
            result.manifests += 1
            got = (m.cohort, m.created_at_ns, len(m.entries), m.evicted)
            want = (r.cohort, r.created_at_ns, len(r.entries), r.evicted)
            if got != want or sorted(m.entries) != sorted(r.entries):
                result.fail(
                    f"user {user} manifest {m.purge_id}: runtime (cohort, created_at_ns, "
                    f"entries, evicted) {got}, reference {want}"
                )
        if tick is not None:
            tick(1)
    s1, s2 = (db.stats() if stats is None else stats), ref.stats()
    for name in ("signals", "forwarded", "gated", "records", "purges", "retracted"):
        if s1.get(name) != s2.get(name):
            result.fail(f"stats[{name!r}]: runtime {s1.get(name)}, reference {s2.get(name)}")
    return result


def figures(db: Readable, at_ns: int, users: Iterable[int]) -> dict[str, Any]:
    """Everything a reopen must keep, for an exact comparison (floats bit for bit)."""
    return {
        "rows": db.aggregate_rows(at_ns),
        "users": {
            u: (
                db.community_layer_status(u),
                list(db.community_leave_history(u)),
                db.cohorts_of(u),
                db.list_purge_manifests(u),
            )
            for u in users
        },
    }


def differences(before: dict[str, Any], after: dict[str, Any], keep: int = 10) -> list[str]:
    out: list[str] = []
    a, b = before["rows"], after["rows"]
    if a != b:
        da, db_ = {r[:3]: r for r in a}, {r[:3]: r for r in b}
        for key in sorted(da.keys() | db_.keys()):
            if da.get(key) != db_.get(key):
                out.append(f"row {key}: before {da.get(key)}, after {db_.get(key)}")
                if len(out) >= keep:
                    return out
    for u, x in before["users"].items():
        if after["users"].get(u) != x:
            out.append(f"user {u}: before {x}, after {after['users'].get(u)}")
            if len(out) >= keep:
                break
    return out
