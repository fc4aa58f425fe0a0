"""What the harness's operations share: labelling each `Call` for the trace.

Owns `HarnessCalls`: an operation's replies are named ``<operation>#<n>`` (``.k`` for
each of several) in the schedule's trace and tracked by the engine; a signal's handle
is a `Call` with no reply, done at once. The operations themselves are generated from
the operation table (``_generated_harness``).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from tidal_actors.actors.reply import Reply
from tidal_actors.runtime.call import Call
from tidal_actors.runtime.engine import Core

__all__ = ["HarnessCalls", "Labeller"]

T = TypeVar("T")


class Labeller(Protocol):
    """Names replies in a trace (the harness's `Schedule`)."""

    def label(self, reply: Reply, name: str | None = None) -> str: ...


class HarnessCalls:
    """The plumbing of the harness's operations over its `Core`."""

    core: Core
    schedule: Labeller
    _calls: int

    def _call(self, call: Call[T]) -> Call[T]:
        self._calls += 1
        many = len(call.replies) > 1
        for k, r in enumerate(call.replies):
            self.schedule.label(r, f"{call.name}#{self._calls}" + (f".{k}" if many else ""))
            self.core.track(r)
            r.add_done_callback(self.core.untrack)  # tracked while it is not settled
        return call

    @staticmethod
    def _done(name: str) -> Call[None]:
        return Call(name, [])
