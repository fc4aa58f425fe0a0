"""Issue 4: the trio facade (`AsyncTidalDb`, `open_tidal`) and its pytest fixtures.

Expected values are worked out here by hand (arithmetic in the comments) or counted
independently by the test itself; the blocking facade is used only to reopen a store
after the trio block has exited and, in one test, as a second implementation whose
answers must equal the async ones.

Threads: trio keeps the worker thread that ran the open and the close idle in its
cache for up to 10 s (named "Trio thread N" while idle); it belongs to trio and runs
nothing of ours, so thread comparisons leave idle trio workers out.
"""

from __future__ import annotations

import inspect
import logging
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import trio
import trio.testing

from tidal_actors import (
    COMMUNITY,
    AsyncTidalDb,
    CommunityMembership,
    Config,
    ContributionRecord,
    DatabaseClosed,
    DatabaseLocked,
    InvalidArgument,
    LeaveEpoch,
    ManualClock,
    MembershipStatus,
    Signal,
    TidalDb,
    TidalError,
    UnknownCohort,
    UnknownPurge,
    WindowCount,
    WrongThread,
    open_tidal,
)
from tidal_actors.facades import aio_trio as _aio_trio
from tidal_actors.facades.blocking import open_core

from .conftest import SEC, T0


def new_threads(baseline: set[threading.Thread]) -> list[threading.Thread]:
    """Threads alive now that were not in ``baseline``, leaving out trio's idle workers."""
    return [
        t
        for t in threading.enumerate()
        if t not in baseline and not t.name.startswith("Trio thread ")
    ]


def new_trio_workers(baseline: set[threading.Thread]) -> list[threading.Thread]:
    return [
        t for t in threading.enumerate() if t not in baseline and t.name.startswith("Trio thread ")
    ]


# ---------------------------------------------------------------- the API surface


def test_every_tidaldb_method_has_an_async_twin_with_the_same_signature() -> None:
    methods = [
        name
        for name, value in inspect.getmembers(TidalDb, inspect.isfunction)
        if not name.startswith("_")
    ]
    # the brief names these explicitly; make sure the walk found them
    assert {
        "aggregate_rows",
        "stats",
        "flush",
        "lmdb_flags",
        "signal_with_context",
        "close",
    } <= set(methods)
    for name in methods:
        twin = getattr(AsyncTidalDb, name)
        assert inspect.iscoroutinefunction(twin), name
        sync_sig, async_sig = inspect.signature(getattr(TidalDb, name)), inspect.signature(twin)
        assert list(async_sig.parameters.values()) == list(sync_sig.parameters.values()), name
        assert async_sig.return_annotation == sync_sig.return_annotation, name
    for prop in ("config", "clock", "closed"):
        assert isinstance(vars(AsyncTidalDb)[prop], property)


def test_wrong_thread_is_a_tidal_error() -> None:
    assert issubclass(WrongThread, TidalError)
    core = open_core(None, None, ManualClock(T0))
    try:
        with pytest.raises(WrongThread):
            AsyncTidalDb(core)  # not inside a trio run
    finally:
        core.close()


# ---------------------------------------------------------------- same answers as TidalDb


