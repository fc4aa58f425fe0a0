"""`AsyncTidalDb` under asyncio: the same names, results, errors and cancellation rules
as under trio, checked against the reference model; the ``asyncio_tidal_db``
fixture; the asyncio example application."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tidal_actors import (
    COMMUNITY,
    AsyncTidalDb,
    Config,
    DatabaseClosed,
    InvalidArgument,
    ManualClock,
    MembershipStatus,
    Signal,
    TidalDb,
    WrongThread,
    open_tidal,
)
from tidal_actors.facades.aio_asyncio import AsyncioTidalDb
from tidal_actors.facades.blocking import open_core
from tidal_actors.testing import ReferenceModel

from .conftest import SEC, T0

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_same_results_as_the_reference_model(tmp_path: Path) -> None:
    cfg = Config(membership_shards=2, ledger_shards=2)
    clock = ManualClock(T0)
    model = ReferenceModel(cfg, ManualClock(T0))

    async def main() -> tuple[object, ...]:
        async with open_tidal(str(tmp_path / "s"), config=cfg, clock=clock) as db:
            assert isinstance(db, AsyncioTidalDb) and isinstance(db, AsyncTidalDb)
            for u in range(6):
                await db.assign_cohort(u, f"c{u % 2}")
                model.assign_cohort(u, f"c{u % 2}")
            for i in range(60):
                await db.signal_with_context(i % 6, i % 7, 1, 1.0 + i % 3)
                model.signal_with_context(i % 6, i % 7, 1, 1.0 + i % 3)
            await db.signal_batch([Signal(1, 3, 1, 2.0), Signal(2, 4, 1)])
            model.signal_batch([Signal(1, 3, 1, 2.0), Signal(2, 4, 1)])
            await db.leave_community_layer(3)
            model.leave_community_layer(3)
            await db.signal_with_context(3, 0, 1, 9.0)  # gated
            model.signal_with_context(3, 0, 1, 9.0)
            pid, manifest = await db.request_community_purge(0, "c0")
            model.request_community_purge(0, "c0")
            clock.advance(SEC)
            model.clock.advance(SEC)  # type: ignore[attr-defined]
            await db.rejoin_community_layer(3)
            model.rejoin_community_layer(3)
            await db.flush()
            return (
                await db.aggregate_rows(),
                await db.community_layer_status(3),
                await db.community_leave_history(3),
                len(manifest.entries),
                (await db.stats())["gated"],
                await db.cohorts_of(4),
                (await db.purge_status(pid)).retracted_live,
            )

    rows, status, history, entries, gated, cohorts, retracted = asyncio.run(main())
    assert rows == model.aggregate_rows()
    assert status == model.community_layer_status(3)
    assert history == model.community_leave_history(3)
    assert status.status is MembershipStatus.Active
    # user 0 sent signals i = 0, 6, ..., 54 (10), each to c0 and @community; c0's are purged
    assert entries == retracted == 10
    assert gated == 1
    assert cohorts == frozenset({"c0"})


def test_errors_and_threads() -> None:
    async def main() -> None:
        async with open_tidal(None, clock=ManualClock(T0)) as db:
            with pytest.raises(InvalidArgument) as info:
                await db.signal_with_context(-1, 1, 1)
            assert info.value.field == "user_id"
            with pytest.raises(InvalidArgument):
                await db.assign_cohort(1, "@community")
            out: list[BaseException] = []

            def elsewhere() -> None:
                try:
                    asyncio.run(db.cohorts_of(1))
                except BaseException as exc:  # noqa: BLE001
                    out.append(exc)

            t = threading.Thread(target=elsewhere)
            t.start()
            await asyncio.get_running_loop().run_in_executor(None, t.join)
            assert isinstance(out[0], WrongThread)
        with pytest.raises(DatabaseClosed):
            await db.cohorts_of(1)

    asyncio.run(main())


def test_a_cancelled_leave_is_applied_completely() -> None:
    async def main() -> MembershipStatus:
        async with open_tidal(None, clock=ManualClock(T0)) as db:
            task = asyncio.get_running_loop().create_task(db.leave_community_layer(7))
            await asyncio.sleep(0)  # the call has begun: the leave is sent
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await db.signal_with_context(7, 1, 1)  # after the leave: gated
            await db.flush()
            assert (await db.stats())["gated"] == 1
            return (await db.community_layer_status(7)).status

    assert asyncio.run(main()) is MembershipStatus.Left


def test_leaving_the_block_by_cancellation_closes_the_store(tmp_path: Path) -> None:
    path = str(tmp_path / "s")

    async def body(started: asyncio.Event) -> None:
        async with open_tidal(path, clock=ManualClock(T0)) as db:
            await db.assign_cohort(1, "a")
            await db.signal_with_context(1, 2, 1)
            started.set()
            await asyncio.Event().wait()  # forever, until cancelled

    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.get_running_loop().create_task(body(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    with TidalDb.open(path, clock=ManualClock(T0)) as again:  # closed: not DatabaseLocked
        assert again.cohorts_of(1) == frozenset({"a"})
        assert again.read_window("a", 2, 1, T0).count == 1


def test_wrapping_an_open_core_outside_a_loop_is_wrong_thread() -> None:
    core = open_core(None, None, ManualClock(T0))
    try:
        with pytest.raises(WrongThread):
            AsyncTidalDb(core)
    finally:
        core.close()


@pytest.mark.asyncio
@pytest.mark.tidal_config(ledger_shards=3)
async def test_the_asyncio_fixture(
    asyncio_tidal_db: AsyncTidalDb, tidal_clock: ManualClock
) -> None:
    db = asyncio_tidal_db
    assert db.config.ledger_shards == 3
    await db.signal_with_context(1, 7, 1, 2.0)
    tidal_clock.advance(db.config.half_life_ns)
    assert await db.read_decay_score(COMMUNITY, 7, 1) == 1.0


@pytest.mark.parametrize("name", ["trio_app.py", "asyncio_app.py"])
def test_the_example_applications_run(tmp_path: Path, name: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--path", str(tmp_path / "ex")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert lines.pop(0) == "running: 4 producers x 25 users (Ctrl-C stops it)"
    # 4 producers x 25 users; users i % 10 == 3 leave (3 per producer) and then send 5
    # gated signals; users i % 5 == 0 purge their 20 signals (5 per producer)
    assert lines[0] == "producers: 4, users: 100"
    assert lines[1] == "signals sent: 2060 applied: 2060 forwarded: 2000 gated: 60"
    assert lines[2] == "leaves: 12 purges: 20 records retracted: 400"
    assert lines[3].startswith("top-k reads: ") and int(lines[3].split(": ")[1]) >= 1
    # entity isqrt(j) for j in 0..19: entity 3 seven times, 2 five, 4 four; x 100 users
    assert lines[4] == "top 3 @community: 3=700.00 2=500.00 4=400.00"
    assert proc.stderr == ""
