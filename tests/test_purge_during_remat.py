"""A purge of a cohort being re-materialized does not wait for the rebuild.

The rebuild gives way (dropped at its ledger, started again after the purge, covering
it), at most ``REMAT_YIELDS`` times in a row for a cohort; whatever the delivery
order, the state afterwards equals the reference model's, before and after a reopen.
"""

from __future__ import annotations

import pytest

from tidal_actors.actors.rematerializer import REMAT_YIELDS
from tidal_actors.storage.rematerialize import RematJob
from tidal_actors.testing import Harness

from ._differential import Blocking, Recorder, assert_matches
from ._setups import HOUR_WINDOWS

CFG = HOUR_WINDOWS.replace(membership_shards=2, ledger_shards=1, max_contribution_log_entries=6)


LEDGER0 = ("ledger", 0)
STEPS = 40  # a rebuild takes this many RematStep messages (`slow_rebuilds`)


@pytest.fixture
def slow_rebuilds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rebuild takes ``STEPS`` steps, so a purge sent once it has started
    reaches the coordinator while it runs, whatever the delivery order."""
    step = RematJob.step

    def slow(self: RematJob) -> bool:
        self.slow_steps = getattr(self, "slow_steps", 0) + 1
        return step(self) if self.slow_steps >= STEPS else False

    monkeypatch.setattr(RematJob, "step", slow)


def _step_until_started(h: Harness) -> None:
    """Deliver until the ledger runs a rebuild."""
    for _ in range(10_000):
        if getattr(h.behaviour(LEDGER0), "_jobs", None):
            return
        assert h.step(), "ran out of messages"
    raise AssertionError("the rebuild never started")


def _aborts(h: Harness) -> int:
    return sum("RematAbort" in line for line in h.trace_lines())


def _purge_during_rebuild(seeds: range) -> int:
    """Purge 2 once the rebuild after purge 1 is running; compare with the model.
    Returns how many rebuilds gave way."""
    yielded = 0
    for seed in seeds:
        h = Harness(seed=seed, config=CFG)
        r = Recorder(h)
        for u in (1, 2, 3):
            r.assign_cohort(u, "red")
        for i in range(9):  # more than the log holds: some records are evicted
            r.signal_with_context(1 + i % 3, i % 4, 0, 1.0 + i)
        h.run(r.request_community_purge(1, "red"))
        remat = h.rematerialize("red")
        _step_until_started(h)
        purge = r.request_community_purge(2, "red")
        h.run_until_idle()
        _, manifest = purge.result()
        assert manifest.user_id == 2
        # the waiter is answered by the rebuild that finished, before or after the purge
        assert remat.result().cohort == "red"
        yielded += _aborts(h)
        db = Blocking(h)
        db.rematerialize("red")  # whether or not the last rebuild covered the purge
        model = r.model(CFG)
        model.rematerialize("red")
        assert_matches(db, model, [1, 2, 3], where=f"seed {seed}: ")
        for u in (1, 2):
            for m in db.list_purge_manifests(u):
                status = db.purge_status(m.purge_id)
                assert status.rematerialized, (seed, m.purge_id)
                # the records the log had evicted are the ones the rebuild left out,
                # counted once, whichever rebuild did it (one swapped in before it
                # heard it gave way hands them on)
                assert status.excluded_by_rematerialization == m.evicted, (seed, u)
        h.close_and_reopen()
        assert_matches(db, model, [1, 2, 3], where=f"seed {seed}, reopened: ")
    return yielded


@pytest.mark.usefixtures("slow_rebuilds")
def test_a_purge_during_its_cohorts_rebuild_goes_first_and_matches_the_model() -> None:
    assert _purge_during_rebuild(range(12)) == 12  # each found the rebuild running


def test_a_rebuild_that_finishes_before_it_is_told_to_give_way_is_harmless() -> None:
    """Rebuilds of one step: in some delivery orders the rebuild is swapped in before
    the `RematAbort` reaches the ledger (its `RematDone` is then ignored), in others
    it is dropped; either way the state matches the model."""
    assert 0 < _purge_during_rebuild(range(100, 124)) < 24


@pytest.mark.usefixtures("slow_rebuilds")
def test_a_cohort_purged_again_and_again_is_still_rebuilt() -> None:
    """Each purge lands while the cohort's rebuild runs: the rebuild gives way
    ``REMAT_YIELDS`` times, then the next purge waits for it."""
    h = Harness(seed=3, config=CFG)
    r = Recorder(h)
    users = list(range(1, REMAT_YIELDS + 3))
    for u in users:
        r.assign_cohort(u, "red")
        r.signal_with_context(u, u, 0, float(u))
    h.run_until_idle()
    remat = h.rematerialize("red")
    for u in users[:-1]:
        _step_until_started(h)
        h.run(r.request_community_purge(u, "red"))
    assert _aborts(h) == REMAT_YIELDS
    h.run_until_idle()
    assert remat.result().cohort == "red"
    model = r.model(CFG)
    model.rematerialize("red")
    assert_matches(Blocking(h), model, users)
