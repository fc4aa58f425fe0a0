"""pytest plugin (entry point ``pytest11``): fixtures for testing code that embeds
tidal_actors.

* ``tidal_config``: the :class:`~tidal_actors.Config` the database fixtures open with
  (``Config()``); override it in a ``conftest.py`` or a test module, or adjust it per
  test with ``@pytest.mark.tidal_config(ledger_shards=4, half_life_ns="1d")``.
* ``tidal_clock_start``: the manual clock's start, int ns (10**18); override it, or
  use ``@pytest.mark.tidal_clock_start(ns)`` (which wins over the fixture).
* ``tidal_clock``: a :class:`~tidal_actors.ManualClock` at ``tidal_clock_start``.
* ``tidal_db``: a blocking :class:`~tidal_actors.TidalDb` on a temporary directory,
  using ``tidal_config`` and ``tidal_clock``; closed after the test.
* ``async_tidal_db``: an :class:`~tidal_actors.AsyncTidalDb` (trio) on a temporary
  directory, likewise; for tests marked ``@pytest.mark.trio`` (needs pytest-trio);
  closed -- flushed, actors stopped, store closed -- after the test.
* ``asyncio_tidal_db``: the same under asyncio, for tests marked
  ``@pytest.mark.asyncio`` (needs pytest-asyncio; defined only when it is installed).

A ``tidal_config`` marker applies on top of the ``tidal_config`` fixture, whether
the plugin's or the user's; markers nearer the test (function over class over
module) win.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._config_names import unknown_hint
from tidal_actors._errors import InvalidArgument

if TYPE_CHECKING:  # the runtime is imported by the fixtures that open it, not at start-up
    from tidal_actors.facades.aio import AsyncTidalDb
    from tidal_actors.facades.blocking import TidalDb

START_NS = 10**18


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "tidal_config(config=None, **settings): the Config of the tidal_db / async_tidal_db "
        "fixtures: a Config to start from (default: the tidal_config fixture) and Config "
        "fields to change, e.g. tidal_config(ledger_shards=4, half_life_ns='1d')",
    )
    config.addinivalue_line(
        "markers",
        "tidal_clock_start(ns): the tidal_clock fixture's start, int nanoseconds since the epoch",
    )


def _marked_config(request: pytest.FixtureRequest, base: Config) -> Config:
    """``base`` with every ``tidal_config`` marker on the test applied, farthest first.

    Raises:
        InvalidArgument: a marker's argument is not a Config, it names an unknown
            setting, or a value is out of range (naming the setting and the value).
    """
    config = base
    known = {f.name for f in dataclasses.fields(Config)}
    for mark in reversed(list(request.node.iter_markers("tidal_config"))):
        if len(mark.args) > 1:
            raise InvalidArgument("tidal_config marker", mark.args, "takes at most one Config")
        if mark.args:
            if not isinstance(mark.args[0], Config):
                raise InvalidArgument("tidal_config marker", mark.args[0], "must be a Config")
            config = mark.args[0]
        for key in mark.kwargs:
            if key not in known:
                raise InvalidArgument(
                    "tidal_config marker", key, f"unknown setting{unknown_hint(key, known)}"
                )
        if mark.kwargs:
            config = config.replace(**mark.kwargs)
    return config


@pytest.fixture
def tidal_config(request: pytest.FixtureRequest) -> Config:
    """The :class:`~tidal_actors.Config` of ``tidal_db`` / ``async_tidal_db``:
    ``Config()`` with the test's ``tidal_config`` markers applied. Override this
    fixture to change the base for many tests."""
    return _marked_config(request, Config())


def _marked_start(request: pytest.FixtureRequest, base: int) -> int:
    """The argument of the test's nearest ``tidal_clock_start`` marker, else ``base``.

    Raises:
        InvalidArgument: the marker does not have exactly one argument.
    """
    mark = request.node.get_closest_marker("tidal_clock_start")
    if mark is None:
        return base
    if len(mark.args) != 1 or mark.kwargs:
        raise InvalidArgument("tidal_clock_start marker", mark.args, "takes one int ns")
    start: int = mark.args[0]  # ManualClock checks it
    return start


@pytest.fixture
def tidal_clock_start(request: pytest.FixtureRequest) -> int:
    """The start of ``tidal_clock``, int nanoseconds since the epoch: 10**18
    (2001-09-09), or the argument of the test's ``tidal_clock_start`` marker.
    Override this fixture to change it for many tests."""
    return _marked_start(request, START_NS)


@pytest.fixture
def tidal_clock(request: pytest.FixtureRequest, tidal_clock_start: int) -> ManualClock:
    """A manual clock at ``tidal_clock_start`` (10**18 ns unless overridden; a
    ``tidal_clock_start`` marker wins over both); move it with ``.advance(ns)`` or
    ``.set(ns)``.

    Raises:
        InvalidArgument: the start is not an int in ``[0, 2**63)``.
    """
    return ManualClock(_marked_start(request, tidal_clock_start))


@pytest.fixture
def tidal_db(
    request: pytest.FixtureRequest, tmp_path: object, tidal_config: Config, tidal_clock: ManualClock
) -> Iterator[TidalDb]:
    """A persistent TidalDb in a temporary directory with ``tidal_config`` (and the
    test's ``tidal_config`` markers), closed after the test."""
    from tidal_actors.facades.blocking import TidalDb

    config = _marked_config(request, tidal_config)
    db = TidalDb.open(str(tmp_path) + "/tidal", config=config, clock=tidal_clock)
    try:
        yield db
    finally:
        db.close()


@pytest.fixture
async def async_tidal_db(
    request: pytest.FixtureRequest, tmp_path: object, tidal_config: Config, tidal_clock: ManualClock
) -> AsyncIterator[AsyncTidalDb]:
    """A persistent AsyncTidalDb in a temporary directory (trio tests only) with
    ``tidal_config`` (and the test's ``tidal_config`` markers), closed after the test;
    its clock is ``tidal_clock``."""
    from tidal_actors.facades.aio import open_tidal

    config = _marked_config(request, tidal_config)
    async with open_tidal(str(tmp_path) + "/tidal-async", config=config, clock=tidal_clock) as db:
        yield db


_asyncio_fixture: Callable[..., Any] | None = None
with contextlib.suppress(ImportError):
    import pytest_asyncio

    _asyncio_fixture = pytest_asyncio.fixture

if _asyncio_fixture is not None:

    @_asyncio_fixture
    async def asyncio_tidal_db(
        request: pytest.FixtureRequest,
        tmp_path: object,
        tidal_config: Config,
        tidal_clock: ManualClock,
    ) -> AsyncIterator[AsyncTidalDb]:
        """A persistent AsyncTidalDb in a temporary directory (asyncio tests, with
        pytest-asyncio) with ``tidal_config`` (and the test's ``tidal_config``
        markers), closed after the test; its clock is ``tidal_clock``."""
        from tidal_actors.facades.aio import open_tidal

        config = _marked_config(request, tidal_config)
        async with open_tidal(
            str(tmp_path) + "/tidal-asyncio", config=config, clock=tidal_clock
        ) as db:
            yield db
