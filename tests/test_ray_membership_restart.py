"""The Ray host restarts a killed membership shard's process in place, which restores
from the store and numbers its records above what the ledgers hold
(`runtime.ray_membership_restart`): SIGKILL of a membership shard's worker after a
flush, then signals, a leave and purges, each checked against the reference model fed
exactly the acknowledged operations; and the calls in flight to it fail saying they
may have been applied. One local Ray instance serves the test session
(``ray_session``); skipped, with the reason, where Ray is not installed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tidal_actors import ActorFailure, ManualClock, Signal, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.core.sharding import membership_shard_of
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from ._ray import MAY_RETRY, needs_ray, ray_config
from .conftest import SEC, T0
from .test_ray_restart import COHORTS, USERS, _assign, _open, _stream

SHARD = 0  # the membership shard killed
OURS = [u for u in range(USERS) if membership_shard_of(u, 2) == SHARD]


def _kill(db: TidalDb, pid: int | None = None) -> int:
    """SIGKILL membership shard ``SHARD``'s process (``pid`` if known); returns the
    epoch the facade's links numbered for before."""
    host = db._core.host
    epoch = host.links.epoch((M.MEMBERSHIP, SHARD))
    os.kill(pid or host.pids()[(M.MEMBERSHIP, SHARD)], signal.SIGKILL)
    return int(epoch)


def _heard(db: TidalDb, epoch: int, timeout: float = 120.0) -> int:
    """Wait until the facade has taken the new incarnation's notice (its links number
    for a newer epoch); returns that epoch."""
    deadline = time.monotonic() + timeout
    links = db._core.host.links
    while links.epoch((M.MEMBERSHIP, SHARD)) <= epoch:
        assert time.monotonic() < deadline, "no notice of the membership shard's restart"
        time.sleep(0.05)
    return int(links.epoch((M.MEMBERSHIP, SHARD)))


def _kill_ledger(db: TidalDb, li: int, *, flush: bool = False, timeout: float = 120.0) -> None:
    """SIGKILL ledger ``li``'s process (then ``flush()`` if asked, which waits for its
    restart) and wait until the facade has the restart's notice (its links number for
    a new epoch)."""
    host = db._core.host
    before = host.links.epoch((M.LEDGER, li))
    os.kill(host.pids()[(M.LEDGER, li)], signal.SIGKILL)
    if flush:
        db.flush()
    deadline = time.monotonic() + timeout
    while host.links.epoch((M.LEDGER, li)) == before:
        assert time.monotonic() < deadline, "no notice of the ledger's restart"
        time.sleep(0.05)


def _stream_others(db: TidalDb, ref: ReferenceModel, start: int, batches: int) -> None:
    """As `_stream`, the signals of the users of the other membership shard only."""
    others = [u for u in range(USERS) if u not in OURS]
    for k in range(start, start + batches):
        batch = [
            Signal(others[i % len(others)], i % 13, i % 2, 1.0 + i % 5, T0 - (i % 700) * SEC)
            for i in range(k * 100, (k + 1) * 100)
        ]
        db.signal_batch(batch)
        ref.signal_batch(batch)


def _restarted(db: TidalDb) -> list[object]:
    return [
        r
        for r in db._core.fault_reports()
        if r.action == "restarted" and r.address == (M.MEMBERSHIP, SHARD)
    ]


@needs_ray
def test_a_restart_epoch_is_above_every_epoch_before_even_after_a_clock_step_back() -> None:
    from tidal_actors.runtime.ray_membership_restart import epoch_after

    opened = 1_700_000_000_000_000_000
    # the clock ahead of every epoch before: the clock
    assert epoch_after(opened + 5_000, opened, [opened + 10]) == opened + 5_000
    # the clock stepped back below the fenced incarnation's epoch: one above it
    assert epoch_after(opened - 3_000, opened, [opened + 10, opened + 42]) == opened + 43
    # nothing seen but the first incarnation, the clock behind it
    assert epoch_after(opened - 1, opened, []) == opened + 1


