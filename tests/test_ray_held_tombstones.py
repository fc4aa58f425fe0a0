"""The purges' tombstones a ledger holds across a SIGKILL of its process under the Ray
host (`runtime.ray_restart`): a purge answered (committed; its retraction maybe still
on its way to the ledger) and the cohort's ledger killed at once. The restarted ledger
restores from its own environment and the coordinator's part, settles every row out of
the log at once (`build_states`), so the reads inside old buckets and the rebuilds read
the history back and leave out the tombstoned records through the held set: each
answer equals the reference model's, and again after a reopen."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tidal_actors import ManualClock, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.core.sharding import ledger_shard_of
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from ._ray import needs_ray, ray_config
from .conftest import SEC, T0

COHORTS = ("red", "green", "blue")
USERS = 9
READ_AT = [T0 - 40 * SEC, T0 - 20 * SEC, T0 + 1]


def _check(db: TidalDb, ref: ReferenceModel, where: str) -> None:
    for t in READ_AT:
        bad = rows_mismatch(db.aggregate_rows(t), ref.aggregate_rows(t))
        assert bad is None, (where, t, bad)


@needs_ray
def test_a_ledger_killed_right_after_a_purge_reads_back_without_its_records(
    ray_session: None, tmp_path: Path
) -> None:
    path = str(tmp_path / "store")
    cfg = ray_config(
        membership_shards=2,
        ledger_shards=2,
        max_contribution_log_entries=40,
        store_layout="shards",
    )
    ref = ReferenceModel(cfg, ManualClock(T0), history=True)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        for u in range(USERS):
            for c in (COHORTS[u % 3], COHORTS[(u + 1) % 3]):
                db.assign_cohort(u, c)
                ref.assign_cohort(u, c)
        for k, (user, cohort) in enumerate([(1, "green"), (4, "blue"), (2, "red")]):
            for i in range(60):
                n = k * 60 + i
                args = (n % USERS, n % 4, n % 2, 1.0 + n % 3, T0 - (n % 50) * SEC)
                db.signal_with_context(*args)
                ref.signal_with_context(*args)
            for i in range(3):  # the user's latest records: live in the log
                args = (user, i, 1, 2.0, T0 - (10 + i) * SEC)
                db.signal_with_context(*args)
                ref.signal_with_context(*args)
            db.flush()
            _, manifest = db.request_community_purge(user, cohort)
            _, expected = ref.request_community_purge(user, cohort)
            assert (len(manifest.entries), manifest.evicted) == (
                len(expected.entries),
                expected.evicted,
            )
            assert manifest.entries  # records retracted live: tombstoned
            pid = db._core.host.pids()[(M.LEDGER, ledger_shard_of(cohort, 2))]
            os.kill(pid, signal.SIGKILL)  # its ApplyPurge maybe not handled yet
            restarts = k + 1
            deadline = time.monotonic() + 120
            while sum(r.action == "restarted" for r in db._core.fault_reports()) < restarts:
                assert time.monotonic() < deadline, "no restart reported"
                time.sleep(0.05)
            db.flush()
            _check(db, ref, f"after kill {k}")
        for c in COHORTS:
            db.rematerialize(c)
            ref.rematerialize(c)
        _check(db, ref, "after the rebuilds")
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        _check(db, ref, "after reopen")
