"""A new open waits for the actor processes of an earlier open (`storage.actor_lock`).

Under the Ray host the actors write the store from processes of their own, which
take no directory lock; each holds ``actors.lock`` shared. A process standing in for
such an actor (it takes `ActorHold` and sleeps) is enough to check the rule without
Ray: an open waits while it lives, raises `DatabaseLocked` after the wait, and goes
on once it is killed. The Ray run of the same (a facade killed, its store reopened)
is ``tests/test_ray_facade_killed.py``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tidal_actors import Config, DatabaseLocked, TidalDb
from tidal_actors.storage import actor_lock
from tidal_actors.storage.actor_lock import ACTORS_LOCK, ActorHold, wait_for_actors

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
        with pytest.raises(DatabaseLocked, match="actor processes of an earlier open"):
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
