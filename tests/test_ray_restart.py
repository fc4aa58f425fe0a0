"""The Ray host restarts a killed ledger process in place, which restores by handshake
(`runtime.ray_restart`): SIGKILL of a ledger's worker mid-stream, several in a row,
and a purge across a kill, each checked against the reference model or against the
records as sent. One local Ray instance serves the test session (``ray_session``);
skipped, with the reason, where Ray is not installed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tidal_actors import ActorFailure, ManualClock, Signal, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.core.sharding import ledger_shard_of
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from ._ray import needs_ray, ray_config
from .conftest import SEC, T0

USERS = 24
COHORTS = ("red", "green", "blue", "gold")


def _open(path: str, clock: ManualClock, **changes: object) -> TidalDb:
    cfg = ray_config(membership_shards=2, ledger_shards=2, signal_batch_size=50, **changes)
    return TidalDb.open(path, config=cfg, clock=clock)


def _assign(db: TidalDb, ref: ReferenceModel) -> None:
    for u in range(USERS):
        for c in (COHORTS[u % 4], COHORTS[(u + 1) % 4]):
            db.assign_cohort(u, c)
            ref.assign_cohort(u, c)


def _stream(db: TidalDb, ref: ReferenceModel, start: int, batches: int) -> None:
    """``batches`` batches of 100 signals, numbered from ``start`` (each signal's
    fields follow from its number)."""
    for k in range(start, start + batches):
        batch = [
            Signal(i % USERS, i % 13, i % 2, 1.0 + i % 5, T0 - (i % 700) * SEC)
            for i in range(k * 100, (k + 1) * 100)
        ]
        db.signal_batch(batch)
        ref.signal_batch(batch)


def _kill(db: TidalDb, shard: int) -> int:
    pid = db._core.host.pids()[(M.LEDGER, shard)]
    os.kill(pid, signal.SIGKILL)
    return pid


def _restarted(db: TidalDb, n: int, timeout: float = 120.0) -> list[object]:
    """The "restarted" fault reports, once there are ``n`` (they come on the reply path)."""
    deadline = time.monotonic() + timeout
    while True:
        got = [r for r in db._core.fault_reports() if r.action == "restarted"]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@needs_ray
def test_a_ledger_killed_mid_stream_restarts_and_loses_no_acknowledged_signal(
    ray_session: None, tmp_path: Path
) -> None:
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    ref = ReferenceModel(ray_config(membership_shards=2, ledger_shards=2), ManualClock(T0))
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 30)  # some of it still on its way at the kill
        old = _kill(db, 0)
        _stream(db, ref, 30, 30)
        started = time.monotonic()
        db.flush()  # every signal acknowledged: none may be missing
        print(f"flush after the kill: {time.monotonic() - started:.2f} s")
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        assert db._core.host.pids()[(M.LEDGER, 0)] != old
        reports = _restarted(db, 1)
        assert [r.address for r in reports] == [(M.LEDGER, 0)]
        # the shards layout (the Ray host's default): no other shard's store is read
        assert "from its own environment and the coordinator's records" in reports[0].cause
        s = db.stats()
        assert (s["signals"], s["records"]) == (6000, ref.stats()["records"])
    # what it closed with is what its store holds, under either host
    with TidalDb.open(path, config=ray_config(membership_shards=2, ledger_shards=2, host="pykka"),
                      clock=clock) as again:  # fmt: skip
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None


@needs_ray
def test_several_kills_in_a_row(ray_session: None, tmp_path: Path) -> None:
    """Both ledgers killed in turn, one of them again right after its restart
    (before any call reached the new process), with signals between every kill."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    ref = ReferenceModel(ray_config(membership_shards=2, ledger_shards=2), ManualClock(T0))
    kills = 0
    with _open(path, clock) as db:
        _assign(db, ref)
        start = 0
        for shard in (0, 1, 0):
            _stream(db, ref, start, 10)
            start += 10
            _kill(db, shard)
            kills += 1
            _stream(db, ref, start, 10)
            start += 10
        _restarted(db, kills)
        _kill(db, 1)  # again, at once
        kills += 1
        _stream(db, ref, start, 10)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        reports = _restarted(db, kills)
        assert sorted(r.address[1] for r in reports) == [0, 0, 1, 1]
        assert db.stats()["signals"] == 100 * (start + 10)


