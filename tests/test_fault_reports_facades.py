"""``fault_reports()`` on the facades (issue 18): it was the engine's only
(``db._core.fault_reports()``). A ledger whose handler fails restarts from the store
(`runtime.supervision`); the blocking and the async facade then list that one
report, the same the engine keeps; an empty list before any failure; DatabaseClosed
once closed, as every operation.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tidal_actors import (
    Config,
    DatabaseClosed,
    FaultReport,
    ManualClock,
    StorageError,
    TidalDb,
    open_tidal,
)
from tidal_actors.actors import messages as M
from tidal_actors.core.contrib_log import ContributionLog

from ._setups import fail_next
from .conftest import SEC, T0

CFG = Config(membership_shards=1, ledger_shards=1, rematerialize_after_ms=None)


def test_the_blocking_facade_lists_a_ledgers_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TidalDb.open(tmp_path / "s", config=CFG, clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "red")
        db.signal_with_context(1, 7, 1, 1.0, T0 - SEC)
        db.flush()
        assert db.fault_reports() == []
        raised = fail_next(ContributionLog, "append_columns", monkeypatch)
        db.signal_with_context(1, 7, 1, 2.0, T0)
        with pytest.raises(StorageError, match="lost 1 signal batch"):
            db.flush()
        assert raised
        reports = db.fault_reports()
        assert [(r.address, r.action) for r in reports] == [((M.LEDGER, 0), "restarted")]
        assert isinstance(reports[0], FaultReport)
        assert "injected fault in ContributionLog.append_columns" in reports[0].cause
        assert reports == db._core.fault_reports()
        reports.clear()  # a copy: the caller's list is its own
        assert len(db.fault_reports()) == 1
        # the restarted shard serves what the store holds: the first signal, not the lost one
        assert db.read_window("red", 7, 1, T0).count == 1
    with pytest.raises(DatabaseClosed):
        db.fault_reports()


def test_the_async_facade_lists_a_ledgers_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with open_tidal(str(tmp_path / "s"), config=CFG, clock=ManualClock(T0)) as db:
            await db.assign_cohort(1, "red")
            await db.flush()
            assert await db.fault_reports() == []
            fail_next(ContributionLog, "append_columns", monkeypatch)
            await db.signal_with_context(1, 7, 1, 2.0, T0)
            with pytest.raises(StorageError, match="lost 1 signal batch"):
                await db.flush()
            reports = await db.fault_reports()
            assert [(r.address, r.action) for r in reports] == [((M.LEDGER, 0), "restarted")]
        with pytest.raises(DatabaseClosed):
            await db.fault_reports()

    asyncio.run(main())