async def _scenario(call, clock: ManualClock) -> list[object]:  # type: ignore[no-untyped-def]
    """Drive one facade through every method; returns what each call gave or raised."""
    out: list[object] = []

    async def rec(name: str, *args: object, **kw: object) -> object:
        try:
            value = await call(name, *args, **kw)
        except InvalidArgument as exc:
            value = ("InvalidArgument", exc.field)
        out.append((name, value))
        return value

    await rec("assign_cohort", 1, "a")
    await rec("assign_cohort", 2, "a")
    await rec("assign_cohort", 2, "b")
    assert await rec("cohorts_of", 2) == frozenset({"a", "b"})
    await rec("signal_with_context", 1, 7, 1, 2.0, T0)
    await rec("signal_batch", [Signal(2, 7, 1, 1.0, T0), Signal(2, 8, 1, 0.5, T0)])
    await rec("flush")
    # half-life 10 s: (2.0 + 1.0) * 2**(-10/10) = 1.5
    assert await rec("read_decay_score", "a", 7, 1, T0 + 10 * SEC) == 1.5
    assert await rec("read_decay_score", COMMUNITY, 7, 1) == 3.0  # at now = T0
    assert await rec("read_window", "a", 7, 1, T0) == WindowCount(2, 3.0)
    assert await rec("top_entities", COMMUNITY, 1, 5, T0) == [(7, 3.0), (8, 0.5)]
    assert await rec("aggregate_rows", T0) == [
        (COMMUNITY, 7, 1, 3.0, 2, 3.0),
        (COMMUNITY, 8, 1, 0.5, 1, 0.5),
        ("a", 7, 1, 3.0, 2, 3.0),
        ("a", 8, 1, 0.5, 1, 0.5),
        ("b", 7, 1, 1.0, 1, 1.0),
        ("b", 8, 1, 0.5, 1, 0.5),
    ]
    await rec("leave_community_layer", 2)
    assert await rec("community_layer_status", 2) == CommunityMembership(
        2, MembershipStatus.Left, T0
    )
    await rec("signal_with_context", 2, 7, 1, 1.0, T0)  # gated
    clock.advance(5 * SEC)
    await rec("rejoin_community_layer", 2)
    assert await rec("community_leave_history", 2) == [LeaveEpoch(T0, T0 + 5 * SEC)]
    pid, manifest = await rec("request_community_purge", 1, "a")  # type: ignore[misc]
    assert manifest.entries == (ContributionRecord(1, "a", 7, 1, 2.0, T0),)
    assert (manifest.user_id, manifest.cohort, manifest.created_at_ns) == (1, "a", T0 + 5 * SEC)
    assert await rec("list_purge_manifests", 1) == [manifest]
    assert await rec("read_decay_score", "a", 7, 1, T0) == 1.0  # 3.0 - 2.0
    status = await call("purge_status", pid)
    picked_status = (status.purge_id, status.user_id, status.cohort, status.retracted_live)
    assert picked_status == (pid, 1, "a", 1)
    out.append(("purge_status", picked_status))
    report = await call("rematerialize", "a")
    assert report.cohort == "a"
    out.append(("rematerialize", report.cohort))
    assert await rec("read_decay_score", "a", 7, 1, T0) == 1.0  # the rebuild agrees
    assert sorted(await call("compact")) == ["bytes_after", "bytes_before"]
    await rec("unassign_cohort", 2, "b")
    assert await rec("cohorts_of", 2) == frozenset({"a"})
    stats = await call("stats")
    picked = {k: stats[k] for k in ("signals", "forwarded", "gated", "purges", "retracted")}
    assert picked == {"signals": 4, "forwarded": 3, "gated": 1, "purges": 1, "retracted": 1}
    out.append(("stats", picked))
    flags = await call("lmdb_flags")
    assert isinstance(flags, dict) and flags
    out.append(("lmdb_flags", sorted(flags)))
    # errors: same class, naming the same argument, and nothing changed
    assert await rec("assign_cohort", -1, "a") == ("InvalidArgument", "user_id")
    assert await rec("assign_cohort", 1, "@x") == ("InvalidArgument", "cohort")
    assert await rec("signal_with_context", 1, 7, 1, -1.0) == ("InvalidArgument", "weight")
    assert (await rec("signal_batch", [Signal(1, 7, 1), "x"]))[1] == "signals[1]"  # type: ignore[index]
    await rec("top_entities", "a", 1, -1)
    await rec("read_window", "", 7, 1)
    await rec("request_community_purge", 1, "")
    assert await rec("purge_status", -1) == ("InvalidArgument", "purge_id")
    for name, arg, error in (
        ("purge_status", 12345, UnknownPurge),
        ("rematerialize", "nobody", UnknownCohort),
    ):
        with pytest.raises(error):
            await call(name, arg)
    assert (await call("stats"))["signals"] == 4
    return out


@pytest.mark.trio
async def test_results_and_errors_equal_the_blocking_facade(tmp_path: Path) -> None:
    cfg = Config(half_life_ns=10 * SEC, window_width_ns=SEC, window_buckets=4)
    sync_clock, async_clock = ManualClock(T0), ManualClock(T0)
    with TidalDb.open(str(tmp_path / "sync"), config=cfg, clock=sync_clock) as sdb:

        async def sync_call(name: str, *a: object, **k: object) -> object:
            return getattr(sdb, name)(*a, **k)

        expected = await _scenario(sync_call, sync_clock)
    async with open_tidal(str(tmp_path / "async"), config=cfg, clock=async_clock) as adb:

        async def async_call(name: str, *a: object, **k: object) -> object:
            return await getattr(adb, name)(*a, **k)

        got = await _scenario(async_call, async_clock)
        assert adb.config is cfg and adb.clock is async_clock and not adb.closed
    assert got == expected


