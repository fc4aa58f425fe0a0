"""Adversarial runs of the Ray host's restarts in place (session 29's review): kills
the existing tests do not combine (a leave in flight at a membership shard's kill,
the coordinator and then a membership shard killed, a rebuild in flight at the
coordinator's kill), each checked against the reference model fed what was
acknowledged, live and reopened under the pykka host. Skipped where Ray is not
installed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tidal_actors import ActorFailure, ManualClock, MembershipStatus, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from ._ray import needs_ray, ray_config
from .conftest import T0
from .test_ray_membership_restart import OURS, _heard, _kill, _kill_ledger
from .test_ray_restart import COHORTS, USERS, _assign, _open, _stream


def _coordinator_heard(db: TidalDb, epoch: int, timeout: float = 120.0) -> None:
    links = db._core.host.links
    deadline = time.monotonic() + timeout
    while links.epoch(M.COORD_ADDR) <= epoch:
        assert time.monotonic() < deadline, "no notice of the coordinator's restart"
        time.sleep(0.05)


@needs_ray
def test_leaves_in_flight_when_their_membership_shard_is_killed(
    ray_session: None, tmp_path: Path
) -> None:
    """Leaves sent just before the kill: each acknowledged one is Left after the
    restart; a failed one is Left or Active (it says it may have been applied), and
    asked again it gates. The signals after that are dropped for every leaver, and
    the aggregates equal the reference model's, live and reopened."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0))
    leavers = OURS[:6]
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 10)
        db.flush()
        calls = [db._core.leave_community_layer(u) for u in leavers]
        epoch = _kill(db)
        for c in calls:
            assert c.replies[0].wait(120.0)
        _heard(db, epoch)
        for u, c in zip(leavers, calls, strict=True):
            status = db.community_layer_status(u)
            if c.error is None:
                assert status.status == MembershipStatus.Left, (u, status)
            else:
                assert "may have been applied" in str(c.error)
                if status.status != MembershipStatus.Left:
                    db.leave_community_layer(u)
            ref.leave_community_layer(u)
            assert db.community_layer_status(u) == ref.community_layer_status(u)
        _stream(db, ref, 10, 10)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        db.rejoin_community_layer(leavers[0])
        ref.rejoin_community_layer(leavers[0])
        _stream(db, ref, 20, 5)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None
        for u in leavers:
            assert again.community_layer_status(u) == ref.community_layer_status(u)


@needs_ray
def test_the_coordinator_then_a_membership_shard_killed(ray_session: None, tmp_path: Path) -> None:
    """The coordinator restarts, then a membership shard: purges of users of both
    shards after both restarts list exactly the reference model's records, then a
    ledger is killed and a further purge is exact too."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0))
    others = [u for u in range(USERS) if u not in OURS]
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 10)
        db.flush()
        host = db._core.host
        epoch = host.links.epoch(M.COORD_ADDR)
        os.kill(host.pids()[M.COORD_ADDR], signal.SIGKILL)
        _coordinator_heard(db, epoch)
        _heard(db, _kill(db))
        _stream(db, ref, 10, 5)
        db.flush()
        for u in (OURS[0], others[0], OURS[1], others[1]):
            cohort = COHORTS[u % 4]
            _, got = db.request_community_purge(u, cohort)
            _, want = ref.request_community_purge(u, cohort)
            assert got.entries == want.entries and len(got.entries) > 0, u
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        _kill_ledger(db, 0)
        _stream(db, ref, 15, 5)
        flush = db._core.flush()
        # a ledger restarted after the coordinator numbered its sends to the
        # coordinator for its failed incarnation's epoch: dropped, the flush hung
        assert flush.replies[0].wait(120.0), "the flush after the ledger's restart hung"
        flush.result()
        for u in (OURS[2], others[2]):
            cohort = COHORTS[(u + 1) % 4]
            _, got = db.request_community_purge(u, cohort)
            _, want = ref.request_community_purge(u, cohort)
            assert got.entries == want.entries and len(got.entries) > 0, u
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None


@needs_ray
def test_a_rebuild_in_flight_when_the_coordinator_is_killed(
    ray_session: None, tmp_path: Path
) -> None:
    """A rematerialization in flight at the coordinator's kill: its caller hears (an
    answer or an ActorFailure), never waits forever; asked again it completes, and the
    aggregates equal the reference model's after its own rebuild."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0))
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 20)
        db.flush()
        u = OURS[0]
        db.request_community_purge(u, COHORTS[u % 4])
        ref.request_community_purge(u, COHORTS[u % 4])
        host = db._core.host
        epoch = host.links.epoch(M.COORD_ADDR)
        call = db._core.rematerialize(COHORTS[u % 4])
        os.kill(host.pids()[M.COORD_ADDR], signal.SIGKILL)
        assert call.replies[0].wait(120.0), "the rebuild's caller never heard"
        if call.error is not None:
            assert isinstance(call.error, ActorFailure), call.error
        _coordinator_heard(db, epoch)
        db.rematerialize(COHORTS[u % 4])
        ref.rematerialize(COHORTS[u % 4])
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        _stream(db, ref, 20, 5)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None


@needs_ray
def test_a_ledger_killed_after_the_coordinator_restarted(ray_session: None, tmp_path: Path) -> None:
    """The restarted ledger numbers its calls to the coordinator for the coordinator's
    new incarnation (learnt from persistence): the flush after it completes (it hung
    when they were numbered for the failed incarnation's epoch and dropped) and a
    purge after it lists exactly the reference model's records."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0))
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 10)
        db.flush()
        host = db._core.host
        epoch = host.links.epoch(M.COORD_ADDR)
        os.kill(host.pids()[M.COORD_ADDR], signal.SIGKILL)
        _coordinator_heard(db, epoch)
        for li in (0, 1):
            _kill_ledger(db, li)
        _stream(db, ref, 10, 5)
        flush = db._core.flush()
        assert flush.replies[0].wait(120.0), "the flush after the ledgers' restart hung"
        flush.result()
        u = OURS[3]
        purge = db._core.request_community_purge(u, COHORTS[u % 4])
        assert purge.replies[0].wait(120.0), "the purge after the ledgers' restart hung"
        got = purge.result()[1]
        _, want = ref.request_community_purge(u, COHORTS[u % 4])
        assert got.entries == want.entries and len(want.entries) > 0
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None
