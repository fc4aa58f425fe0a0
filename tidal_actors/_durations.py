"""Human-readable durations for the command line and scenario files.

Owns the one duration syntax the edges accept (command-line flags, scenario files and
``Config``/``config/default.toml``): an integer followed by ``d``, ``h``, ``m``, ``s``,
``ms``, ``us`` or ``ns``, or a plain integer in the caller's unit (nanoseconds unless
said otherwise). The library itself only ever sees integer nanoseconds; this module
must not read clocks.
"""

from __future__ import annotations

import re

from tidal_actors._errors import InvalidArgument

__all__ = ["UNIT_NS", "format_duration", "parse_duration"]

UNIT_NS: dict[str, int] = {
    "d": 86_400_000_000_000,
    "h": 3_600_000_000_000,
    "m": 60_000_000_000,
    "s": 1_000_000_000,
    "ms": 1_000_000,
    "us": 1_000,
    "ns": 1,
}
"""Nanoseconds per unit suffix."""

_DURATION = re.compile(r"([0-9]+)(d|h|ms|m|s|us|ns)?")


def parse_duration(text: str | int, field: str = "duration", bare_unit: str = "ns") -> int:
    """Parse a duration into integer nanoseconds.

    Args:
        text: ``"90d"``, ``"12h"``, ``"30m"``, ``"15s"``, ``"250ms"``, ``"10us"``,
            ``"5ns"``, or a plain integer (``"123"`` or ``123``) in ``bare_unit``.
            Surrounding whitespace is ignored; no sign, fraction or separator.
        field: the argument's name, used in the error.
        bare_unit: the unit of a plain integer, one of :data:`UNIT_NS`'s keys
            (``"ns"`` by default; ``"ms"`` for a setting named ``..._ms``).

    Returns:
        The duration in nanoseconds, an int ``>= 0``.

    Raises:
        InvalidArgument: ``text`` is not in one of those forms (naming ``field``).
    """
    if isinstance(text, bool):
        raise InvalidArgument(field, text, "must be a duration such as 90d, 12h, 250ms or 123")
    if bare_unit not in UNIT_NS:
        raise InvalidArgument("bare_unit", bare_unit, f"must be one of {', '.join(UNIT_NS)}")
    if isinstance(text, int):
        if text < 0:
            raise InvalidArgument(field, text, "must not be negative")
        return text * UNIT_NS[bare_unit]
    if not isinstance(text, str):
        raise InvalidArgument(field, text, "must be a duration such as 90d, 12h, 250ms or 123")
    match = _DURATION.fullmatch(text.strip())
    if match is None or not text.isascii():
        raise InvalidArgument(
            field,
            text,
            "must be an integer with unit d, h, m, s, ms, us or ns (e.g. 90d, 250ms), "
            f"or a plain integer in {bare_unit}",
        )
    number, unit = match.groups()
    return int(number) * UNIT_NS[unit or bare_unit]


def format_duration(ns: int) -> str:
    """The shortest exact rendering of ``ns`` (int ns) in :func:`parse_duration`'s syntax."""
    if ns == 0:
        return "0s"
    for unit in ("d", "h", "m", "s", "ms", "us"):
        if ns % UNIT_NS[unit] == 0:
            return f"{ns // UNIT_NS[unit]}{unit}"
    return f"{ns}ns"
