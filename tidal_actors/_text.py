"""Wording shared by printed output: the command line's and the load simulation's plots."""

from __future__ import annotations

__all__ = ["plural"]


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` (an int, printed with thousands separators) and ``word``, in the plural
    unless ``n`` is 1: ``plural(1, "row")`` is ``"1 row"``, ``plural(2, "entry",
    "entries")`` is ``"2 entries"``. ``many`` defaults to ``word + "s"``."""
    return f"{n:,} {word if n == 1 else many if many is not None else word + 's'}"
