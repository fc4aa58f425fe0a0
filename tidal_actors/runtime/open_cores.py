"""The databases open in this process, and what a process exit or a fork means for
them: at interpreter exit each is flushed and closed (`close_at_exit`); in a child
made by ``os.fork()`` each is disowned, never touched (`forget_in_child`).

`runtime.engine.Core` registers itself here when it opens (`add`); the set holds
weak references, so a database nobody holds any more is not kept alive by it.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Protocol

from tidal_actors._errors import TidalError

__all__ = ["OpenCore", "add", "close_at_exit", "forget_in_child"]


class OpenCore(Protocol):
    """What this module needs of an open database (`runtime.engine.Core`)."""

    pid: int  # the process that opened it

    def close(self) -> None: ...

    def disown(self) -> None: ...


_OPEN: weakref.WeakSet[OpenCore] = weakref.WeakSet()


@atexit.register
def close_at_exit() -> None:
    """A program that ends without closing its database still loses nothing it was
    acknowledged: the open databases are flushed and closed at interpreter exit
    (actor threads are daemons, alive until then). A crash skips this: call
    ``flush()`` for signals that must survive one. Only the process that opened a
    database closes it (see `forget_in_child`)."""
    pid = os.getpid()
    for core in list(_OPEN):
        if core.pid == pid:
            try:
                core.close()
            except TidalError as exc:  # nobody to raise it to: say it
                print(f"tidal_actors: closing at exit: {exc}", file=sys.stderr)
            except Exception:  # noqa: BLE001, S110 - the interpreter is exiting
                pass


def forget_in_child() -> None:
    """After ``os.fork()``, in the child: every database the parent had open is
    disowned, never flushed, snapshotted, unlocked or closed here. The child has none
    of the parent's actor threads, and its copy of the LMDB environment and of the
    directory lock belong to the parent (an ``flock`` is shared with the parent's
    open file, so releasing it would release the parent's). Using such a database in
    the child raises `DatabaseClosed`. The child cannot open that store again (py-lmdb
    keeps one environment per file in a process): a process started with
    multiprocessing's "spawn" or "forkserver" method can, once the parent has closed
    it, and so can a child forked before its parent opened the store."""
    for core in list(_OPEN):
        core.disown()
    _OPEN.clear()


os.register_at_fork(after_in_child=forget_in_child)


def add(core: OpenCore) -> None:
    """Register ``core`` (opened by this process) for `close_at_exit`."""
    _OPEN.add(core)
