"""Human-readable durations for the command line and scenario files.

Owns the one duration syntax the edges accept: an integer followed by ``d``, ``h``,
``m``, ``s``, ``ms``, ``us`` or ``ns``, or a plain integer meaning nanoseconds. The
library itself only ever sees integer nanoseconds; this module must not read clocks.
"""

from __future__ import annotations

import re

from ._errors import InvalidArgument

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


def parse_duration(text: str | int, field: str = "duration") -> int:
    """Parse a duration into integer nanoseconds.

    Args:
        text: ``"90d"``, ``"12h"``, ``"30m"``, ``"15s"``, ``"250ms"``, ``"10us"``,
            ``"5ns"``, or a plain integer (``"123"`` or ``123``) meaning nanoseconds.
            Surrounding whitespace is ignored; no sign, fraction or separator.
        field: the argument's name, used in the error.

    Returns:
        The duration in nanoseconds, an int ``>= 0``.

    Raises:
        InvalidArgument: ``text`` is not in one of those forms (naming ``field``).
    """
    if isinstance(text, bool):
        raise InvalidArgument(field, text, "must be a duration such as 90d, 12h, 250ms or 123")
    if isinstance(text, int):
        if text < 0:
            raise InvalidArgument(field, text, "must not be negative")
        return text
    if not isinstance(text, str):
        raise InvalidArgument(field, text, "must be a duration such as 90d, 12h, 250ms or 123")
    match = _DURATION.fullmatch(text.strip())
    if match is None or not text.isascii():
        raise InvalidArgument(
            field, text, "must be an integer with unit d, h, m, s, ms, us or ns (e.g. 90d, 250ms), "
            "or plain integer nanoseconds"
        )
    number, unit = match.groups()
    return int(number) * UNIT_NS[unit or "ns"]


def format_duration(ns: int) -> str:
    """The shortest exact rendering of ``ns`` (int ns) in :func:`parse_duration`'s syntax."""
    if ns == 0:
        return "0s"
    for unit in ("d", "h", "m", "s", "ms", "us"):
        if ns % UNIT_NS[unit] == 0:
            return f"{ns // UNIT_NS[unit]}{unit}"
    return f"{ns}ns"
