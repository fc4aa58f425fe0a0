"""pytest plugin (entry point ``pytest11``): fixtures for testing code that embeds
tidal_actors.

* ``tidal_clock``: a :class:`~tidal_actors.ManualClock` starting at 1e18 ns.
* ``tidal_db``: a blocking :class:`~tidal_actors.TidalDb` on a temporary directory,
  using ``tidal_clock``; closed after the test.
* ``async_tidal_db``: an :class:`~tidal_actors.AsyncTidalDb` (trio) on a temporary
  directory, using ``tidal_clock``; for tests marked ``@pytest.mark.trio`` (needs
  pytest-trio); closed -- flushed, actors stopped, store closed -- after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from .._aio import AsyncTidalDb, open_tidal
from .._clock import ManualClock
from .._db import TidalDb

START_NS = 10**18


@pytest.fixture
def tidal_clock() -> ManualClock:
    """A manual clock at 1e18 ns (2001-09-09); move it with ``.advance(ns)``."""
    return ManualClock(START_NS)


@pytest.fixture
def tidal_db(tmp_path: object, tidal_clock: ManualClock) -> Iterator[TidalDb]:
    """A persistent TidalDb in a temporary directory, closed after the test."""
    db = TidalDb.open(str(tmp_path) + "/tidal", clock=tidal_clock)
    try:
        yield db
    finally:
        db.close()


@pytest.fixture
async def async_tidal_db(tmp_path: object, tidal_clock: ManualClock) -> AsyncIterator[AsyncTidalDb]:
    """A persistent AsyncTidalDb in a temporary directory (trio tests only), closed
    after the test; its clock is ``tidal_clock``."""
    async with open_tidal(str(tmp_path) + "/tidal-async", clock=tidal_clock) as db:
        yield db