@pytest.mark.trio
async def test_lmdb_flags_of_an_ephemeral_database_raises_invalid_argument() -> None:
    async with open_tidal(clock=ManualClock(T0)) as db:
        with pytest.raises(InvalidArgument):
            await db.lmdb_flags()


# ---------------------------------------------------------------- the event loop stays free
# That a waiting call parks its task and the loop runs on is shown without timing in
# tests/test_aio_backpressure.py; how late the loop runs under 2,000 sending tasks is
# measured by bench/bench_loop_lateness.py (a timed test here failed on loaded hosts).


# ---------------------------------------------------------------- 10,000 concurrent tasks


@pytest.mark.trio
async def test_ten_thousand_concurrent_tasks() -> None:
    n, n_cohorts, n_entities = 10_000, 10, 50
    weights = (1.0, 0.5, 2.0)  # float32-exact; 3.5 per user
    cfg = Config(membership_shards=2, ledger_shards=2)

    baseline = set(threading.enumerate())
    with TidalDb.open(config=cfg, clock=ManualClock(T0)):
        sync_threads = len(new_threads(baseline))
    assert sync_threads >= 5  # actors and flusher; the comparison below is not vacuous
    for t in list(threading.enumerate()):
        if t not in baseline and not t.name.startswith("Trio thread "):
            t.join(5)

    def plan(i: int) -> tuple[int, str, int, bool, bool]:
        return 100_000 + i, f"c{i % n_cohorts}", i % n_entities, i % 7 == 0, i % 11 == 0

    peak_threads = 0
    peak_trio_workers = 0
    problems: list[str] = []
    manifests: dict[int, tuple[ContributionRecord, ...]] = {}
    # Ephemeral: with a durable store each membership shard commits its control
    # operations one at a time, and 11,000 fsyncs would only measure the disk.
    async with open_tidal(None, config=cfg, clock=ManualClock(T0)) as db:
        started = trio.Event()
        running = 0

        async def task(i: int) -> None:
            nonlocal peak_threads, peak_trio_workers, running
            user, cohort, entity, leaves, purges = plan(i)
            running += 1
            if running == n:
                started.set()
            await db.assign_cohort(user, cohort)
            peak_threads = max(peak_threads, len(new_threads(baseline)))
            peak_trio_workers = max(peak_trio_workers, len(new_trio_workers(baseline)))
            for w in weights:
                await db.signal_with_context(user, entity, 1, w)
            if await db.cohorts_of(user) != {cohort}:
                problems.append(f"cohorts of {user}")
            if purges:
                _, manifest = await db.request_community_purge(user, cohort)
                manifests[user] = manifest.entries
            if leaves:
                await db.leave_community_layer(user)
                await db.signal_with_context(user, entity, 1, 4.0)  # gated
            status = await db.community_layer_status(user)
            want = (MembershipStatus.Left, T0) if leaves else (MembershipStatus.Active, None)
            if (status.status, status.left_at_ns) != want:
                problems.append(f"status of {user}: {status}")

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(task, i)
            await started.wait()
        await db.flush()
        rows = await db.aggregate_rows()
        stats = await db.stats()
        top = await db.top_entities(COMMUNITY, 1, 3)

    assert problems == []
    # expected aggregates, counted here: every user adds 3.5 (3 records) to @community
    # and to its cohort; a purged user's records leave its cohort (not @community).
    leavers = sum(1 for i in range(n) if plan(i)[3])
    purged = [i for i in range(n) if plan(i)[4]]
    comm: Counter[int] = Counter()
    coh: Counter[tuple[str, int]] = Counter()
    for i in range(n):
        _, cohort, entity, _, purges = plan(i)
        comm[entity] += 1
        if not purges:
            coh[(cohort, entity)] += 1
    expected_rows = sorted(
        [(COMMUNITY, e, 1, 3.5 * k, 3 * k, 3.5 * k) for e, k in comm.items()]
        + [(c, e, 1, 3.5 * k, 3 * k, 3.5 * k) for (c, e), k in coh.items()]
    )
    assert len(rows) == len(expected_rows) == 100
    for got, want in zip(rows, expected_rows):
        assert got[:3] == want[:3] and got[4] == want[4]
        assert got[3] == pytest.approx(want[3], rel=1e-12) and got[5] == pytest.approx(
            want[5], rel=1e-12
        )
    assert stats["signals"] == 3 * n + leavers
    assert stats["forwarded"] == 3 * n
    assert stats["gated"] == leavers == 1429  # ceil(10000 / 7)
    assert stats["purges"] == len(purged) == 910  # ceil(10000 / 11)
    assert stats["retracted"] == 3 * len(purged)
    for i in purged:
        user, cohort, entity, _, _ = plan(i)
        assert manifests[user] == tuple(
            ContributionRecord(user, cohort, entity, 1, w, T0) for w in weights
        )
    # 10000 users over 50 entities: 200 users, 700.0 each; ties go to the lower id
    assert top == [(0, 700.0), (1, 700.0), (2, 700.0)]
    # threads: no more than the blocking facade starts, and no thread per waiting call
    assert peak_threads <= sync_threads
    assert peak_trio_workers <= 1


