"""Overlapping Ray restarts under load (`runtime.ray_restoring`, `runtime.ray_asks`):
purges requested back to back and signals streaming from two threads while two
actors are SIGKILLed together, staggered (the second while the first restores),
one twice (the second kill during its own restore), or two while an environment
cannot be opened (a restore fails, Ray restarts it). Every purge either commits (its
manifest listed once, exact) or fails to its caller saying it may be requested again
/ may have been applied; one that did not commit is requested again. Then the
manifests and the aggregates equal the reference model's, fed only the acknowledged
operations, live and after a reopen. The purges are of one membership shard's users,
the streamed signals of the other's, so the model's order of the two does not matter.
Skipped, with the reason, where Ray is not installed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tidal_actors import ActorFailure, ManualClock, Signal, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.core.sharding import ledger_shard_of, membership_shard_of
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from ._ray import MAY_RETRY, needs_ray, ray_config
from .conftest import SEC, T0
from .test_ray_restart import COHORTS, USERS, _assign, _open, _stream

SHARD = 0  # the membership shard of the purged users (killed in some cases)
OURS = [u for u in range(USERS) if membership_shard_of(u, 2) == SHARD]
OTHERS = [u for u in range(USERS) if membership_shard_of(u, 2) != SHARD]
LEDGER = (M.LEDGER, ledger_shard_of(COHORTS[0], 2))  # the ledger of COHORTS[0]
MEMBERSHIP = (M.MEMBERSHIP, SHARD)
WAIT_S = 120.0  # how long the facade may wait for each restart's notice (seconds)

Kill = Callable[[TidalDb, Path], None]  # (the database, its store directory)


def _pid(db: TidalDb, address: M.Address) -> int:
    """The process id of ``address``'s actor, once it answers (it may be restarting)."""
    import ray

    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return int(ray.get(db._core.host._actors[address].pid.remote()))
        except ray.exceptions.RayActorError:
            assert time.monotonic() < deadline, f"{address} did not come back"
            time.sleep(0.01)


def _kill(address: M.Address) -> Kill:
    def step(db: TidalDb, path: Path) -> None:
        os.kill(_pid(db, address), signal.SIGKILL)

    return step


def _pause(seconds: float) -> Kill:
    return lambda db, path: time.sleep(seconds)


def _kill_during_restore(address: M.Address) -> Kill:
    """Kill ``address``, wait for its next process (its constructor returned, so its
    restore runs) and kill that one too before the facade hears of the restart."""

    def step(db: TidalDb, path: Path) -> None:
        host = db._core.host
        epoch = host.links.epoch(address)
        old = _pid(db, address)
        os.kill(old, signal.SIGKILL)
        started, new = time.monotonic(), old
        while new == old:  # the dead process may still answer for a moment
            new = _pid(db, address)
        during = host.links.epoch(address) == epoch
        os.kill(new, signal.SIGKILL)
        took = time.monotonic() - started
        print(
            f"{address} killed again {took:.2f} s later, {'during' if during else 'after'} its restore"
        )

    return step


def _manifests(db: TidalDb, u: int) -> list[Any]:
    """``db.list_purge_manifests(u)``, asked again while it fails because the
    coordinator's process died with the call in flight (a victim killed twice may
    restart once more after the facade heard of its first restart): a read may be
    repeated, and the failure says so (`MAY_RETRY`)."""
    for _ in range(10):
        try:
            return list(db.list_purge_manifests(u))
        except ActorFailure as err:
            assert MAY_RETRY.search(str(err)), str(err)
            time.sleep(0.5)
    return list(db.list_purge_manifests(u))


def _again(db: TidalDb, u: int, c: str) -> object:
    """Request the purge of ``u`` in ``c`` again until it is answered or its
    manifest is listed (a later restart of a victim may fail it again, saying so);
    its entries."""
    for _ in range(5):
        listed = [m for m in _manifests(db, u) if m.cohort == c]
        if listed:
            assert len(listed) == 1, listed
            return listed[0].entries
        try:
            _, got = db.request_community_purge(u, c)
        except ActorFailure as err:
            assert MAY_RETRY.search(str(err)), str(err)
            print(f"requested again, failed again: {err}")
            continue
        return got.entries
    raise AssertionError(f"the purge of {u} in {c} failed 5 times")


