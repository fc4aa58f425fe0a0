"""The seeded schedule of the deterministic host: delivery order, trace, faults.

A :class:`Schedule` is shared by every host a harness starts (a reopen starts a new
host), so the trace and the random sequence continue across it. The trace's notation
for messages (`Schedule.describe`) names replies by label and leaves out object ids
and wall-clock measurements, so the same seed and the same calls give the same trace,
byte for byte.
"""

from __future__ import annotations

import dataclasses
import random
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Literal

from tidal_actors._errors import InvalidArgument, StorageError
from tidal_actors.actors import messages as M
from tidal_actors.actors.reply import Reply
from tidal_actors.core.contrib_log import Prepared
from tidal_actors.storage.format import Tag, decode_key
from tidal_actors.testing.link_faults import LinkChaos

__all__ = ["FACADE", "HarnessStuck", "Ordering", "Schedule", "addr"]

FACADE: M.Address = ("facade", 0)
"""The sender address of messages the caller's operations send."""

Ordering = Literal["mailbox", "pair"]


class HarnessStuck(RuntimeError):
    """A handle cannot complete: nothing is left to deliver and its reply never came.

    Under a correct runtime this does not happen; the message says what is still
    waiting, to be read beside :meth:`Harness.trace`.
    """


# fields left out of the trace: wall-clock measurements
_VOLATILE_FIELDS = frozenset({"seconds"})


def addr(a: M.Address) -> str:
    """``kind[index]``: an address as the trace writes it."""
    return f"{a[0]}[{a[1]}]"


class Schedule:
    """Seeded delivery order, trace, injected write failures and link faults of one harness.

    Shared by every host a harness starts (a reopen starts a new host), so the trace
    and the random sequence continue across it.

    Args:
        seed: seeds ``random.Random`` (any value it accepts).
        ordering: ``"mailbox"`` (one FIFO mailbox per receiver, as pykka) or
            ``"pair"`` (one FIFO queue per sender/receiver pair).
    """

    def __init__(self, seed: Any = 0, ordering: Ordering = "mailbox") -> None:
        if ordering not in ("mailbox", "pair"):
            raise InvalidArgument("ordering", ordering, 'must be "mailbox" or "pair"')
        self.seed = seed
        self.ordering = ordering
        self.rng = random.Random(seed)
        self.lines: list[str] = []
        self.steps = 0
        self._labels: weakref.WeakKeyDictionary[Reply, str] = weakref.WeakKeyDictionary()
        self._n = 0
        self._fail_budget: list[str | None] = []
        # op tuples of writes chosen to fail, kept alive so their ids stay unique
        self._poisoned: dict[int, tuple[str, bytes, bytes | None]] = {}
        self.prior_fault: Callable[[list[Any]], None] | None = None
        self.links = LinkChaos(seed)  # link faults, with their own seeded draws

    # -- trace -------------------------------------------------------------------

    def event(self, text: str) -> None:
        """Add a non-delivery line (fault, clock move, close) to the trace."""
        self.lines.append(f"{'':>6} ** {text}")

    def label(self, reply: Reply, name: str | None = None) -> str:
        """The reply's stable name in the trace: ``name`` if given at its first sight
        (the harness names each operation's replies ``<operation>#<n>``), else
        ``<label>@<n>`` numbered in order of first sight."""
        s = self._labels.get(reply)
        if s is None:
            if name is None:
                self._n += 1
                name = f"{reply.label or 'reply'}@{self._n}"
            s = self._labels[reply] = name
        return s

    def value(self, x: Any) -> str:
        """Deterministic text for a message field: no object ids, replies by label."""
        if isinstance(x, Reply):
            return self.label(x)
        if x is None or isinstance(x, (bool, int, float, str)):
            return repr(x)
        if isinstance(x, bytes):
            return f"<{len(x)}B>"
        if isinstance(x, BaseException):
            return f"{type(x).__name__}({str(x)!r})"
        if isinstance(x, M.Barrier):
            return f"{x!r} reply={self.label(x.reply)}"
        if isinstance(x, Prepared):
            return f"Prepared(n={len(x.records)}, evicted={x.evicted})"
        if isinstance(x, (tuple, list)):
            return "(" + ", ".join(self.value(v) for v in x) + ")"
        if isinstance(x, Mapping):
            return "{" + ", ".join(f"{self.value(k)}: {self.value(v)}" for k, v in x.items()) + "}"
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return self.describe(x)
        return f"<{type(x).__name__}>"

    def describe(self, msg: object) -> str:
        """One message in the trace's notation: its type and key fields."""
        name = type(msg).__name__
        if isinstance(msg, M.SignalBatch):
            return f"{name} " + " ".join(
                f"(u={u} e={e} t={t} w={w!r} ts={ts}{' +context' if cx is not None else ''})"
                for u, e, t, w, ts, cx in msg.signals
            )
        if isinstance(msg, M.Attribute):
            return f"{name} " + " ".join(
                f"({m}:{r} u={u} {c!r} e={e} t={t} w={w!r} ts={ts})"
                for m, r, u, c, e, t, w, ts in msg.records
            )
        if isinstance(msg, M.Write):
            ops = []
            for ks, key, value in msg.ops:
                try:
                    ident, tag, _ = decode_key(key)
                    tname = Tag(tag).name if tag in Tag._value2member_map_ else f"0x{tag:02x}"
                    ops.append(f"{ks}:{tname}({ident}){'' if value is not None else ' delete'}")
                except ValueError:
                    ops.append(f"{ks}:<{len(key)}B>")
            r = msg.reply
            reply = (
                "none"
                if r is None
                else self.label(r)
                if isinstance(r, Reply)
                else f"{addr(r[0])}/token={self.value(r[1])}"
            )
            return f"{name} [{', '.join(ops)}] ack={reply}"
        if isinstance(msg, M.BarrierPart):
            return f"{name} {self.value(msg.barrier)}"
        if isinstance(msg, M.Barrier):
            return self.value(msg)
        if dataclasses.is_dataclass(msg):
            parts = [
                f"{f.name}={self.value(getattr(msg, f.name))}"
                for f in dataclasses.fields(msg)
                if f.name not in _VOLATILE_FIELDS
            ]
            return f"{name} " + " ".join(parts)
        return name

    # -- injected write failures --------------------------------------------------

    def fail_next_write(self, n: int, only: str | None) -> None:
        self._fail_budget.extend([only] * n)

    def take(self, w: M.Write) -> bool:
        """At a write's delivery to persistence: is it one of the next to fail?"""
        kind = "history" if w.reply is None else "control"
        for i, only in enumerate(self._fail_budget):
            if only is None or only == kind:
                del self._fail_budget[i]
                for op in w.ops:
                    self._poisoned[id(op)] = op
                return True
        return False

    def store_fault(self, ops: list[tuple[str, bytes, bytes | None]]) -> None:
        """The store's fault hook: a commit that holds a chosen write fails whole."""
        if self._poisoned and any(id(op) in self._poisoned for op in ops):
            raise StorageError("injected write failure (Harness.fail_next_write)")
        if self.prior_fault is not None:
            self.prior_fault(ops)
