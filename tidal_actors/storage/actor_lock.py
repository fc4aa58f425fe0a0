"""The Ray host's actor processes that write a store, seen from a new opener.

Under the Ray host the facade's process holds the store's directory lock
(``tidal.lock``, `lmdb_lock.DirectoryLock`) and its actors write the environments
from processes of their own, which take no lock of ours. If the facade's process
dies, Ray ends those actors shortly after (it ends the actors of a driver that
exits), but until then they may still commit: a new open in that window would
restore from the store while a stale actor goes on writing history batches under
the same keys.

So each actor process of a durable database holds a *shared* ``flock`` on
``actors.lock`` in the store's directory (`ActorHold`) from its start until its
stop (the kernel lets it go with the process, however the process ends), and
an exclusive opener, once it holds ``tidal.lock``, waits until it can take that
file *exclusively* for a moment (`wait_for_actors`): then no actor of an earlier
open is left. Actors restarted by Ray while their facade lives take the shared lock
beside their siblings. POSIX ``flock``: every process must see the directory on the
same machine's file system, which the Ray host requires anyway (docs/cluster.md,
"Where the store lives").
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
import weakref
from pathlib import Path

from tidal_actors._errors import DatabaseLocked, StorageError

__all__ = [
    "ACTORS_LOCK",
    "ACTORS_WAIT_S",
    "ActorHold",
    "holders",
    "ready_for_actors",
    "wait_for_actors",
]

log = logging.getLogger("tidal_actors")

ACTORS_LOCK = "actors.lock"
"""The file in a store's directory the actor processes writing it hold shared."""

ACTORS_WAIT_S = 30.0
"""How long an exclusive open waits for the actor processes of an earlier open to
end (seconds) before it raises `DatabaseLocked`: Ray ends a dead facade's actors
within a few seconds."""


class ActorHold:
    """An actor process's shared ``flock`` on ``<store>/actors.lock``, taken at
    construction (waiting while a new opener probes it) and held until `release`
    or the process ends. A process forked from it does not hold it: the child's copy
    of the descriptor is closed at the fork (the parent's keeps the lock), so a child
    that outlives the actor does not keep new opens waiting.

    Args:
        store: the store's directory (the root of either layout).

    Raises:
        OSError: ``actors.lock`` cannot be opened or locked.
    """

    def __init__(self, store: str | os.PathLike[str]) -> None:
        fd = os.open(Path(store) / ACTORS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        _HOLDS.add(self)

    def release(self) -> None:
        """Let the lock go (a second call does nothing)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the last descriptor of the open file: the flock goes with it


_HOLDS: weakref.WeakSet[ActorHold] = weakref.WeakSet()


def _forget_in_child() -> None:
    """In a forked child: close its copy of each hold's descriptor (the parent's
    keeps the lock: a flock goes only with the last descriptor of its open file)."""
    for hold in list(_HOLDS):
        hold.release()


os.register_at_fork(after_in_child=_forget_in_child)


def holders(path: Path) -> list[int]:
    """The ids of the processes holding an ``flock`` on the file at ``path``, from
    ``/proc/locks`` (Linux; ``[]`` elsewhere or when it cannot be read)."""
    try:
        inode = os.stat(path).st_ino
        with open("/proc/locks", encoding="ascii") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    pids = set()
    for line in lines:
        parts = line.split()  # "1: FLOCK ADVISORY READ <pid> <maj:min:inode> 0 EOF"
        if len(parts) > 5 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
            pids.add(int(parts[4]))
    return sorted(pids)


def ready_for_actors(store: Path) -> None:
    """Make sure ``store``'s ``actors.lock`` exists and opens (the facade's process,
    before it starts actors that hold it), so that a file the actors could not
    lock is refused at the open, not inside an actor's process.

    Raises:
        StorageError: the file cannot be created or opened (naming it).
    """
    path = store / ACTORS_LOCK
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644))
    except OSError as exc:
        raise StorageError(
            f"cannot open {path}, which the Ray host's actors lock while they write the "
            f"store: {exc}. The writer needs write access to the directory {store} and "
            "to its files"
        ) from exc


def wait_for_actors(store: Path, wait_s: float | None = None) -> None:
    """Return once no actor process holds ``store``'s ``actors.lock`` (at once when
    none does, or when the file does not exist). A wait is logged (a warning on the
    ``tidal_actors`` logger) when it begins.

    Args:
        store: the store's directory.
        wait_s: how long to wait (seconds; None: `ACTORS_WAIT_S`).

    Raises:
        DatabaseLocked: actor processes still held it after ``wait_s``.
        OSError: the file exists but cannot be opened.
    """
    path = store / ACTORS_LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    start = time.monotonic()
    deadline = start + (ACTORS_WAIT_S if wait_s is None else wait_s)
    waited = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waited:
                    waited = True
                    log.warning(
                        "%s: waiting for the actor processes of an earlier open to end "
                        "(a Ray host's actors, whose facade's process is gone)",
                        store,
                    )
                if time.monotonic() >= deadline:
                    pids = holders(path)
                    who = f" (processes {', '.join(map(str, pids))})" if pids else ""
                    raise DatabaseLocked(
                        f"{store} may still be written by processes of an earlier open: "
                        f"{path} is held{who} after a wait of {time.monotonic() - start:.1f} s "
                        "(ACTORS_WAIT_S). They are a Ray host's actors, which Ray ends "
                        "once it sees their facade's process gone, or processes started "
                        "from them; open it again once they have ended"
                    ) from None
                time.sleep(0.05)
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            return
    finally:
        os.close(fd)
