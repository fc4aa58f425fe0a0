"""Issue 18, item 5: the facade's process dies under the Ray host.

A child process (a Ray driver joined to the session's cluster) runs the crash
tests' mixed workload (`tests._crash_worker.workload`: assigns, leaves, rejoins,
purges, flushes and signals, each noted in a side file before it is called and
acknowledged after it returns) on a durable database under the Ray host, and is
killed with SIGKILL at a random moment. Ray then ends that driver's actors; until it
has, a new open waits for them (`storage.actor_lock`). The store is reopened under
the pykka host and checked as the crash tests check it (`test_crash.Chain`): every
acknowledged control operation and purge is there with its manifest, the one in
flight entirely or not at all, every signal before an acknowledged flush is there,
and of the signals after it each ledger holds a prefix (one membership shard), the
state equal to the reference model's over exactly that. Several kills on one store,
so a store a killed facade left is itself restored and written again under Ray.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from tidal_actors import Config, DatabaseLocked, StorageError, TidalDb
from tidal_actors.storage.actor_lock import ACTORS_LOCK, wait_for_actors

from . import _crash_worker as W
from ._ray import needs_ray
from .test_crash import CFG, T0, Chain, _lines, reopen_and_reconcile

KILLS = 3
OPEN_WAIT_S = 180.0  # a driver's start and the open of its 6 actor processes, under load


@pytest.fixture(scope="module")
def mp() -> Any:
    return W.forkserver()


def _address(session: Any) -> str:
    import ray

    if session.cluster is not None:
        return str(session.cluster.address)
    return str(ray.get_runtime_context().gcs_address)


def _wait_opened(side: Path, proc: Any) -> None:
    deadline = time.monotonic() + OPEN_WAIT_S
    while time.monotonic() < deadline:
        if any("opened" in rec for rec in _lines(side)):
            return
        if proc.exitcode is not None:
            raise AssertionError(
                f"the child ended before it opened the store (exit {proc.exitcode})"
            )
        time.sleep(0.05)
    raise AssertionError(f"the child did not open the store within {OPEN_WAIT_S} s")


@needs_ray
def test_a_killed_facade_loses_nothing_acknowledged(
    mp: Any, ray_session: Any, tmp_path: Path
) -> None:
    rng = random.Random(18)
    path = str(tmp_path / "store")
    ray_cfg = {**CFG, "host": "ray", "ray_address": _address(ray_session)}
    chain = Chain(CFG)
    start = T0
    report = []
    held_after_kill = 0
    for k in range(KILLS):
        side = tmp_path / f"side-{k}.jsonl"
        p = mp.Process(target=W.workload, args=(path, str(side), 1800 + k, start, ray_cfg))
        p.start()
        try:
            _wait_opened(side, p)
            time.sleep(rng.uniform(0.5, 3.0))  # control round trips take milliseconds here
        finally:
            p.kill()
            p.join(30)
        assert p.exitcode == -9, f"the child ended before the kill (exit {p.exitcode})"
        try:  # the dead driver's actors still run: they hold actors.lock
            wait_for_actors(Path(path), wait_s=0.0)
        except DatabaseLocked:
            held_after_kill += 1
        # the reopen waits for the dead driver's actors to end (`storage.actor_lock`)
        info, start = reopen_and_reconcile(chain, path, CFG, side, start)
        report.append(info)
    # the kills landed after acknowledged work, with work in flight
    assert sum(1 for rec in _lines(tmp_path / "side-0.jsonl") if "ack" in rec) > 0
    # Ray ends a dead driver's actors only after a while: the window the lock closes
    # was open at some kill (a new open made then would have restored beside them)
    assert held_after_kill >= 1
    print(f"facade kills under Ray: {report}; actors still running at {held_after_kill} kills")


@needs_ray
def test_a_lock_file_the_actors_cannot_open_is_refused_at_the_open(
    ray_session: Any, tmp_path: Path
) -> None:
    path = tmp_path / "store"
    with TidalDb.open(str(path)) as db:  # pykka: takes no actors.lock
        db.assign_cohort(1, "c")
    (path / ACTORS_LOCK).mkdir()
    cfg = Config(host="ray", ray_address=_address(ray_session), store_layout="single")
    with pytest.raises(StorageError, match=r"cannot open .*actors\.lock"):
        TidalDb.open(str(path), config=cfg)
    (path / ACTORS_LOCK).rmdir()
    with TidalDb.open(str(path), config=cfg) as db:  # nothing was left half done
        assert db.cohorts_of(1) == {"c"}
