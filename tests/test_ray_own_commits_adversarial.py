"""Adversarial checks of the Ray host's own commits in the ``shards`` layout
(`runtime.ray_control`) and of restarts that read a shard's own environment
(`storage.shard_part`): a membership shard's process SIGKILLed while assigns are in
flight (every assign that returned is in the restarted shard's state and in the
store after a reopen; one that failed says it may have been applied, and whatever it
left is the same live and reopened); a ledger SIGKILLed while the coordinator commits
purges (each purge exact or not committed, the aggregates the reference model's); the
coordinator's store opened once when two threads first need it; the coordinator and
a ledger killed at once. Skipped, with the reason, where Ray is not installed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tidal_actors import ActorFailure, ManualClock, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.core.sharding import membership_shard_of
from tidal_actors.storage.format import ledger_shard_of
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from ._ray import MAY_RETRY, needs_ray, ray_config
from .conftest import T0
from .test_ray_restart import COHORTS as RC
from .test_ray_restart import USERS, _assign, _open, _stream

SHARD = 0
COHORTS = tuple(f"c{k}" for k in range(12))


@needs_ray
def test_a_membership_shard_killed_while_assigns_are_in_flight(
    ray_session: None, tmp_path: Path
) -> None:
    path = str(tmp_path / "store")
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    users = [u for u in range(64) if membership_shard_of(u, 2) == SHARD][:16]
    pairs = [(u, c) for c in COHORTS for u in users]  # each assign its own record change
    acked: set[tuple[int, str]] = set()
    failed: dict[tuple[int, str], str] = {}
    lock = threading.Lock()
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        host = db._core.host
        assert db.store_layout == "shards"
        epoch = host.links.epoch((M.MEMBERSHIP, SHARD))
        pid = host.pids()[(M.MEMBERSHIP, SHARD)]

        def assigns(part: list[tuple[int, str]]) -> None:
            for u, c in part:
                try:
                    db.assign_cohort(u, c)
                except ActorFailure as err:
                    with lock:
                        failed[(u, c)] = str(err)
                else:
                    with lock:
                        acked.add((u, c))

        threads = [
            threading.Thread(target=assigns, args=(pairs[k::4],), daemon=True) for k in range(4)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(acked) < len(pairs) // 4:  # kill once a quarter were acknowledged
            assert time.monotonic() < deadline
            time.sleep(0.001)
        os.kill(pid, signal.SIGKILL)
        for t in threads:
            t.join(timeout=300)
            assert not t.is_alive()
        deadline = time.monotonic() + 120
        while host.links.epoch((M.MEMBERSHIP, SHARD)) <= epoch:
            assert time.monotonic() < deadline, "no notice of the restart"
            time.sleep(0.05)
        print(f"acknowledged {len(acked)}, failed {len(failed)} of {len(pairs)}")
        assert acked | set(failed) == set(pairs) and not acked & set(failed)
        for why in failed.values():
            assert "may have been applied" in why, why
        live = {u: db.cohorts_of(u) for u in users}
        missing = sorted(p for p in acked if p[1] not in live[p[0]])
        assert not missing, f"acknowledged assigns missing after the restart: {missing[:5]}"
        # the restarted shard takes writes again
        db.assign_cohort(users[0], "after")
        live[users[0]] = db.cohorts_of(users[0])
        assert "after" in live[users[0]]
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=ManualClock(T0)) as again:
        reopened = {u: again.cohorts_of(u) for u in users}
    assert reopened == live


@needs_ray
def test_a_ledger_killed_while_purges_commit_at_the_coordinator(
    ray_session: None, tmp_path: Path
) -> None:
    """Ledger 0 is SIGKILLed while one thread requests purges one after another, of
    cohorts of both ledgers (so the coordinator commits purges, and moves
    watermarks, while the ledger reads the coordinator's records and replays its
    own environment). Each purge completes with the manifest the reference model
    computes, fed the same purges in the same order, or fails saying nothing of it
    was committed; the aggregates then equal the model's, live and after a
    reopen."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2, signal_batch_size=50)
    ref = ReferenceModel(cfg, ManualClock(T0))
    assert {ledger_shard_of(c, 2) for c in RC} == {0, 1}
    outcomes: list[str] = []
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 30)
        db.flush()
        host = db._core.host
        before = host.links.epoch((M.LEDGER, 0))
        started = threading.Event()

        def purges() -> None:
            for k in range(3 * USERS):
                u = k % USERS
                c = RC[(u + k // USERS) % 4]
                if k == 3:
                    started.set()
                try:
                    _, got = db.request_community_purge(u, c)
                except ActorFailure as err:
                    assert "nothing of it was committed" in str(err), str(err)
                    outcomes.append("failed")
                    continue
                _, want = ref.request_community_purge(u, c)
                assert got.entries == want.entries and got.evicted == want.evicted, (u, c)
                outcomes.append("done")

        t = threading.Thread(target=purges, daemon=True)
        t.start()
        assert started.wait(120)
        os.kill(host.pids()[(M.LEDGER, 0)], signal.SIGKILL)
        t.join(timeout=600)
        assert not t.is_alive()
        deadline = time.monotonic() + 120
        while host.links.epoch((M.LEDGER, 0)) == before:
            assert time.monotonic() < deadline, "no notice of the ledger's restart"
            time.sleep(0.05)
        print("purges:", outcomes.count("done"), "done,", outcomes.count("failed"), "failed")
        assert len(outcomes) == 3 * USERS
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        _stream(db, ref, 30, 5)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None


@needs_ray
def test_the_store_opens_once_when_two_threads_first_need_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The coordinator's and a membership shard's actor open the store on first use
    (`ShardActor._resolve`), and since they commit their own writes the first use
    can come from two threads at once: the commit thread (`ray_control`) with the
    first purge, and Ray's thread serving `coordinator_part` to a restarting ledger.
    The store is opened once (two opens of one LMDB environment in one process
    break its locks, and one store would never be closed)."""
    from types import SimpleNamespace

    import tidal_actors.runtime.ray_actor as ray_actor

    opened: list[object] = []

    def slow_open(path: str, config: object, writer: bool) -> object:
        time.sleep(0.2)  # the open takes a while: the other thread comes meanwhile
        store = object()
        opened.append(store)
        return store

    monkeypatch.setattr(ray_actor, "actor_store", slow_open)
    cls = ray_actor.ShardActor.__ray_metadata__.modified_class
    actor = cls.__new__(cls)
    actor.address = M.COORD_ADDR
    actor.host = SimpleNamespace(commit_history=None, commit_control=lambda w: [])
    actor.store = None
    actor._opening = threading.Lock()  # as __init__ sets it (a lock of the instance:
    # Ray ships the class by value, and a lock does not pickle)
    actor._path = str(tmp_path / "store")
    actor._config = ray_config()
    got: list[object] = []
    threads = [
        threading.Thread(target=lambda: got.append(actor._resolve("store"))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 1, f"the store was opened {len(opened)} times"
    assert got == [opened[0], opened[0]] and actor.store is opened[0]


@needs_ray
def test_the_coordinator_and_a_ledger_killed_at_once(ray_session: None, tmp_path: Path) -> None:
    """Both processes SIGKILLed together (two workers of the facade's node lost at
    once): the restarting ledger fences its calls at the coordinator and reads the
    coordinator's records (`coordinator_part`), while the restarting coordinator
    fences its calls at the ledgers and asks them `CoordinatorLost`. Both restart
    (within 90 s: one restart takes a few seconds here), and a flush and a purge
    then complete, the purge's manifest the reference model's."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2, signal_batch_size=50)
    ref = ReferenceModel(cfg, ManualClock(T0))
    db = _open(path, clock)
    restarted = False
    try:
        _assign(db, ref)
        _stream(db, ref, 0, 10)
        db.flush()
        host = db._core.host
        before = {a: host.links.epoch(a) for a in (M.COORD_ADDR, (M.LEDGER, 0))}
        pids = host.pids()
        os.kill(pids[M.COORD_ADDR], signal.SIGKILL)
        os.kill(pids[(M.LEDGER, 0)], signal.SIGKILL)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if all(host.links.epoch(a) != e for a, e in before.items()):
                restarted = True
                break
            time.sleep(0.2)
        assert restarted, "the coordinator and the ledger did not both restart within 90 s"
        db.flush()
        _, got = db.request_community_purge(1, "red")
        _, want = ref.request_community_purge(1, "red")
        assert got.entries == want.entries
    finally:
        if not restarted:  # do not wait minutes in close() for actors stuck in a restart
            import ray

            for h in list(db._core.host._actors.values()):
                ray.kill(h)
        db.close()


@needs_ray
def test_the_coordinator_killed_while_purges_stream(ray_session: None, tmp_path: Path) -> None:
    """The coordinator's process is SIGKILLed while one thread requests purges back
    to back, so the kill finds a purge anywhere between its handing over to the
    coordinator's own commit thread and its answer. The purges answered before are
    exact; the one the kill interrupted either committed (listed once, exact, its
    records retracted once) or left nothing; purges after the restart are exact; the
    aggregates equal the reference model's, live and reopened."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2, signal_batch_size=50)
    ref = ReferenceModel(cfg, ManualClock(T0))
    plan = [(k % USERS, RC[(k % USERS + k // USERS) % 4]) for k in range(2 * USERS)]
    done: list[int] = []
    interrupted: list[tuple[int, str]] = []
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 30)
        db.flush()
        host = db._core.host
        epoch = host.links.epoch(M.COORD_ADDR)

        def purges() -> None:
            for k, (u, c) in enumerate(plan):
                try:
                    _, got = db.request_community_purge(u, c)
                except ActorFailure as err:
                    assert MAY_RETRY.search(str(err)), str(err)
                    interrupted.append((k, str(err)))
                    return
                _, want = ref.request_community_purge(u, c)
                assert got.entries == want.entries, (u, c)
                done.append(k)

        t = threading.Thread(target=purges, daemon=True)
        t.start()
        deadline = time.monotonic() + 120
        while len(done) < 5:
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.001)
        os.kill(host.pids()[M.COORD_ADDR], signal.SIGKILL)
        t.join(timeout=300)
        assert not t.is_alive()
        deadline = time.monotonic() + 120
        while host.links.epoch(M.COORD_ADDR) <= epoch:
            assert time.monotonic() < deadline, "no notice of the coordinator's restart"
            time.sleep(0.05)
        rest = len(done)
        if interrupted:
            k, why = interrupted[0]
            u, c = plan[k]
            ours = [m for m in db.list_purge_manifests(u) if m.cohort == c]
            before = sum(1 for j in done if plan[j] == (u, c))
            print(f"purge {k} interrupted ({why[:60]}...): committed={len(ours) > before}")
            if len(ours) > before:  # committed: complete, listed once
                assert len(ours) == before + 1
                _, want = ref.request_community_purge(u, c)
                assert ours[-1].entries == want.entries
                rest = k + 1
            else:
                rest = k
        else:
            print("no purge was interrupted: the kill came after the last")
        for u, c in plan[rest:]:
            _, got = db.request_community_purge(u, c)
            _, want = ref.request_community_purge(u, c)
            assert got.entries == want.entries, (u, c)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None
