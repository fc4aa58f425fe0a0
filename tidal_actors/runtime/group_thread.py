"""A thread that handles what was handed to it in groups: the group commit of a
Ray actor's own writes (`runtime.ray_history`, `runtime.ray_control`).

Whatever was handed over while the thread worked on the last group is its next
group, so a commit (its fsync) carries every write that came while the one before
ran, as the persistence actor's group commit does (`actors.persistence`).
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

__all__ = ["GroupThread"]

T = TypeVar("T")


class GroupThread(Generic[T]):
    """Hands the items `offer`ed since its last turn, as one list, to `handle` on a
    thread of its own; `wait_idle` waits until every item offered has been handled;
    `stop` ends the thread (items offered after it are refused). A subclass sets
    its own attributes before calling this constructor (the thread starts in it)
    and defines `handle`, which must not raise.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()  # reentrant: a subclass may hold it around calls
        self._queue: list[T] = []
        self._busy = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def offer(self, item: T) -> bool:
        """Queue ``item`` for the next group; False (not queued) once `stop` began."""
        with self._cond:
            if self._stopping:
                return False
            self._queue.append(item)
            self._cond.notify_all()
            return True

    def handle(self, items: list[T]) -> None:
        """Handle one group, in the order offered (on the thread)."""
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                items, self._queue = self._queue, []
                self._busy = True
            try:
                self.handle(items)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def wait_idle(self) -> None:
        """Wait until every item offered before has been handled."""
        with self._cond:
            while self._queue or self._busy:
                self._cond.wait()

    def stop(self) -> None:
        """End the thread once the items queued are handled (at most 30 s)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)
