"""The pytest plugin's Config and clock start are overridable the pytest way: a
``tidal_config`` / ``tidal_clock_start`` fixture in the user's conftest, and the
``tidal_config`` / ``tidal_clock_start`` markers. Each test runs a small
user suite with pytester, in a subprocess so the plugin loads from its entry point as
it does for a user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = str(Path(__file__).resolve().parent.parent)


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))

    def go(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", *args)

    return go


def test_conftest_fixture_overrides_and_marker_applies_on_top(pytester, run):
    pytester.makeconftest(
        """
        import pytest
        from tidal_actors import Config

        @pytest.fixture
        def tidal_config():
            return Config(ledger_shards=3, half_life_ns="1d")

        @pytest.fixture
        def tidal_clock_start():
            return 5 * 10**18
        """
    )
    pytester.makepyfile(
        test_user="""
        import pytest
        from tidal_actors import COMMUNITY

        DAY = 86_400 * 10**9

        def test_override(tidal_db, tidal_clock, tidal_config):
            assert tidal_config.ledger_shards == 3
            assert tidal_db.config.ledger_shards == 3
            assert tidal_db.config.half_life_ns == DAY
            assert tidal_clock.now_ns() == 5 * 10**18
            tidal_db.signal_with_context(1, 7, 1, 1.0)
            tidal_clock.advance(DAY)
            assert tidal_db.read_decay_score(COMMUNITY, 7, 1) == 0.5

        @pytest.mark.tidal_config(ledger_shards=2, window_buckets=6)
        def test_marker_over_override(tidal_db):
            assert tidal_db.config.ledger_shards == 2
            assert tidal_db.config.window_buckets == 6
            assert tidal_db.config.half_life_ns == DAY      # the fixture's, kept

        @pytest.mark.tidal_clock_start(123)
        def test_clock_marker(tidal_clock):
            assert tidal_clock.now_ns() == 123
        """
    )
    result = run("--strict-markers")
    result.assert_outcomes(passed=3)


def test_markers_without_override(pytester, run):
    pytester.makepyfile(
        test_user="""
        import pytest
        from tidal_actors import Config

        pytestmark = pytest.mark.tidal_config(membership_shards=2, ledger_shards=5)

        def test_defaults(tidal_db, tidal_clock, tidal_config):
            assert tidal_config == Config(membership_shards=2, ledger_shards=5)
            assert tidal_db.config == tidal_config
            assert tidal_clock.now_ns() == 10**18

        @pytest.mark.tidal_config(ledger_shards=4, half_life_ns="12h")
        def test_nearest_marker_wins(tidal_db, tidal_config):
            assert tidal_db.config.ledger_shards == 4
            assert tidal_db.config.membership_shards == 2
            assert tidal_db.config.half_life_ns == 12 * 3600 * 10**9
            assert tidal_config == tidal_db.config

        @pytest.mark.tidal_config(Config(window_buckets=3), ledger_shards=1)
        def test_marker_with_a_config(tidal_db):
            assert tidal_db.config.window_buckets == 3
            assert tidal_db.config.ledger_shards == 1

        @pytest.mark.trio
        @pytest.mark.tidal_config(ledger_shards=3)
        @pytest.mark.tidal_clock_start(7 * 10**18)
        async def test_async_fixture(async_tidal_db, tidal_clock):
            assert async_tidal_db.config.ledger_shards == 3
            assert async_tidal_db.config.membership_shards == 2
            assert async_tidal_db.clock is tidal_clock and tidal_clock.now_ns() == 7 * 10**18

        @pytest.mark.tidal_config(ledger_shardz=2)
        def test_unknown_setting(tidal_db):
            pass

        @pytest.mark.tidal_config(ledger_shards=0)
        def test_bad_value(tidal_db):
            pass
        """
    )
    result = run("--strict-markers", "-rE")
    result.assert_outcomes(passed=4, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*InvalidArgument*invalid tidal_config marker='ledger_shardz': unknown setting*",
            "*InvalidArgument*invalid ledger_shards=0: must be a positive int*",
        ]
    )


def test_markers_are_registered(pytester, run):
    result = run("--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.tidal_config(config=None, **settings):*",
            "@pytest.mark.tidal_clock_start(ns):*",
        ]
    )