@needs_ray
def test_a_purge_across_a_kill_lists_exactly_the_users_records(
    ray_session: None, tmp_path: Path
) -> None:
    """The ledger holding the cohort is killed with the user's records on their way,
    then the purge is requested: it either completes or fails saying it was not
    applied (the coordinator abandoned it at the restart); retried, its manifest
    lists each of the user's records once, in the order sent, and the others'
    weight is untouched."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cohort = "c"
    shard = ledger_shard_of(cohort, 2)
    with _open(path, clock) as db:
        for u in (1, 2, 3):
            db.assign_cohort(u, cohort)
        sent: dict[int, list[tuple[int, float, int]]] = {1: [], 2: [], 3: []}
        for i in range(600):
            u, e, w, ts = 1 + i % 3, i % 4, (1.0, 2.0, 0.5)[i % 3], T0 - i * SEC
            db.signal_with_context(u, e, 1, w, ts)
            sent[u].append((e, w, ts))
            if i == 400:
                _kill(db, shard)
        tries = 0
        while True:
            tries += 1
            try:
                pid, manifest = db.request_community_purge(2, cohort)
                break
            except ActorFailure as err:  # abandoned at the restart: nothing applied
                assert "nothing of it was committed" in str(err) and tries < 3
        got = [(r.entity_id, r.weight, r.timestamp_ns) for r in manifest.entries]
        assert got == sent[2]
        assert all(r.user_id == 2 and r.cohort == cohort for r in manifest.entries)
        assert manifest.evicted == 0
        assert db.purge_status(pid).retracted_live == 200
        at, width = T0 + 1, 10 * SEC
        rows = {(c, e): w for c, e, t, s, n, w in db.aggregate_rows(at) if c == cohort}
        for e in range(4):
            want = sum(
                w
                for u in (1, 3)
                for ee, w, ts in sent[u]
                if ee == e and ts // width >= at // width - 3
            )
            assert rows.get((cohort, e), 0.0) == pytest.approx(want, abs=1e-12)
        assert [m.purge_id for m in db.list_purge_manifests(2)] == [pid]
        assert _restarted(db, 1)


@needs_ray
def test_both_ledgers_killed_at_once_while_a_flush_waits(ray_session: None, tmp_path: Path) -> None:
    """Both ledger processes killed together while another thread's flush waits on
    them (its barrier on its way or in their mailboxes), signals on their way too:
    the flush returns, and every acknowledged signal is there once (the reference
    model), in the facade and in the store the database closed with."""
    import threading

    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    ref = ReferenceModel(ray_config(membership_shards=2, ledger_shards=2), ManualClock(T0))
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 20)
        flushed: list[BaseException | None] = []

        def flush() -> None:
            try:
                db.flush()
                flushed.append(None)
            except BaseException as exc:  # noqa: BLE001 - looked at below
                flushed.append(exc)

        pids = db._core.host.pids()  # both first: a dead actor does not answer
        t = threading.Thread(target=flush)
        t.start()
        for shard in (0, 1):
            os.kill(pids[(M.LEDGER, shard)], signal.SIGKILL)
        t.join(60.0)
        assert flushed == [None]
        _stream(db, ref, 20, 10)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        assert sorted(r.address[1] for r in _restarted(db, 2)) == [0, 1]
        s = db.stats()
        assert (s["signals"], s["records"]) == (3000, ref.stats()["records"])
    with TidalDb.open(path, config=ray_config(membership_shards=2, ledger_shards=2, host="pykka"),
                      clock=clock) as again:  # fmt: skip
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None


@needs_ray
def test_a_ledger_of_a_reopened_store_restarts(ray_session: None, tmp_path: Path) -> None:
    """A ledger's state restored at open is shipped to its actor (hundreds of KiB
    here). Ray keeps a large constructor argument only until the creation ends, so a
    restart long after the open used to fail and fence the shard (found by the
    fresh-install review: ray-project/ray#53727); the argument is now a boxed
    reference the restart does not need (`ray_shipping.box`)."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    ref = ReferenceModel(ray_config(membership_shards=2, ledger_shards=2), ManualClock(T0))
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 200)  # 20,000 signals
        db.flush()
    with _open(path, clock) as db:
        time.sleep(10)  # the open's creation tasks long over
        _kill(db, 1)
        _stream(db, ref, 200, 5)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        (report,) = _restarted(db, 1)
        assert report.address == (M.LEDGER, 1)  # type: ignore[attr-defined]
        assert db.stats()["signals"] == 500  # since this open
