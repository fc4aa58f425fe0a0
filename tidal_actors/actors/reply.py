"""A one-shot reply slot that wakes a blocked thread or runs callbacks.

Owns reply delivery from actors to callers. Used instead of awaiting pykka futures
directly (pykka's ``Future.__await__`` yields a bare ``None``, which trio rejects): a
callback lets the trio facade wake its task with ``TrioToken.run_sync_soon``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Reply"]


class Reply:
    """Set once with a value or an exception; ``get()`` blocks until then.

    A waiter blocks on ``_gate``, a lock held from creation until the reply is
    settled (then released for good: each waiter takes it and gives it back, so any
    number may wait); two plain locks cost less to make and to wake than a
    ``threading.Event`` (a condition variable with a lock per waiter).
    """

    __slots__ = (
        "__weakref__",
        "_callbacks",
        "_done",
        "_exc",
        "_gate",
        "_lock",
        "_value",
        "label",
    )

    def __init__(self, label: str = "") -> None:
        self._gate = threading.Lock()
        self._gate.acquire()
        self._done = False
        self._value: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[Reply], None]] = []
        self._lock = threading.Lock()
        self.label = label

    @property
    def done(self) -> bool:
        return self._done

    @property
    def error(self) -> BaseException | None:
        """The error it was settled with (None: a value, or not settled yet)."""
        return self._exc

    def _settle(self, value: Any, exc: BaseException | None) -> bool:
        with self._lock:
            if self._done:
                return False
            self._value, self._exc = value, exc
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
        self._gate.release()
        for cb in callbacks:
            # a waiter that went away must not hurt the actor settling the reply
            with contextlib.suppress(Exception):
                cb(self)
        return True

    def set_result(self, value: Any = None) -> bool:
        """Deliver ``value``; returns False if the reply was already settled."""
        return self._settle(value, None)

    def set_exception(self, exc: BaseException) -> bool:
        """Deliver an error; returns False if the reply was already settled."""
        return self._settle(None, exc)

    def add_done_callback(self, fn: Callable[[Reply], None]) -> None:
        """Run ``fn(self)`` once settled (at once if it already is), in the settling thread."""
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until settled or ``timeout`` seconds (None: no limit); True if settled."""
        if self._done:
            return True
        gate = self._gate
        if gate.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            gate.release()
        return self._done

    def result(self) -> Any:
        """The value, or raise the error; raises RuntimeError if not settled yet."""
        if not self._done:
            raise RuntimeError(f"reply {self.label!r} has not arrived yet")
        if self._exc is not None:
            raise self._exc
        return self._value

    def get(self, timeout: float | None = None) -> Any:
        """Block until settled (or ``timeout`` seconds), then return or raise."""
        if not self.wait(timeout):
            raise TimeoutError(f"no reply to {self.label!r} within {timeout} s")
        return self.result()
