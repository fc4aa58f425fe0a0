"""What the blocking facade's operations share: waiting for a `Call` in the calling
thread.

Owns `BlockingBase._run`: every reply of the call is tracked by the engine (so that
``close()`` fails it with DatabaseClosed rather than leave the caller waiting), waited
for, and the call's typed result returned or its error raised. The operations
themselves are generated from the operation table (``_generated_blocking``).
"""

from __future__ import annotations

import threading
from typing import TypeVar

from tidal_actors.actors.reply import Reply
from tidal_actors.runtime.call import Call
from tidal_actors.runtime.engine import Core

__all__ = ["BlockingBase"]

T = TypeVar("T")


class BlockingBase:
    """A blocking facade over one open `Core`."""

    def __init__(self, core: Core) -> None:
        self._core = core

    def _run(self, call: Call[T]) -> T:
        core = self._core
        for r in call.replies:
            core.track(r)
        try:
            if len(call.replies) == 1:
                call.replies[0].wait()
            elif call.replies:
                # until every reply has come, or one failed (`Call.done`)
                done = threading.Event()

                def check(_: Reply) -> None:
                    if call.done:
                        done.set()

                for r in call.replies:
                    r.add_done_callback(check)
                done.wait()
            return call.result()
        finally:
            for r in call.replies:
                core.untrack(r)
