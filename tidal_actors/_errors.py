"""The exception hierarchy: every error the library raises is a `TidalError`.

Owns the error classes only; raising policy lives with the callers. Each subclass is
named for what went wrong, so callers catch the narrowest one they can handle.
"""

from __future__ import annotations

__all__ = [
    "ActorFailure",
    "DatabaseClosed",
    "DatabaseLocked",
    "InvalidArgument",
    "StorageError",
    "StorageFull",
    "TidalError",
    "UnknownCohort",
    "UnknownPurge",
    "WrongThread",
]


class TidalError(Exception):
    """Root of every error raised by tidal_actors."""


class InvalidArgument(TidalError, ValueError):
    """An argument failed validation; nothing was changed.

    Attributes:
        field: the argument's name (``"user_id"``, ``"weight"``, ...).
        value: the offending value as given.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {field}={_shown(value)}: {reason}")


_SHOWN_MAX = 1000


def _shown(value: object) -> str:
    """``repr(value)`` for a message, whatever the value: a hostile one (nested too
    deep for ``repr``, a ``__repr__`` that raises, megabytes long) must not turn the
    error into another error."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - RecursionError, or a __repr__ that raises
        return f"<{type(value).__name__} object>"
    if len(text) > _SHOWN_MAX:
        text = text[: _SHOWN_MAX - 3] + "..."
    return text


class UnknownCohort(TidalError, KeyError):
    """A cohort that must exist (for example to re-materialize it) has no state."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown cohort"


class UnknownPurge(TidalError, KeyError):
    """No purge with the given id was ever committed in this store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown purge"


class StorageError(TidalError):
    """The LMDB store failed; the operation that raised was not applied."""


class StorageFull(StorageError):
    """The LMDB map reached ``Config.max_map_size_bytes``; nothing was written."""


class DatabaseClosed(TidalError):
    """The database was closed (or is closing) before or during the call."""


class DatabaseLocked(TidalError):
    """The data directory is already open, in this process or in another one."""


class ActorFailure(TidalError):
    """A handler raised unexpectedly; the cause is attached as ``__cause__``.

    The message the handler failed on is the one lost. In a durable database a
    membership or ledger shard that failed is then restarted from the store (its
    state is what was committed, so a control operation whose write had committed
    is applied even though its caller got this error); in an ephemeral database, and
    for the purge coordinator and persistence (which change state only after a
    commit), the actor resumes as it was. Each failure is logged on the
    ``tidal_actors`` logger at ERROR with a ``FaultReport``
    (``runtime.supervision``; docs/guarantees.md, "A handler failure").

    Also raised by every call, and by ``close()``, once the flusher thread (which
    sends buffered signals on a tick) has failed: its exception is the cause
    (docs/guarantees.md, "The flusher failing").
    """


class WrongThread(TidalError):
    """An :class:`AsyncTidalDb` was used outside the trio run, and thread, that opened it.

    Await its methods from tasks of that run; from another thread, go through
    ``trio.from_thread.run(db.method, ...)``, or use the blocking :class:`TidalDb`.
    Nothing was sent.
    """


# Shown as ``tidal_actors.InvalidArgument`` in tracebacks and reprs, where users import
# them from (pickle finds them there too: the package re-exports every one).
for _cls in (
    TidalError,
    InvalidArgument,
    UnknownCohort,
    UnknownPurge,
    StorageError,
    StorageFull,
    DatabaseClosed,
    DatabaseLocked,
    ActorFailure,
    WrongThread,
):
    _cls.__module__ = "tidal_actors"
del _cls
