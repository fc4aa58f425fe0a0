"""Who wrote what: the per-caller record that *read your writes* consistency needs.

Owns `Callers`: for each caller (a thread, or an event loop's task: a
`contextvars.ContextVar` follows both) the writes it has submitted and, per ledger
shard, how many of them a completed barrier (a read that waited, a flush) has shown
applied there. A read at ``read_your_writes`` is answered from the ledger shard's
published view when the caller has no write that the shard may not have applied
yet; otherwise it waits, behind a barrier through only the membership shards the
caller wrote to since (see docs/semantics.md, "Read consistency").

A task inherits its parent's record if the parent had one when the task started:
then either sees the other's writes too (never fewer than its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextvars import ContextVar
from functools import partial
from itertools import count
from typing import TypeVar

from tidal_actors.runtime.call import Call

__all__ = ["Answered", "Caller", "Callers"]

_ids = count()
T = TypeVar("T")


class Caller:
    """One caller's writes (see the module doc)."""

    __slots__ = ("n", "seen", "wrote")

    def __init__(self, ledgers: int) -> None:
        self.n = 0  # writes submitted
        self.wrote: dict[int, int] = {}  # membership shard -> ``n`` after the last write there
        self.seen = [0] * ledgers  # ledger shard -> writes shown applied there

    def lagging(self, ledger: int) -> list[int]:
        """The membership shards whose writes ``ledger`` may not have applied yet."""
        seen = self.seen[ledger]
        if self.n <= seen:  # every write shown applied there
            return []
        return [m for m, n in self.wrote.items() if n > seen]

    def covered(self, ledgers: Iterable[int], upto: int) -> None:
        """The writes up to ``upto`` are applied at ``ledgers`` (a barrier came back)."""
        seen = self.seen
        for li in ledgers:
            if upto > seen[li]:
                seen[li] = upto


class Callers:
    """The `Caller` records of one database's callers.

    Args:
        ledgers: the number of ledger shards.
    """

    __slots__ = ("_ledgers", "_var", "get")

    def __init__(self, ledgers: int) -> None:
        self._ledgers = ledgers
        self._var: ContextVar[Caller | None] = ContextVar(f"tidal_caller_{next(_ids)}")
        # ``get()``: the calling context's record, None if it has written nothing (a
        # partial of the context variable's own ``get``: no Python frame on a read)
        self.get: Callable[[], Caller | None] = partial(self._var.get, None)

    def wrote(self, m: int) -> None:
        """The caller submitted a write through membership shard ``m``."""
        rec = self._var.get(None)
        if rec is None:
            rec = Caller(self._ledgers)
            self._var.set(rec)
        rec.n += 1
        rec.wrote[m] = rec.n

    def wrote_many(self, shards: Iterable[int]) -> None:
        """The caller submitted writes through each of ``shards``."""
        rec = self._var.get(None)
        if rec is None:
            rec = Caller(self._ledgers)
            self._var.set(rec)
        rec.n += 1
        for m in shards:
            rec.wrote[m] = rec.n


class Answered(Call[T]):
    """A read answered at once, from a published view: no reply to wait for."""

    __slots__ = ("value",)

    def __init__(self, name: str, value: T) -> None:
        # `Call`'s fields set here (no reply, no finish): built on every view read
        self.name = name
        self.replies = []
        self.finish = None
        self.value = value

    def result(self) -> T:
        return self.value
