from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tidal_actors import ManualClock, TidalDb
from tidal_actors.core import states as _states

T0 = 10**18  # a round time in ns (2001-09-09)
SEC = 10**9
MIN = 60 * SEC
HOUR = 3600 * SEC
DAY = 24 * HOUR


def until(cond: Callable[[], bool], limit_s: float = 10.0) -> bool:
    """Poll ``cond`` every millisecond until it holds or ``limit_s`` seconds passed;
    whether it holds (for what another thread makes true)."""
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def queued_only(db: Any) -> Any:
    """Make every message of ``db`` (a pykka-hosted `TidalDb`) queue for its actor's
    thread: no sender handles one itself (`runtime.inline`). For tests of the queued
    path: a shard's thread held in a handler while the test sends more, merged
    messages. Returns ``db``."""
    db._core.host.senders_run_inline = False
    return db


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def db(clock):
    with TidalDb.open(clock=clock) as d:
        yield d


@pytest.fixture
def pdb_path(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def settle_at_once(monkeypatch):
    """Settle every row as soon as it may be (the default waits for 16,384)."""
    monkeypatch.setattr(_states, "SETTLE_MIN", 1)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local multi-node Ray cluster for the session (`tests._ray.RaySession`: a
    head and two worker nodes of one CPU each in this machine, one of them
    advertising the store resource); the tests that take it are skipped where Ray is
    not installed (``tests/_ray.py``)."""
    from ._ray import RaySession

    session = RaySession.start()
    yield session
    session.stop()
