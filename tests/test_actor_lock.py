"""A new open waits for the actor processes of an earlier open (`storage.actor_lock`).

Under the Ray host the actors write the store from processes of their own, which
take no directory lock; each holds ``actors.lock`` shared. A process standing in for
such an actor (it takes `ActorHold` and sleeps) is enough to check the rule without
Ray: an open waits while it lives, raises `DatabaseLocked` after the wait, and goes
on once it is killed. The Ray run of the same (a facade killed, its store reopened)
is ``tests/test_ray_facade_killed.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tidal_actors import Config, DatabaseLocked, StorageError, TidalDb
from tidal_actors.storage import actor_lock
from tidal_actors.storage.actor_lock import (
    ACTORS_LOCK,
    ActorHold,
    holders,
    ready_for_actors,
    wait_for_actors,
)

HOLDER = """
import sys, time
from tidal_actors.storage.actor_lock import ActorHold
hold = ActorHold(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def _stand_in_actor(store: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


@pytest.mark.parametrize("layout", ["single", "shards"])
def test_an_open_waits_for_a_live_actor_process_then_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    path = tmp_path / "store"
    cfg = Config(store_layout=layout)
    with TidalDb.open(str(path), config=cfg) as db:
        db.assign_cohort(1, "c")
    actor = _stand_in_actor(path)
    try:
        monkeypatch.setattr(actor_lock, "ACTORS_WAIT_S", 0.3)
        t = time.monotonic()
        with pytest.raises(DatabaseLocked, match="processes of an earlier open"):
            TidalDb.open(str(path), config=cfg)
        assert time.monotonic() - t >= 0.3
    finally:
        actor.kill()
        actor.wait()
    # the refused open left the directory lock free, and the store as it was
    with TidalDb.open(str(path), config=cfg) as db:
        assert db.cohorts_of(1) == {"c"}


def test_an_open_goes_on_once_the_actor_process_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "store"
    with TidalDb.open(str(path)) as db:
        db.assign_cohort(1, "c")
    actor = _stand_in_actor(path)
    killer = threading.Timer(0.5, actor.kill)
    killer.start()
    t = time.monotonic()
    try:
        with TidalDb.open(str(path)) as db:  # waits: the default wait is 30 s
            waited = time.monotonic() - t
            assert db.cohorts_of(1) == {"c"}
    finally:
        killer.cancel()
        actor.kill()
        actor.wait()
    assert 0.4 <= waited < actor_lock.ACTORS_WAIT_S
    # the wait said so when it began, once
    said = [r for r in caplog.records if "waiting for the actor processes" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING" and str(path) in said[0].getMessage()


def test_a_released_hold_and_a_missing_file_let_an_open_go_at_once(tmp_path: Path) -> None:
    wait_for_actors(tmp_path, wait_s=0.0)  # no actors.lock: nothing to wait for
    hold = ActorHold(tmp_path)
    assert (tmp_path / ACTORS_LOCK).exists()
    with pytest.raises(DatabaseLocked):
        wait_for_actors(tmp_path, wait_s=0.0)
    hold.release()
    hold.release()  # a second release does nothing
    wait_for_actors(tmp_path, wait_s=0.0)
    # shared: several actor processes hold it at once
    a, b = ActorHold(tmp_path), ActorHold(tmp_path)
    a.release()
    with pytest.raises(DatabaseLocked):
        wait_for_actors(tmp_path, wait_s=0.0)
    b.release()
    wait_for_actors(tmp_path, wait_s=0.0)


FORKER = """
import os, sys, time
from tidal_actors.storage.actor_lock import ActorHold
hold = ActorHold(sys.argv[1])
child = os.fork()
if child == 0:  # a process started from the actor's, outliving it
    os.close(1)
    os.close(2)
    time.sleep(120)
    os._exit(0)
print(child, flush=True)
os._exit(0)  # the actor's process ends; its child lives on
"""


def test_a_process_forked_from_an_actor_does_not_hold_its_lock(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with TidalDb.open(str(path)) as db:
        db.assign_cohort(1, "c")
    out = subprocess.run(
        [sys.executable, "-c", FORKER, str(path)], capture_output=True, text=True, timeout=60
    )
    child = int(out.stdout.strip())
    try:
        wait_for_actors(path, wait_s=0.0)  # the actor is gone; its child holds nothing
        with TidalDb.open(str(path)) as db:
            assert db.cohorts_of(1) == {"c"}
    finally:
        os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/locks is Linux's")
def test_a_refusal_names_the_processes_holding_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    actor = _stand_in_actor(tmp_path)
    try:
        assert holders(tmp_path / ACTORS_LOCK) == [actor.pid]
        with pytest.raises(DatabaseLocked, match=rf"processes {actor.pid}\).*0\.[0-9] s"):
            wait_for_actors(tmp_path, wait_s=0.2)
    finally:
        actor.kill()
        actor.wait()
    assert holders(tmp_path / ACTORS_LOCK) == []


def test_a_lock_file_the_actors_could_not_open_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / ACTORS_LOCK).mkdir()
    with pytest.raises(StorageError, match=r"cannot open .*actors\.lock.*Is a directory"):
        ready_for_actors(tmp_path)
    (tmp_path / ACTORS_LOCK).rmdir()
    ready_for_actors(tmp_path)
    assert (tmp_path / ACTORS_LOCK).is_file()
