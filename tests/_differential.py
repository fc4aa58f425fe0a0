"""Shared helpers of the differential tests: compare a runtime with the reference model.

A "runtime" here is anything with TidalDb's blocking methods: a ``TidalDb`` itself, or
:class:`Blocking` around a ``Harness`` (each call runs the harness until its reply).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from tidal_actors import PurgeManifest
from tidal_actors.testing import Harness, ReferenceModel

REL = 1e-9
ABS = 1e-12  # float residue of an exact retraction: sums that should be 0.0 exactly


class Blocking:
    """TidalDb's blocking interface over a Harness: each call runs until its reply."""

    def __init__(self, harness: Harness) -> None:
        self.h = harness

    def __getattr__(self, name: str) -> Any:
        op = getattr(self.h, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.h.run(op(*args, **kwargs))

        return call


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=ABS)


def rows_mismatch(
    actual: Sequence[tuple[Any, ...]], expected: Sequence[tuple[Any, ...]]
) -> str | None:
    """None if the aggregate rows agree (keys and counts exactly, floats to REL)."""
    a = {r[:3]: r[3:] for r in actual}
    e = {r[:3]: r[3:] for r in expected}
    if a.keys() != e.keys():
        return f"keys differ: only actual {sorted(a.keys() - e.keys())}, only expected {sorted(e.keys() - a.keys())}"
    for k in sorted(e):
        (sa, ca, wa), (se, ce, we) = a[k], e[k]
        if ca != ce or not close(sa, se) or not close(wa, we):
            return f"row {k}: actual {a[k]}, expected {e[k]}"
    return None


def strip_ids(manifests: Iterable[PurgeManifest]) -> list[tuple[Any, ...]]:
    return [(m.user_id, m.cohort, m.created_at_ns, m.entries, m.evicted) for m in manifests]


def assert_matches(
    actual: Any,
    model: ReferenceModel,
    users: Iterable[int],
    *,
    ats: Iterable[int | None] = (None,),
    exact_ids: bool = True,
    where: str = "",
) -> None:
    """Assert that ``actual`` answers every read as ``model`` does.

    Compares, for each user: status, leave history, cohorts and purge manifests
    (purge ids too unless ``exact_ids`` is False: concurrent purges of users on
    different shards may reach the coordinator in either order); and every key's
    decay score and window (``aggregate_rows``) at each time in ``ats``.
    """
    for u in users:
        for name in ("community_layer_status", "community_leave_history", "cohorts_of"):
            got, want = getattr(actual, name)(u), getattr(model, name)(u)
            assert got == want, f"{where}{name}({u}): actual {got!r}, expected {want!r}"
        got_m, want_m = actual.list_purge_manifests(u), model.list_purge_manifests(u)
        ids = [m.purge_id for m in got_m]
        assert ids == sorted(set(ids)), f"{where}purge ids of {u} not increasing: {ids}"
        if exact_ids:
            assert got_m == want_m, f"{where}manifests({u}): actual {got_m!r}, expected {want_m!r}"
        else:
            assert strip_ids(got_m) == strip_ids(want_m), (
                f"{where}manifests({u}): actual {got_m!r}, expected {want_m!r}"
            )
    for at in ats:
        bad = rows_mismatch(actual.aggregate_rows(at), model.aggregate_rows(at))
        assert bad is None, f"{where}aggregate_rows(at={at}): {bad}"


_READS = frozenset(
    {
        "cohorts_of",
        "community_layer_status",
        "community_leave_history",
        "list_purge_manifests",
        "read_decay_score",
        "read_window",
        "top_entities",
        "aggregate_rows",
        "stats",
        "flush",
    }
)


class Recorder:
    """Submits operations to a Harness and remembers them (with the clock's now at
    submission) so that a reference model can replay the ones that took effect."""

    def __init__(self, harness: Harness) -> None:
        self.h = harness
        self.ops: list[tuple[str, tuple[Any, ...], int, Any]] = []

    def __getattr__(self, name: str) -> Any:
        op = getattr(self.h, name)

        def call(*args: Any) -> Any:
            handle = op(*args)
            self.ops.append((name, args, self.h.clock.now_ns(), handle))
            return handle

        return call

    def model(self, config: Any, skip: Any = None) -> ReferenceModel:
        """A model that applied, in submission order, every recorded operation that
        took effect: not a read, done without error, and not refused by ``skip(name,
        args)``. Its clock ends at the harness's now."""
        from tidal_actors import ManualClock

        clock = ManualClock(0)
        m = ReferenceModel(config, clock)
        for name, args, now, handle in self.ops:
            if name in _READS:
                continue
            assert handle.done, f"{name}{args} is not done"
            try:
                handle.result()
            except Exception:  # noqa: BLE001 - failed: no effect
                continue
            if skip is not None and skip(name, args):
                continue
            clock.set(now)
            getattr(m, name)(*args)
        clock.set(self.h.clock.now_ns())
        return m
