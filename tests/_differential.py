"""Shared helpers of the differential tests: compare a runtime with the reference model.

A "runtime" here is anything with TidalDb's blocking methods: a ``TidalDb`` itself, or
:class:`Blocking` around a ``Harness`` (each call runs the harness until its reply).
`random_op` is one step of the seeded random workloads that drive both.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from tidal_actors import COMMUNITY, ManualClock, PurgeManifest, UnknownCohort
from tidal_actors.testing import Harness, ReferenceModel

from .conftest import SEC, T0

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


def lost_of(report: Any) -> set[tuple[int, int]]:
    """``(user, ts)`` of each signal a FaultReport says was lost: its lost signals
    (signal tuples) and the user and timestamp of each of its lost records."""
    return {(s[0], s[4]) for s in report.lost_signals} | {
        (rec.user, rec.ts) for rec in report.lost_records
    }


def crashed(
    seed: int,
    config: Any,
    workload: Callable[[Recorder], None],
    address: Any,
    steps: int,
    **harness: Any,
) -> tuple[Harness, Recorder, Any]:
    """A Harness (``seed``, ``config``, no store; ``harness``: more of its keyword
    arguments, e.g. ``ordering``, ``link_faults``) given ``workload`` through a
    Recorder and run ``steps`` steps; then the shard at ``address`` crashes and the
    harness runs until idle. Returns the harness, the Recorder and the FaultReport."""
    h = Harness(seed=seed, config=config, **harness)
    r = Recorder(h)
    workload(r)
    for _ in range(steps):
        h.step()
    report = h.crash_shard(address)
    h.run_until_idle()
    return h, r, report


def model_without_lost(r: Recorder, config: Any, report: Any) -> ReferenceModel:
    """``r.model(config)`` but for the signals ``report`` says were lost."""
    lost = lost_of(report)
    return r.model(
        config, skip=lambda name, args: name == "signal_with_context" and (args[0], args[4]) in lost
    )


def assert_matches_and_reopened(
    h: Harness, model: ReferenceModel, users: Iterable[int], where: str
) -> None:
    """`assert_matches` (purge ids aside) on the harness ``h``, then again after
    ``h.close_and_reopen()``: what it serves is what its store holds."""
    db = Blocking(h)
    assert_matches(db, model, users, exact_ids=False, where=f"{where}: ")
    h.close_and_reopen()
    assert_matches(db, model, users, exact_ids=False, where=f"{where}, after reopen: ")


def rematerialize_both(db: Any, ref: ReferenceModel, cohort: str) -> None:
    """Re-materialize ``cohort`` on the model and on ``db``: both refuse an unknown
    cohort, and ``db`` excludes at most the records the model does."""
    try:
        excluded = ref.rematerialize(cohort)
    except UnknownCohort:
        with pytest.raises(UnknownCohort):
            db.rematerialize(cohort)
    else:
        assert db.rematerialize(cohort).records_excluded <= excluded


def random_op(
    db: Any,
    ref: ReferenceModel,
    rng: random.Random,
    clocks: Sequence[ManualClock],
    mix: Sequence[tuple[float, str]],
) -> str:
    """One step of a seeded random workload: the same operation on ``db`` and ``ref``.

    Draws ``op = rng.random()`` and a user in ``[0, 6)``; the operation is the name of
    the first ``(bound, name)`` of ``mix`` with ``op < bound``: "signal" (entity in
    [0, 5), type 0 or 1, weight 0.1 to 2.0, at T0 - 5 s to T0 + 39 s), "assign",
    "unassign" (cohort "a", "b" or "c"), "leave", "rejoin", "purge" (one of those
    or COMMUNITY; the manifests' entries and evicted counts must agree),
    "rematerialize" (the runtime's records_excluded at most the model's, which
    counts the live-retracted records too; UnknownCohort from both or neither) or
    "advance" (every clock of ``clocks`` by -3 s to 9 s). Any other name is the
    caller's to do. Returns the name.
    """
    op = rng.random()
    u = rng.randrange(6)
    name = next(n for bound, n in mix if op < bound)
    if name == "signal":
        args = (
            u,
            rng.randrange(5),
            rng.randrange(2),
            rng.choice([0.5, 1.0, 2.0, 0.1]),
            T0 + rng.randrange(-5, 40) * SEC,
        )
        db.signal_with_context(*args)
        ref.signal_with_context(*args)
    elif name == "assign":
        c = rng.choice("abc")
        db.assign_cohort(u, c)
        ref.assign_cohort(u, c)
    elif name == "unassign":
        c = rng.choice("abc")
        db.unassign_cohort(u, c)
        ref.unassign_cohort(u, c)
    elif name == "leave":
        db.leave_community_layer(u)
        ref.leave_community_layer(u)
    elif name == "rejoin":
        db.rejoin_community_layer(u)
        ref.rejoin_community_layer(u)
    elif name == "purge":
        c = rng.choice(["a", "b", "c", COMMUNITY])
        _, m = db.request_community_purge(u, c)
        _, rm = ref.request_community_purge(u, c)
        assert (m.entries, m.evicted) == (rm.entries, rm.evicted)
    elif name == "rematerialize":
        rematerialize_both(db, ref, rng.choice(["a", "b", "c", COMMUNITY]))
    elif name == "advance":
        d = rng.randrange(-3, 10) * SEC
        for clock in clocks:
            clock.advance(d)
    return name