# ---------------------------------------------------------------- lifetime


class Boom(Exception):
    pass


@pytest.mark.trio
@pytest.mark.parametrize("how", ["normal", "error", "cancel"])
async def test_exit_flushes_stops_actors_closes_store_and_leaves_no_thread(
    tmp_path: Path, how: str
) -> None:
    path = str(tmp_path / "s")
    clock = ManualClock(T0)
    baseline = set(threading.enumerate())
    inside: list[threading.Thread] = []
    with trio.CancelScope() as scope:
        try:
            async with open_tidal(path, clock=clock) as db:
                inside = new_threads(baseline)
                await db.assign_cohort(1, "a")
                for _ in range(100):
                    await db.signal_with_context(1, 7, 1, 1.0)  # not flushed by us
                if how == "error":
                    raise Boom
                if how == "cancel":
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(db.leave_community_layer, 2)  # waiting when cancelled
                        scope.cancel()
                        await trio.sleep_forever()
        except Boom:
            assert how == "error"
    assert scope.cancelled_caught == (how == "cancel")
    assert len(inside) >= 5  # the database did start threads ...
    assert new_threads(baseline) == []  # ... and none is left
    assert db.closed
    with pytest.raises(DatabaseClosed):
        await db.stats()
    with pytest.raises(DatabaseClosed):
        await db.signal_with_context(1, 7, 1)
    # the store is closed (no DatabaseLocked) and the signals were flushed
    with TidalDb.open(path, clock=clock) as again:
        assert again.read_window(COMMUNITY, 7, 1) == WindowCount(100, 100.0)
        assert again.read_decay_score("a", 7, 1) == 100.0
        expected = MembershipStatus.Left if how == "cancel" else MembershipStatus.Active
        assert again.community_layer_status(2).status is expected