@needs_ray
def test_a_membership_shard_killed_after_a_flush_restarts_from_its_store(
    ray_session: None, tmp_path: Path
) -> None:
    """Killed after a flush: its memberships, leave epochs and routes come back from
    the store (a user who left before stays gated), its records are numbered above
    the ledgers' (the purges after it list each of a user's records once), and the
    aggregates equal the reference model's, fed only what was acknowledged."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0))
    gone, later = OURS[0], OURS[1]  # one leaves before the kill, one after
    with _open(path, clock) as db:
        _assign(db, ref)
        db.leave_community_layer(gone)
        ref.leave_community_layer(gone)
        _stream(db, ref, 0, 20)
        db.flush()
        pid = db._core.host.pids()[(M.MEMBERSHIP, SHARD)]
        epoch = _kill(db)
        # the stream goes on through the other shard meanwhile
        _stream_others(db, ref, 100, 5)
        try:  # nothing was sent to it since the last flush: completes, or fails in doubt
            db.flush()
        except ActorFailure as err:
            assert "may have been applied" in str(err)
        new_epoch = _heard(db, epoch)
        db.flush()  # acknowledges the other shard's signals
        assert new_epoch > epoch
        assert db._core.host.pids()[(M.MEMBERSHIP, SHARD)] != pid
        _stream(db, ref, 20, 20)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        assert db.community_layer_status(gone) == ref.community_layer_status(gone)
        assert db.community_leave_history(gone) == ref.community_leave_history(gone)
        # a leave after the restart gates at once; the signals after it are dropped
        db.leave_community_layer(later)
        ref.leave_community_layer(later)
        _stream(db, ref, 40, 5)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        assert db.community_layer_status(later) == ref.community_layer_status(later)
        # purges after the restart list exactly each user's records (numbers handed
        # out twice would let one user's purge take another's records)
        for u in (*OURS[1:5], *[u for u in range(USERS) if u not in OURS][:2]):
            cohort = COHORTS[u % 4]
            _, got = db.request_community_purge(u, cohort)
            _, want = ref.request_community_purge(u, cohort)
            assert got.entries == want.entries and got.evicted == want.evicted, u
            assert len(got.entries) > 0
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        # it numbers on from the records its failed incarnation numbered: 3 a signal
        # (two cohorts and @community) of its users but the one who left
        numbered = 3 * sum(1 for i in range(2000) if i % USERS in OURS and i % USERS != gone)
        (report,) = _restarted(db)
        assert f"records numbered from {numbered})" in report.cause  # type: ignore[attr-defined]
        # the shards layout (the Ray host's default): no other shard's store is read
        assert "from its own environment and the coordinator's records" in report.cause  # type: ignore[attr-defined]
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None
        assert again.community_layer_status(later) == ref.community_layer_status(later)


@needs_ray
def test_signals_sent_to_a_killed_membership_shard_fail_the_next_flush(
    ray_session: None, tmp_path: Path
) -> None:
    """Signals sent to the killed shard before the facade heard of its restart may be
    lost: the flush after them fails saying so; the signals sent after it are
    applied once each and the next flush completes. The other shard's users lose
    nothing; a control operation in flight fails saying it may have been applied."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    with _open(path, clock) as db:
        for u in range(USERS):
            db.assign_cohort(u, COHORTS[u % 4])
        db.flush()
        epoch = _kill(db)
        doubt = db._core.assign_cohort(OURS[0], "late")  # in flight to the dead process
        lost = [Signal(u, 1, 0, 1.0, T0 - SEC) for u in OURS for _ in range(5)]
        db.signal_batch(lost)
        with pytest.raises(ActorFailure, match=r"partly applied|may have been applied"):
            db.flush()
        _heard(db, epoch)
        assert doubt.replies[0].wait(60.0)
        with pytest.raises(ActorFailure, match="may have been applied"):
            doubt.result()
        # after the notice: every signal applied once, to either shard
        before = {(c, e): n for c, e, t, s, n, w in db.aggregate_rows() if t == 0}
        sent = [Signal(u, 2, 0, 1.0, T0 - SEC) for u in range(USERS)]
        db.signal_batch(sent)
        db.flush()
        rows = {(c, e): n for c, e, t, s, n, w in db.aggregate_rows() if t == 0}
        for cohort in COHORTS:
            want = sum(1 for u in range(USERS) if COHORTS[u % 4] == cohort)
            assert rows[(cohort, 2)] - before.get((cohort, 2), 0) == want
        assert rows[("@community", 2)] - before.get(("@community", 2), 0) == USERS


