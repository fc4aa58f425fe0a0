"""Points in time on the command line (``--at``): one syntax for every command.

Owns the forms a read time takes: integer nanoseconds since the epoch; a UTC date
or date-time as the command line prints them (``2018-08-30``,
``2018-08-30T14:55:23Z``, ``2018-08-30 14:55:23.830 UTC``; an explicit offset such
as ``+02:00`` is honoured, no offset means UTC); or an offset from the command's
default read time in `_durations` syntax, its unit required (``-1d``, ``+90m``; a
bare ``-1`` is refused, not read as one nanosecond back). And how the command line
prints a time point for people (:func:`iso`, :func:`stamp`). Must not read clocks.
"""

from __future__ import annotations

import datetime as _dt
import re

from tidal_actors._durations import parse_duration
from tidal_actors._errors import InvalidArgument

__all__ = ["FORMS", "iso", "parse_time", "stamp"]

FORMS = (
    "integer ns since the epoch, a UTC date or date-time (2018-08-30, "
    "2018-08-30T14:55:23Z, '2018-08-30 14:55:23.830 UTC'), or an offset from the "
    "default read time (-1d, +90m)"
)
_MAX_NS = 2**63 - 1
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def iso(ns: int | None) -> str:
    """``ns`` (int ns since the epoch) as a UTC time to the millisecond, for people
    (``"2018-08-30 14:55:23.830 UTC"``; ``"-"`` for None)."""
    if ns is None:
        return "-"
    moment = _dt.datetime.fromtimestamp(ns // 1_000_000_000, tz=_dt.UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S}.{ns // 1_000_000 % 1000:03d} UTC"


def stamp(ns: int | None) -> str:
    """``ns`` as itself and as :func:`iso` (``"1535640923830000000 (2018-08-30
    14:55:23.830 UTC)"``; ``"-"`` for None)."""
    return "-" if ns is None else f"{ns} ({iso(ns)})"


def parse_time(text: str, field: str = "--at", default_ns: int | None = None) -> int:
    """``text`` as int ns since the epoch (see the module doc for the forms).

    Args:
        text: the value given.
        field: the option's name, for errors.
        default_ns: what an offset (``-1d``) is relative to; None: offsets refused.

    Raises:
        InvalidArgument: naming ``field`` and ``text``: not one of the forms, a
            date before 1970 or past 2262, or an offset without a default.
    """
    raw = text.strip()
    if re.fullmatch(r"[0-9]+", raw):
        ns = int(raw)
    elif re.fullmatch(r"[+-][0-9]+[a-z]+", raw):
        if default_ns is None:
            raise InvalidArgument(field, text, "an offset needs a default read time; give a time")
        try:
            delta = parse_duration(raw[1:], field)
        except InvalidArgument:
            raise InvalidArgument(field, text, f"must be {FORMS}") from None
        ns = default_ns + delta if raw[0] == "+" else default_ns - delta
    else:
        ns = _from_date(raw, field, text)
    if not 0 <= ns <= _MAX_NS:
        raise InvalidArgument(
            field, text, "must fall between 1970 and 2262 (int64 ns since the epoch)"
        )
    return ns


def _from_date(raw: str, field: str, text: str) -> int:
    if raw.endswith(" UTC"):
        raw = raw[:-4]
    # fromisoformat reads at most microseconds: keep finer digits apart, exactly
    m = re.fullmatch(r"(.*[T ]\d\d:\d\d:\d\d)\.(\d{1,9})(.*)", raw)
    frac_ns = 0
    if m:
        raw = m.group(1) + m.group(3)
        frac_ns = int(m.group(2).ljust(9, "0"))
    try:
        moment = _dt.datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidArgument(field, text, f"must be {FORMS}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.UTC)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1000 + frac_ns
