"""`Call`: an operation in flight, and how its replies become its typed result.

Owns the handle every engine operation returns (``Call[T]``: ``result()`` is a
``T``) and the flush's variant, whose loss report is said once, to some caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, cast

from tidal_actors._errors import StorageError, TidalError
from tidal_actors.actors.reply import Reply

__all__ = ["Call", "ErrorCarrier", "FlushCall", "combined", "error_of"]

T = TypeVar("T")


class Call(Generic[T]):
    """An operation in flight: its replies and how to turn their values into the result.

    ``done`` says whether every reply has arrived, or one has failed (the later ones
    of a multi-step operation, such as a barrier and then the action, may never be
    sent then); ``result()`` returns the result (a ``T``; or raises the operation's
    error: the first failed reply's, or RuntimeError if not done yet). Without
    ``finish`` the result is the first reply's value (None without replies).
    """

    __slots__ = ("finish", "name", "replies")

    def __init__(
        self,
        name: str,
        replies: list[Reply],
        finish: Callable[[list[Any]], T] | None = None,
    ) -> None:
        self.name = name
        self.replies = replies
        self.finish = finish

    @property
    def done(self) -> bool:
        return all(r.done for r in self.replies) or self.error is not None

    @property
    def error(self) -> BaseException | None:
        """The error of the first reply (in order) that failed, if any has."""
        for r in self.replies:
            if r.done and r.error is not None:
                return r.error
        return None

    def result(self) -> T:
        err = self.error
        if err is not None:
            raise err
        values = [r.result() for r in self.replies]
        if self.finish is not None:
            return self.finish(values)
        # the reply's value is the operation's result, as the engine method declares
        return cast(T, values[0] if values else None)

    def abandon(self) -> None:
        """The caller will not read the result (a cancelled await): nothing to do for
        most operations (see `FlushCall`)."""

    def __repr__(self) -> str:
        return f"Call({self.name}, done={self.done})"


class ErrorCarrier(Protocol):
    """Where the errors of flushes nobody read wait for the next flush or close."""

    def take_carried(self) -> list[StorageError]: ...

    def carry_error_of(self, reply: Reply) -> None: ...


class FlushCall(Call[None]):
    """A flush: its error (history writes that failed, signal batches lost) is said
    once, to a caller. One whose caller went away (`abandon`) hands it to the next
    flush or to ``close()``, so no loss goes unreported."""

    __slots__ = ("carrier", "then")

    def __init__(self, carrier: ErrorCarrier, reply: Reply) -> None:
        super().__init__("flush", [reply])
        self.carrier = carrier
        # run once the flush has returned (in the caller's thread or task)
        self.then: Callable[[], None] | None = None

    def result(self) -> None:
        own: list[StorageError] = []
        try:
            super().result()  # anything but a StorageError leaves the carried ones be
        except StorageError as exc:
            own.append(exc)
        errors = self.carrier.take_carried() + own
        if self.then is not None:
            self.then()  # every ledger applied what came before, lost or not
        if errors:
            raise combined(errors)

    def abandon(self) -> None:
        self.replies[0].add_done_callback(self.carrier.carry_error_of)


def combined(errors: list[StorageError]) -> StorageError:
    """One StorageError saying every one of ``errors`` (the first as the cause)."""
    if len(errors) == 1:
        return errors[0]
    err = StorageError("; ".join(map(str, errors)))
    err.__cause__ = errors[0]
    return err


def error_of(reply: Reply) -> StorageError | None:
    """The StorageError ``reply`` settled with (a flush's report of lost signals or
    failed history writes), if any."""
    try:
        reply.result()
    except StorageError as exc:
        return exc
    except (TidalError, RuntimeError):  # closing, or not settled in time
        pass
    return None