def _through_kills(tmp_path: Path, steps: list[Kill], victims: list[M.Address]) -> None:
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2, signal_batch_size=50)
    ref = ReferenceModel(cfg, ManualClock(T0))
    plan = [(u, c) for u in OURS for c in (COHORTS[u % 4], COHORTS[(u + 1) % 4])]
    model = threading.Lock()
    done: list[tuple[int, str]] = []
    interrupted: list[tuple[tuple[int, str], str]] = []
    stop = threading.Event()
    streamed = [0]
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 20)
        db.flush()
        host = db._core.host
        before = {a: int(host.links.epoch(a)) for a in victims}

        def purges() -> None:
            for pair in plan:
                try:
                    _, got = db.request_community_purge(*pair)
                except ActorFailure as err:
                    assert MAY_RETRY.search(str(err)), str(err)
                    interrupted.append((pair, str(err)))
                    continue
                with model:
                    _, want = ref.request_community_purge(*pair)
                assert got.entries == want.entries and got.evicted == want.evicted, pair
                done.append(pair)

        def signals() -> None:
            k = 1000
            while not stop.is_set():
                batch = [
                    Signal(
                        OTHERS[i % len(OTHERS)], i % 13, i % 2, 1.0 + i % 5, T0 - (i % 700) * SEC
                    )
                    for i in range(k * 100, (k + 1) * 100)
                ]
                db.signal_batch(batch)  # raises if not taken: then it is not in the model
                with model:
                    ref.signal_batch(batch)
                streamed[0] += len(batch)
                k += 1
                time.sleep(0.005)

        errors: list[BaseException] = []

        def caught(f: Callable[[], None]) -> Callable[[], None]:
            def body() -> None:
                try:
                    f()
                except BaseException as exc:  # noqa: BLE001 - the test fails on it below
                    errors.append(exc)
                    raise

            return body

        threads = [threading.Thread(target=caught(f), daemon=True) for f in (purges, signals)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + WAIT_S
        while len(done) < 3:
            assert time.monotonic() < deadline and threads[0].is_alive()
            time.sleep(0.001)
        for step in steps:
            step(db, Path(path))
        threads[0].join(timeout=3 * WAIT_S)
        assert not threads[0].is_alive(), "a purge never answered"
        assert not errors, errors
        deadline = time.monotonic() + WAIT_S
        while any(host.links.epoch(a) <= e for a, e in before.items()):
            assert time.monotonic() < deadline, "no notice of every restart"
            time.sleep(0.05)
        stop.set()
        threads[1].join(timeout=WAIT_S)
        assert not threads[1].is_alive()
        assert not errors, errors
        print(f"{len(done)} purges answered, interrupted: {[p for p, _ in interrupted]}")
        for pair, _why in interrupted:
            u, c = pair
            listed = [m for m in _manifests(db, u) if m.cohort == c]
            _, want = ref.request_community_purge(u, c)
            if listed:  # committed before the kill: complete, listed once
                assert [m.entries for m in listed] == [want.entries], pair
            else:  # nothing of it committed: requested again, it is exact
                assert _again(db, u, c) == want.entries, pair
        for u in OURS:  # every pair purged once, exactly
            listed = sorted(m.cohort for m in _manifests(db, u))
            assert listed == sorted(c for v, c in plan if v == u), u
        try:
            db.flush()
        except ActorFailure as err:  # a flush in flight at a membership shard's kill
            assert MAY_RETRY.search(str(err)), str(err)
            db.flush()
        print(f"{streamed[0]} signals streamed through the kills")
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        restarted = {r.address for r in db._core.fault_reports() if r.action == "restarted"}
        assert restarted >= set(victims)
        _stream(db, ref, 40, 5)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None
        for u in OURS:
            listed = sorted(m.cohort for m in again.list_purge_manifests(u))
            assert listed == sorted(c for v, c in plan if v == u), u


def _kill_unopenable(a: M.Address, b: M.Address, env: str) -> Kill:
    """Make environment ``env`` unopenable (its ``lock.mdb`` a directory), SIGKILL
    ``a`` and ``b`` together, wait for the facade's "down" report of a failed restore
    (every actor's process opens every environment, so the first to open the store
    fails; the other's restore may be waiting for it), then put it back."""

    def step(db: TidalDb, path: Path) -> None:
        lock = path / "shards" / env / "lock.mdb"
        away = lock.with_name("lock.mdb.away")
        lock.rename(away)
        lock.mkdir()
        try:
            pids = [_pid(db, a), _pid(db, b)]
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + WAIT_S
            while True:
                down = [r for r in db._core.fault_reports() if r.action == "down"]
                if down:
                    break
                assert time.monotonic() < deadline, "no report of a failed restore"
                time.sleep(0.02)
        finally:
            lock.rmdir()
            away.rename(lock)
        assert "restore failed" in down[0].cause, down[0].cause
        print(f"{env} unopenable: {down[0].address}'s restore failed")

    return step


C, L, S = M.COORD_ADDR, LEDGER, MEMBERSHIP
CASES = [  # id, the kills in order (pauses between), the actors restarted
    ("coord+ledger", [_kill(C), _kill(L)], [C, L]),
    ("ledger-150ms-coord", [_kill(L), _pause(0.15), _kill(C)], [C, L]),
    ("coord-250ms-ledger", [_kill(C), _pause(0.25), _kill(L)], [C, L]),
    ("coord+membership", [_kill(C), _kill(S)], [C, S]),
    ("membership-100ms-coord", [_kill(S), _pause(0.1), _kill(C)], [C, S]),
    (  # every kind, staggered, and the ledger again while it restores
        "coord-ledger-membership-ledger-again",
        [_kill(C), _pause(0.05), _kill(L), _pause(0.1), _kill(S), _kill_during_restore(L)],
        [C, L, S],
    ),
    (  # the store unopenable while both restart: a restore fails, the next completes
        "coord+ledger-coord-env-unopenable",
        [_kill_unopenable(C, L, "coordinator")],
        [C, L],
    ),
    (
        "coord+membership-membership-env-unopenable",
        [_kill_unopenable(C, S, f"membership-{SHARD}")],
        [C, S],
    ),
]


@needs_ray
@pytest.mark.parametrize(("steps", "victims"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_purges_and_signals_through_overlapping_kills(
    ray_session: None, tmp_path: Path, steps: list[Kill], victims: list[M.Address]
) -> None:
    """Each interrupted purge committed exactly or failed saying so; all state equals
    the reference model's (see the module)."""
    _through_kills(tmp_path, steps, victims)


@needs_ray
@pytest.mark.parametrize("address", [L, C, S], ids=["ledger", "coord", "membership"])
def test_an_actor_killed_again_during_its_own_restore(
    ray_session: None, tmp_path: Path, address: M.Address
) -> None:
    """The second kill finds the next process restoring (the test prints whether it
    did); the restore after it completes and nothing acknowledged is lost."""
    _through_kills(tmp_path, [_kill_during_restore(address)], [address])


@needs_ray
def test_a_restore_that_fails_exits_and_the_next_restart_restores(
    ray_session: None, tmp_path: Path
) -> None:
    """The ledger's environment cannot be opened while it restarts (its ``lock.mdb``
    replaced by a directory, as an unreadable store): its restore fails, the facade
    hears a "down" report naming the restore, and Ray restarts the process again;
    once the environment is back the next restore completes ("restarted"), and the
    signals acknowledged before (flushed, and taken since the flush) are all there,
    as the reference model has them, live and after a reopen."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2, signal_batch_size=50)
    ref = ReferenceModel(cfg, ManualClock(T0))
    lock = Path(path) / "shards" / f"ledger-{LEDGER[1]}" / "lock.mdb"
    away = lock.with_name("lock.mdb.away")
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 20)
        db.flush()
        _stream(db, ref, 20, 5)  # taken, not flushed
        host = db._core.host
        epoch = int(host.links.epoch(LEDGER))
        assert lock.is_file()
        lock.rename(away)
        lock.mkdir()
        try:
            os.kill(_pid(db, LEDGER), signal.SIGKILL)
            deadline = time.monotonic() + WAIT_S
            while True:
                down = [
                    r
                    for r in db._core.fault_reports()
                    if r.address == LEDGER and r.action == "down"
                ]
                if down:
                    break
                assert time.monotonic() < deadline, "no report of the failed restore"
                time.sleep(0.05)
            print("reported:", down[0].cause)
            assert "restore failed" in down[0].cause
            assert host.links.epoch(LEDGER) == epoch  # not restarted yet
        finally:
            lock.rmdir()
            away.rename(lock)
        deadline = time.monotonic() + WAIT_S
        while host.links.epoch(LEDGER) <= epoch:
            assert time.monotonic() < deadline, "no notice of the ledger's restart"
            time.sleep(0.05)
        assert any(
            r.address == LEDGER and r.action == "restarted" for r in db._core.fault_reports()
        )
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        u = OURS[0]
        c = (
            COHORTS[u % 4]
            if ledger_shard_of(COHORTS[u % 4], 2) == LEDGER[1]
            else COHORTS[(u + 1) % 4]
        )
        _, got = db.request_community_purge(u, c)
        _, want = ref.request_community_purge(u, c)
        assert got.entries == want.entries and len(got.entries) > 0
        _stream(db, ref, 40, 5)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None
