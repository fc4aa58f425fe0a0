"""Config takes the command line's duration syntax ("7d", "250ms") in TOML and in
Config(...); a bare number is in the unit the setting's name ends with."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal_actors import Config, InvalidArgument
from tidal_actors._durations import parse_duration

DAY_NS = 86_400 * 10**9
REPO = Path(__file__).resolve().parent.parent


def test_toml_accepts_duration_strings(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[decay]\nhalf_life_ns = "7d"\n'
        '[decay.half_life_ns_by_type]\n"3" = "12h"\n"4" = 5000\n'
        '[window]\nwindow_width_ns = "30m"\n'
        '[contribution_log]\nhistory_retention_ns = "90d"\n'
        '[ingest]\nsignal_flush_interval_ms = "500us"\n'
        '[purge]\nrematerialize_after_ms = "2s"\n'
    )
    c = Config.from_toml(path)
    assert c.half_life_ns == 7 * DAY_NS == 604_800_000_000_000
    assert c.half_life_ns_by_type == {3: 12 * 3600 * 10**9, 4: 5000}
    assert c.window_width_ns == 30 * 60 * 10**9
    assert c.history_retention_ns == 90 * DAY_NS
    assert c.signal_flush_interval_ms == 0.5
    assert c.rematerialize_after_ms == 2000.0


def test_bare_numbers_keep_the_names_unit(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        "half_life_ns = 604800000000000\nsignal_flush_interval_ms = 3\n"
        'rematerialize_after_ms = "250"\nwindow_width_ns = "1000"\n'
    )
    c = Config.from_toml(path)
    assert c.half_life_ns == 7 * DAY_NS
    assert c.signal_flush_interval_ms == 3  # ms
    assert c.rematerialize_after_ms == 250.0  # a string without a unit: ms too
    assert c.window_width_ns == 1000  # ... and ns for an _ns name


def test_constructor_and_replace_accept_duration_strings():
    c = Config(half_life_ns="7d", window_width_ns="1h", signal_flush_interval_ms="2ms")
    assert c == Config()
    assert c.replace(half_life_ns="1d").half_life_ns == DAY_NS
    assert Config(rematerialize_after_ms="0s").rematerialize_after_ms == 0.0


def test_default_toml_is_the_defaults_and_uses_the_readable_form():
    text = (REPO / "config" / "default.toml").read_text()
    assert 'half_life_ns = "7d"' in text
    assert Config.from_toml(REPO / "config" / "default.toml") == Config()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("half_life_ns", "7 days"),
        ("half_life_ns", "-1d"),
        ("window_width_ns", "1.5h"),
        ("signal_flush_interval_ms", "2 ms"),
        ("history_retention_ns", "forever"),
    ],
)
def test_malformed_duration_names_field_and_value(field, value):
    with pytest.raises(InvalidArgument) as info:
        Config(**{field: value})
    assert field in str(info.value) and repr(value) in str(info.value)


def test_malformed_per_type_half_life_names_the_type(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[decay.half_life_ns_by_type]\n"3" = "soon"\n')
    with pytest.raises(InvalidArgument, match=r"half_life_ns_by_type\[3\].*'soon'"):
        Config.from_toml(path)


def test_string_durations_still_range_checked():
    with pytest.raises(InvalidArgument, match=r"half_life_ns.*must be a positive int"):
        Config(half_life_ns="0s")
    with pytest.raises(InvalidArgument, match=r"signal_flush_interval_ms.*\(0, 10000\]"):
        Config(signal_flush_interval_ms="11s")


def test_parse_duration_bare_unit():
    assert parse_duration("250", "x", bare_unit="ms") == 250_000_000
    assert parse_duration(7, "x", bare_unit="d") == 7 * DAY_NS
    assert parse_duration("3s", "x", bare_unit="ms") == 3 * 10**9
    assert parse_duration("123") == 123
    with pytest.raises(InvalidArgument, match="bare_unit"):
        parse_duration("1", "x", bare_unit="weeks")
