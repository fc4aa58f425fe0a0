"""Which cohorts a restore from the history knows: `rematerialize` raises
`UnknownCohort` for a cohort nothing was ever attributed to (its purges, if any,
had nothing to remove), and answers for one whose records were all purged or
erased; the same live, after a clean close (snapshot), after a crash (the history
replayed) and after a ledger shard's restart from the store."""

from __future__ import annotations

from typing import Any

import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, TidalDb, UnknownCohort
from tidal_actors.actors import messages as M
from tidal_actors.storage.format import ledger_shard_of
from tidal_actors.testing import Harness

from .conftest import T0
from .test_adversarial_findings import _drop_snapshot

CFG = Config(rematerialize_after_ms=None, ledger_shards=2)


def _known(db: Any, cohort: str) -> bool:
    try:
        db.rematerialize(cohort)
    except UnknownCohort:
        return False
    return True


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crashed"])
def test_a_purge_that_removed_nothing_does_not_make_its_cohort_known(
    tmp_path: Any, crash: bool
) -> None:
    path = str(tmp_path / "s")
    with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as db:
        db.signal_with_context(4, 1, 0, 1.0, T0)
        _, manifest = db.request_community_purge(5, "blue")  # nobody is in blue
        assert manifest.entries == () and manifest.evicted == 0
        assert not _known(db, "blue")
    if crash:
        _drop_snapshot(path)
    with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as db:
        assert not _known(db, "blue")
        assert _known(db, COMMUNITY)


def test_nor_after_a_ledger_restart() -> None:
    h = Harness(seed=0, config=CFG)
    h.signal_with_context(4, 1, 0, 1.0, T0)
    h.run(h.request_community_purge(5, "blue"))
    with pytest.raises(UnknownCohort):
        h.run(h.rematerialize("blue"))
    h.crash_shard((M.LEDGER, ledger_shard_of("blue", CFG.ledger_shards)))
    h.run_until_idle()
    with pytest.raises(UnknownCohort):
        h.run(h.rematerialize("blue"))


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crashed"])
def test_a_cohort_whose_evicted_records_were_erased_stays_known(tmp_path: Any, crash: bool) -> None:
    """User 1's records in "c" are evicted from the log (a cap of 2) before the
    purge, so it retracts none live; the rebuild leaves them out and erases them
    from the history: the cohort is known all the same after a restore."""
    path = str(tmp_path / "s")
    cfg = CFG.replace(max_contribution_log_entries=2, membership_shards=1)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "c")
        db.signal_with_context(1, 1, 0, 1.0, T0)
        for i in range(4):
            db.signal_with_context(2, 2, 0, 1.0, T0 - 1 - i)
        _, manifest = db.request_community_purge(1, "c")
        assert manifest.entries == () and manifest.evicted == 1
        assert db.rematerialize("c").records_excluded == 1
    if crash:
        _drop_snapshot(path)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        assert _known(db, "c")


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crashed"])
def test_a_cohort_purged_and_erased_stays_known_with_no_history_left(
    tmp_path: Any, crash: bool
) -> None:
    """Every record of the store purged (from "c" and the community) and erased by
    the rebuilds: no history batch holds a record, and both cohorts are known."""
    path = str(tmp_path / "s")
    with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "c")
        db.signal_with_context(1, 1, 0, 1.0, T0)
        for cohort in ("c", COMMUNITY):
            db.request_community_purge(1, cohort)
            db.rematerialize(cohort)
    if crash:
        _drop_snapshot(path)
    with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as db:
        assert _known(db, "c") and _known(db, COMMUNITY)