@needs_ray
def test_a_purge_in_flight_when_its_membership_shard_is_killed(
    ray_session: None, tmp_path: Path
) -> None:
    """The shard is killed right after a purge request went to it: the purge commits
    (its manifest is listed) or its caller hears it may have been applied / was not
    committed; either way the coordinator is not left waiting for the failed
    incarnation (RecoverMembership), and a purge of the same pair after the restart
    lists exactly the records left, as the reference model does."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0))
    u = OURS[1]
    cohort = COHORTS[u % 4]
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 20)
        db.flush()
        pid = db._core.host.pids()[(M.MEMBERSHIP, SHARD)]
        call = db._core.request_community_purge(u, cohort)
        epoch = _kill(db, pid)
        assert call.replies[0].wait(120.0)
        if call.error is not None:
            assert MAY_RETRY.search(str(call.error)), call.error
        _heard(db, epoch)
        first = db.list_purge_manifests(u)
        print("the purge in flight:", "committed" if first else repr(call.error))
        if first:  # it committed before the kill took it: the model takes it too
            _, want = ref.request_community_purge(u, cohort)
            assert first[0].entries == want.entries
        _stream(db, ref, 20, 10)
        db.flush()
        _, got = db.request_community_purge(u, cohort)
        _, want = ref.request_community_purge(u, cohort)
        assert got.entries == want.entries and len(got.entries) > 0
        assert [m.purge_id for m in db.list_purge_manifests(u)][-1] == got.purge_id
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None


@needs_ray
def test_the_coordinator_killed_during_a_purge(ray_session: None, tmp_path: Path) -> None:
    """The coordinator restarts in place (`runtime.ray_coordinator_restart`): the
    purge in flight at the kill either committed, and is then complete (listed, its
    records retracted once), or did not, and nothing of it is applied; its caller
    hears it may have been applied. Requested again it lists exactly the user's
    records; a purge of another user after the restart too; the aggregates equal the
    reference model's, live and reopened under the pykka host."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0))
    u, v = OURS[2], OURS[3]
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 20)
        db.flush()
        host = db._core.host
        pid, epoch = host.pids()[M.COORD_ADDR], host.links.epoch(M.COORD_ADDR)
        call = db._core.request_community_purge(u, COHORTS[u % 4])
        os.kill(pid, signal.SIGKILL)
        assert call.replies[0].wait(120.0)
        print("the purge in flight:", "answered" if call.error is None else repr(call.error))
        if call.error is not None:
            assert MAY_RETRY.search(str(call.error)), call.error
        deadline = time.monotonic() + 120
        while host.links.epoch(M.COORD_ADDR) <= epoch:
            assert time.monotonic() < deadline, "no notice of the coordinator's restart"
            time.sleep(0.05)
        listed = db.list_purge_manifests(u)
        print("committed before the kill:", bool(listed))
        _, want = ref.request_community_purge(u, COHORTS[u % 4])
        if listed:  # committed: complete, its records retracted once
            assert [m.entries for m in listed] == [want.entries]
        else:  # not committed: nothing of it applied; again, it is exact
            _, got = db.request_community_purge(u, COHORTS[u % 4])
            assert got.entries == want.entries
        assert len(want.entries) > 0
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        _, got = db.request_community_purge(v, COHORTS[v % 4])
        _, want = ref.request_community_purge(v, COHORTS[v % 4])
        assert got.entries == want.entries and len(got.entries) > 0
        _stream(db, ref, 20, 5)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        assert any(r.address == M.COORD_ADDR and r.action == "restarted"
                   for r in db._core.fault_reports())  # fmt: skip
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None


@needs_ray
def test_a_membership_shard_killed_twice_in_a_row(ray_session: None, tmp_path: Path) -> None:
    """Killed again as soon as its first restart is heard of: each incarnation's epoch
    is above the one before, and the acknowledged signals are all there once."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0))
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 10)
        db.flush()
        first = _heard(db, _kill(db))
        second = _heard(db, _kill(db))
        assert second > first
        _stream(db, ref, 10, 10)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        assert len(_restarted(db)) == 2


@needs_ray
def test_a_membership_shard_killed_after_a_ledger_restarted(
    ray_session: None, tmp_path: Path
) -> None:
    """A ledger restarted first (its epoch is no longer the database's open time):
    the membership shard's new incarnation numbers its attributions for the ledger's
    current epoch (learnt from persistence), so they are taken, and the flushes after
    it complete with the reference model's aggregates."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0))
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 10)
        db.flush()
        for li in (0, 1):
            _kill_ledger(db, li, flush=True)
        _heard(db, _kill(db))
        _stream(db, ref, 10, 10)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None


@needs_ray
def test_the_coordinator_killed_right_after_a_purge_committed(
    ray_session: None, tmp_path: Path
) -> None:
    """The kill lands once the purge's manifest is in the store (the test reads it
    there): the purge is complete after the restart, whether its retraction had left
    the failed incarnation or the new one applied it from the ledger's preparation
    (its fault report says how many it applied); its records are retracted once."""
    from tidal_actors.storage.format import Keyspace, Tag, decode_key

    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0))
    u = OURS[2]
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 20)
        db.flush()
        host = db._core.host
        pid, epoch = host.pids()[M.COORD_ADDR], host.links.epoch(M.COORD_ADDR)
        call = db._core.request_community_purge(u, COHORTS[u % 4])
        deadline = time.monotonic() + 60
        while not any(
            decode_key(k)[:2] == (u, Tag.PURGE_MANIFEST)
            for k, _ in db._core.store.scan(Keyspace.ITEMS)
        ):
            assert time.monotonic() < deadline, "the purge never committed"
        os.kill(pid, signal.SIGKILL)
        assert call.replies[0].wait(120.0)
        if call.error is not None:
            assert "may have been applied" in str(call.error)
        while host.links.epoch(M.COORD_ADDR) <= epoch:
            assert time.monotonic() < deadline + 120, "no notice of the coordinator's restart"
            time.sleep(0.05)
        (listed,) = db.list_purge_manifests(u)
        _, want = ref.request_community_purge(u, COHORTS[u % 4])
        assert listed.entries == want.entries and len(want.entries) > 0
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        reports = [r.cause for r in db._core.fault_reports() if r.address == M.COORD_ADDR]
        print("the coordinator's restart:", reports, "the caller:", call.error)
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None