@pytest.mark.trio
async def test_exit_lets_a_call_in_flight_finish(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    results: list[object] = []
    async with trio.open_nursery() as outer, open_tidal(path, clock=ManualClock(T0)) as db:

        async def leave() -> None:
            results.append(await db.leave_community_layer(5))

        outer.start_soon(leave)
        await trio.testing.wait_all_tasks_blocked()  # the leave is sent and waiting
    assert results == [None]  # completed, not DatabaseClosed
    with TidalDb.open(path) as again:
        assert again.community_layer_status(5).status is MembershipStatus.Left


@pytest.mark.trio
async def test_close_early_and_twice(tmp_path: Path) -> None:
    async with open_tidal(str(tmp_path / "s"), clock=ManualClock(T0)) as db:
        await db.signal_with_context(1, 7, 1, 1.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(db.close)
            nursery.start_soon(db.aclose)
        assert db.closed
        with pytest.raises(DatabaseClosed):
            await db.flush()
    with TidalDb.open(str(tmp_path / "s"), clock=ManualClock(T0)) as again:
        assert again.read_window(COMMUNITY, 7, 1).count == 1


@pytest.mark.trio
async def test_a_failed_open_leaves_nothing_behind(tmp_path: Path) -> None:
    baseline = set(threading.enumerate())
    with pytest.raises(InvalidArgument):
        async with open_tidal(123):  # type: ignore[arg-type]
            pass
    path = str(tmp_path / "s")
    async with open_tidal(path, clock=ManualClock(T0)) as first:
        with pytest.raises(DatabaseLocked):
            async with open_tidal(path):
                pass
        await first.assign_cohort(1, "a")  # the first one is unaffected
        assert await first.cohorts_of(1) == {"a"}
    assert new_threads(baseline) == []


@pytest.mark.trio
async def test_cancelled_before_or_during_the_open(tmp_path: Path) -> None:
    baseline = set(threading.enumerate())
    entered = False
    with trio.CancelScope() as scope:
        scope.cancel()
        async with open_tidal(str(tmp_path / "a")):
            entered = True
    assert scope.cancelled_caught and not entered  # cancelled before: nothing opened
    assert not (tmp_path / "a").exists()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_after, scope, 1)  # fires while the open runs
            async with open_tidal(str(tmp_path / "b")) as db:
                await trio.sleep_forever()
    assert scope.cancelled_caught and db.closed  # opened whole, then closed whole
    assert new_threads(baseline) == []
    with TidalDb.open(str(tmp_path / "b")) as again:  # not left locked
        assert again.stats()["signals"] == 0


# ---------------------------------------------------------------- cancellation


async def _cancel_after(scope: trio.CancelScope, ticks: int) -> None:
    for _ in range(ticks):
        await trio.lowlevel.checkpoint()
    scope.cancel()


async def _cancelled_call(fn, *args: object, ticks: int) -> bool:  # type: ignore[no-untyped-def]
    """Await ``fn(*args)`` in a scope cancelled before the call (ticks == 0) or after
    ``ticks - 1`` scheduler passes; True if the await was cancelled."""
    scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        if ticks == 0:
            scope.cancel()
        else:
            nursery.start_soon(_cancel_after, scope, ticks - 1)
        with scope:
            await fn(*args)
    return scope.cancelled_caught


@pytest.mark.trio
async def test_a_cancelled_leave_is_applied_completely(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    clock = ManualClock(T0)
    users = range(1, 121)
    cancelled = 0
    async with open_tidal(path, clock=clock) as db:
        for u in users:
            clock.set(T0 + u * SEC)
            if u % 10 == 9:  # a real-time deadline too, at an arbitrary moment
                with trio.move_on_after(random.Random(u).uniform(0, 0.0003)) as scope:
                    await db.leave_community_layer(u)
                cancelled += scope.cancelled_caught
            else:
                cancelled += await _cancelled_call(db.leave_community_layer, u, ticks=u % 5)
        # at once, without waiting: each leave is whole -- status, epoch and gate
        for u in users:
            await db.signal_with_context(u, 7, 1, 1.0)
        for u in users:
            assert await db.community_layer_status(u) == CommunityMembership(
                u, MembershipStatus.Left, T0 + u * SEC
            )
            assert await db.community_leave_history(u) == [LeaveEpoch(T0 + u * SEC, None)]
        await db.flush()
        stats = await db.stats()
        assert (stats["gated"], stats["forwarded"]) == (120, 0)
    assert cancelled >= 24  # at least every ticks == 0 call (u % 5 == 0, 24 users)
    with TidalDb.open(path) as again:  # and durable
        for u in users:
            assert again.community_layer_status(u) == CommunityMembership(
                u, MembershipStatus.Left, T0 + u * SEC
            )
            assert again.community_leave_history(u) == [LeaveEpoch(T0 + u * SEC, None)]


@pytest.mark.trio
async def test_a_cancelled_purge_is_applied_completely(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    weights = (1.0, 0.5, 2.0)
    users = range(1, 61)
    cancelled = 0
    async with open_tidal(path, clock=ManualClock(T0)) as db:
        for u in users:
            await db.assign_cohort(u, "a")
            for w in weights:
                await db.signal_with_context(u, u % 5, 1, w, T0)
        for u in users:
            cancelled += await _cancelled_call(db.request_community_purge, u, "a", ticks=u % 4)
        # a later purge of the user is ordered after the cancelled one: it finds nothing left
        for u in users[::2]:
            pid, manifest = await db.request_community_purge(u, "a")
            assert manifest.entries == ()
            first, second = await db.list_purge_manifests(u)
            assert second.purge_id == pid and first.purge_id < pid
            assert first.entries == tuple(
                ContributionRecord(u, "a", u % 5, 1, w, T0) for w in weights
            )
        # users[1::2] are left alone: exit must let their cancelled purges finish
    assert cancelled >= 15  # every ticks == 0 call
    with TidalDb.open(path) as again:
        for u in users[1::2]:
            (only,) = again.list_purge_manifests(u)
            assert only.entries == tuple(
                ContributionRecord(u, "a", u % 5, 1, w, T0) for w in weights
            )
        for e in range(5):
            assert again.read_window("a", e, 1, T0) == WindowCount(0, 0.0)
            # @community keeps all: 12 users per entity, 3.5 each
            assert again.read_decay_score(COMMUNITY, e, 1, T0) == pytest.approx(42.0, rel=1e-12)


@pytest.mark.trio
async def test_other_cancelled_control_operations_are_applied_completely() -> None:
    async with open_tidal(clock=ManualClock(T0)) as db:
        assert await _cancelled_call(db.assign_cohort, 1, "a", ticks=0)
        assert await db.cohorts_of(1) == {"a"}
        await db.assign_cohort(1, "b")
        assert await _cancelled_call(db.unassign_cohort, 1, "a", ticks=0)
        assert await db.cohorts_of(1) == {"b"}
        await db.leave_community_layer(1)
        assert await _cancelled_call(db.rejoin_community_layer, 1, ticks=0)
        assert (await db.community_layer_status(1)).status is MembershipStatus.Active
        await db.signal_with_context(1, 7, 1, 1.0)
        assert await _cancelled_call(db.flush, ticks=0)
        assert await db.read_window("b", 7, 1) == WindowCount(1, 1.0)


@pytest.mark.trio
async def test_a_cancelled_signal_is_not_applied_at_all() -> None:
    async with open_tidal(clock=ManualClock(T0)) as db:
        assert await _cancelled_call(db.signal_with_context, 1, 7, 1, 1.0, ticks=0)
        assert await _cancelled_call(db.signal_batch, [Signal(1, 7, 1)] * 10, ticks=0)
        await db.signal_with_context(1, 8, 1, 1.0)
        await db.flush()
        stats = await db.stats()
        assert (stats["signals"], stats["forwarded"]) == (1, 1)
        assert await db.read_window(COMMUNITY, 7, 1) == WindowCount(0, 0.0)


@pytest.mark.trio
async def test_cancelled_reads_change_nothing_and_are_forgotten() -> None:
    async with open_tidal(clock=ManualClock(T0)) as db:
        await db.signal_with_context(1, 7, 1, 1.0)
        for ticks in range(4):
            await _cancelled_call(db.aggregate_rows, ticks=ticks)
            await _cancelled_call(db.stats, ticks=ticks)
            await _cancelled_call(db.read_decay_score, COMMUNITY, 7, 1, ticks=ticks)
        await db.flush()
        assert await db.aggregate_rows(T0) == [(COMMUNITY, 7, 1, 1.0, 1, 1.0)]
        # every abandoned reply arrives and is dropped (a coordinator reply may trail
        # the flush, which orders only the shards' traffic)
        with trio.fail_after(10):
            while db._unsettled:
                await trio.sleep(0.01)


# ---------------------------------------------------------------- threads


@pytest.mark.trio
async def test_calls_from_another_thread_raise_wrong_thread() -> None:
    async with open_tidal(clock=ManualClock(T0)) as db:

        def elsewhere() -> tuple[list[BaseException], object]:
            errors: list[BaseException] = []
            try:
                trio.run(db.cohorts_of, 1)  # another trio run, in another thread
            except WrongThread as exc:
                errors.append(exc)
            coro = db.signal_with_context(1, 7, 1)  # stepped by hand, no run at all
            try:
                coro.send(None)
            except WrongThread as exc:
                errors.append(exc)
            # the sanctioned way: run it in the trio thread
            return errors, trio.from_thread.run(db.cohorts_of, 1)

        errors, via_trio = await trio.to_thread.run_sync(elsewhere)
        assert [type(e) for e in errors] == [WrongThread, WrongThread]
        assert "trio" in str(errors[0])
        assert via_trio == frozenset()
        await db.flush()
        assert (await db.stats())["signals"] == 0  # nothing was queued


@pytest.mark.trio
async def test_every_method_raises_database_closed_after_exit() -> None:
    async with open_tidal(clock=ManualClock(T0)) as db:
        pass
    calls = {
        "signal_with_context": (1, 7, 1),
        "signal_batch": ([Signal(1, 7, 1)],),
        "assign_cohort": (1, "a"),
        "unassign_cohort": (1, "a"),
        "cohorts_of": (1,),
        "leave_community_layer": (1,),
        "rejoin_community_layer": (1,),
        "community_layer_status": (1,),
        "community_leave_history": (1,),
        "request_community_purge": (1, "a"),
        "list_purge_manifests": (1,),
        "read_decay_score": ("a", 7, 1),
        "read_window": ("a", 7, 1),
        "top_entities": ("a", 1, 3),
        "aggregate_rows": (),
        "stats": (),
        "flush": (),
        "lmdb_flags": (),
        "rematerialize": ("a",),
        "purge_status": (1,),
        "compact": (),
        "fault_reports": (),
    }
    twins = {n for n, _ in inspect.getmembers(TidalDb, inspect.isfunction) if not n.startswith("_")}
    assert set(calls) == twins - {"close"}
    for name, args in calls.items():
        with pytest.raises(DatabaseClosed):
            await getattr(db, name)(*args)
    await db.close()  # a no-op


# ---------------------------------------------------------------- field failure: late reply


def test_a_reply_after_the_run_ended_neither_kills_the_actor_nor_logs(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    # a store, so that the leave waits for a commit (an ephemeral leave has none)
    core = open_core(str(tmp_path / "db"), None, ManualClock(T0))
    try:
        gate, held = threading.Event(), threading.Event()
        real_commit = core.store.commit

        def held_commit(ops: object) -> None:
            held.set()
            gate.wait(10)
            real_commit(ops)

        core.store.commit = held_commit  # the leave's commit waits for the gate
        dbs: list[AsyncTidalDb] = []

        async def main() -> None:
            db = AsyncTidalDb(core)
            dbs.append(db)
            with trio.move_on_after(0.1):
                await db.leave_community_layer(1)

        trio.run(main)  # the run ends while the leave is pending
        assert held.wait(5)
        core.store.commit = real_commit
        gate.set()  # now the actor settles the reply and calls back into the ended run
        sync = TidalDb(core)
        # the status query queues behind the leave, so the leave's callbacks have run
        assert sync.community_layer_status(1) == CommunityMembership(1, MembershipStatus.Left, T0)
        assert dbs[0]._late_wakeups == 1  # it met RunFinishedError ...
        assert sync.stats()["handler_errors"] == 0  # ... and swallowed it
        sync.assign_cohort(1, "a")  # the actors still serve
        assert sync.cohorts_of(1) == {"a"}
    finally:
        core.close()
    out, err = capfd.readouterr()
    assert "RunFinishedError" not in out + err and "Traceback" not in err
    assert [
        r for r in caplog.records if r.levelno >= logging.WARNING or "RunFinished" in r.getMessage()
    ] == []


# ---------------------------------------------------------------- field failure: autojump_clock


@pytest.mark.trio
async def test_autojump_clock_weight_one_read_at_once_is_exactly_one(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    clock = ManualClock(T0)
    async with open_tidal(str(tmp_path / "s"), clock=clock) as db:
        await db.signal_with_context(1, 7, 1, 1.0)
        assert await db.read_decay_score(COMMUNITY, 7, 1) == 1.0
        assert await db.read_window(COMMUNITY, 7, 1) == WindowCount(1, 1.0)
        await db.leave_community_layer(1)
        assert (await db.community_layer_status(1)).left_at_ns == T0


async def _ops_inside_fail_after(db: AsyncTidalDb, rounds: int) -> int:
    passed = 0
    for i in range(rounds):
        with trio.fail_after(300):
            op = i % 6
            if op == 0:
                await db.assign_cohort(i, "a")
            elif op == 1:
                await db.leave_community_layer(i)
            elif op == 2:
                await db.rejoin_community_layer(i - 1)
            elif op == 3:
                await db.request_community_purge(i, "a")
            elif op == 4:
                await db.flush()
            else:
                await db.read_decay_score(COMMUNITY, 7, 1)
        passed += 1
    return passed


@pytest.mark.trio
async def test_autojump_clock_operations_inside_fail_after_300_pass_every_time(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    start = trio.current_time()
    with trio.fail_after(300):
        async with open_tidal(str(tmp_path / "s"), clock=ManualClock(T0)) as db:
            assert await _ops_inside_fail_after(db, 120) == 120
    assert trio.current_time() - start < 300  # the virtual clock never jumped to a deadline


@pytest.mark.trio
async def test_autojump_trap_is_real_without_the_guard(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Shows the test above can fail: without the guard trio jumps while we wait.
    async with open_tidal(clock=ManualClock(T0)) as db:
        monkeypatch.setattr(_aio_trio._AutojumpGuard, "enter", lambda self: None)
        monkeypatch.setattr(_aio_trio._AutojumpGuard, "exit", lambda self: None)
        while db._guard._running:  # the open's guard ends after 1 ms of real idleness
            await trio.to_thread.run_sync(time.sleep, 0.002)
        with pytest.raises(trio.TooSlowError):
            await _ops_inside_fail_after(db, 50)


# ---------------------------------------------------------------- pytest fixtures


@pytest.mark.trio
async def test_async_tidal_db_fixture(
    async_tidal_db: AsyncTidalDb, tidal_clock: ManualClock
) -> None:
    db = async_tidal_db
    assert db.clock is tidal_clock and tidal_clock.now_ns() == 10**18
    assert isinstance(await db.lmdb_flags(), dict)  # persistent: on a temporary directory
    await db.signal_with_context(1, 7, 1, 1.0)
    tidal_clock.advance(db.config.half_life_ns)
    assert await db.read_decay_score(COMMUNITY, 7, 1) == 0.5  # one half-life later


@pytest.mark.trio
async def test_producers_in_the_nursery_fixture_finish_before_the_test_ends(
    nursery: trio.Nursery, async_tidal_db: AsyncTidalDb
) -> None:
    db, producers, each = async_tidal_db, 4, 250
    finished = 0
    all_finished = trio.Event()

    async def producer(p: int) -> None:
        nonlocal finished
        for i in range(each):
            await db.signal_with_context(p, i % 5, 1, 0.5)
        finished += 1
        if finished == producers:
            all_finished.set()

    for p in range(producers):
        nursery.start_soon(producer, p)
    await all_finished.wait()  # without this the fixture would cancel them at return
    await db.flush()
    stats = await db.stats()
    assert stats["signals"] == stats["forwarded"] == 1000
    # entity 0 gets 50 signals per producer, 0.5 each: 4 * 50 * 0.5 = 100
    assert await db.read_decay_score(COMMUNITY, 0, 1) == 100.0


@pytest.mark.trio
async def test_endless_producers_cancelled_mid_stream_count_exactly(
    nursery: trio.Nursery, async_tidal_db: AsyncTidalDb
) -> None:
    db, producers = async_tidal_db, 4
    sent = [0] * producers
    stopped = 0
    all_stopped = trio.Event()

    async def producer(
        p: int, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED
    ) -> None:
        nonlocal stopped
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while True:
                await db.signal_with_context(p, 1, 1, 1.0)
                sent[p] += 1  # counted only when the call returned
        stopped += 1
        if stopped == producers:
            all_stopped.set()

    scopes = [await nursery.start(producer, p) for p in range(producers)]
    while sum(sent) < 3000:
        await trio.sleep(0.001)
    for scope in scopes:
        scope.cancel()
    await all_stopped.wait()
    await db.flush()
    stats = await db.stats()
    # a signal call either returned (queued, applied) or raised Cancelled (not applied)
    assert stats["signals"] == stats["forwarded"] == sum(sent)
    assert (await db.read_window(COMMUNITY, 1, 1)).count == sum(sent)


# ---------------------------------------------------------------- the README


def test_readme_example_test_passes(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Testing your code with tidal_actors", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "test_readme_example.py").write_text(code)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_readme_example.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
