"""Running a message in the sender's thread (the pykka host's hand-off rule).

Under the pykka host every actor has a thread; a message is normally put in its
mailbox and its thread wakes to handle it. A hand-off costs a thread switch on each
side (tens of microseconds of CPU, `bench/bench_main_job.py --breakdown`: the
mailboxes' ``get``), which a call of a few signals pays at each hop. So a sender may
handle the message itself, in its own thread, when the receiver is idle: its mailbox
empty, no message being handled, room to spare and the actor running
(`Mailbox.claim`). The receiver's handler, its load timing, its supervision and its
idle work (`on_idle`) run exactly as its thread would run them (`_Actor.on_receive`
in `pykka_host`), while the claim keeps its thread from taking anything else. The
pattern is a *calling-thread dispatch* taken only when the mailbox is empty (Akka's
``CallingThreadDispatcher`` always runs in the caller; here the receiver's own
thread stays the fallback).

**Why order is kept.** A message run by its sender is handled when the receiver has
nothing queued and nothing in hand, which is where its own thread would have taken
it next: each receiver still handles one message at a time, in the order its
messages were sent, and a message sent (causally) earlier to a receiver is handled
earlier. The ordering argument of DESIGN.md ("one mailbox per receiver") needs no
more.

**Who may run what** (`may_run`): each thread has a *level*, and runs only actors
of a higher one: caller threads are `CALLER` (0), a membership shard's `MEMBERSHIP`
(1), a ledger shard's `LEDGER` (2); while a thread runs a message of a membership
shard it is at that shard's level, so it can run ledger shards' messages but no
other membership shard's. Messages only go down the pipeline this way (facade ->
membership -> ledger, the path load takes), so no thread ever waits on a claim, and
a thread never runs an actor whose claim it holds. Persistence and the coordinator
are never run by a sender: persistence's commits must not hold up the callers whose
writes they group, and the coordinator's steps are few.

Threads that must not block never run a handler: an async facade's loop thread
(``callers_run_inline`` False on its host, `Core.set_nonblocking`), the flusher, and
every thread of an actor that is neither membership nor ledger (`NEVER`).

**Signals.** CPython runs signal handlers in the main thread, between any two
bytecodes; with Python's default SIGINT handler a Ctrl-C raises KeyboardInterrupt
there, which would stop a handler halfway (a key half made, a claim never given
back). So the main thread runs no handler while SIGINT's handler is the default one
(`signal.default_int_handler`): a script's calls queue as they always did. A program
that handles SIGINT itself (the command line does, `loadsim.interrupt.StopOnSigint`)
and threads other than the main one run them. If a handler of the program's raises
in the middle of one anyway, the actor treats it as a handler failure (its
supervisor restarts it from the store, or resumes it in an ephemeral database; the
message's replies fail) and the exception goes on up (`_Actor.run_inline`).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from tidal_actors.actors import messages as M

try:  # the C function under `signal.getsignal`, without its enum conversion (3 us)
    from _signal import getsignal as _getsignal
except ImportError:  # pragma: no cover - another interpreter
    _getsignal = signal.getsignal

__all__ = [
    "CALLER",
    "LEDGER",
    "MEMBERSHIP",
    "NEVER",
    "add_nested",
    "current_level",
    "level_of",
    "may_run",
    "nested_s",
    "run_claimed",
    "set_level",
]

CALLER = 0
MEMBERSHIP = 1
LEDGER = 2
NEVER = 3

RUN_BY_SENDER = {M.MEMBERSHIP: MEMBERSHIP, M.LEDGER: LEDGER}
"""The actor kinds a sender may run a message of, with their level."""

_local = threading.local()
_SIGINT = int(signal.SIGINT)


def level_of(kind: str) -> int:
    """The level of an actor thread of ``kind`` (`NEVER` but for membership and ledger)."""
    return RUN_BY_SENDER.get(kind, NEVER)


def current_level() -> int:
    """This thread's level (`CALLER` unless it is an actor's thread or runs one)."""
    level: int = getattr(_local, "level", CALLER)
    return level


def set_level(level: int) -> int:
    """Set this thread's level; returns the one it had."""
    was = current_level()
    _local.level = level
    return was


def nested_s() -> float:
    """Seconds this thread has spent running other actors' messages (`add_nested`): an
    actor's load timing leaves out what its handler ran for the actors below it, so
    that each actor's seconds per unit (`Mailbox.unit_s`, which sizes batches and
    bounds mailboxes) stays its own."""
    total: float = getattr(_local, "nested", 0.0)
    return total


def add_nested(seconds: float) -> None:
    """Count ``seconds`` spent running a message of another actor in this thread."""
    _local.nested = nested_s() + seconds


def may_run(kind: str, callers: bool) -> int | None:
    """The level at which this thread may run a message for an actor of ``kind``, or
    None if it may not (see the module). ``callers``: whether the database's caller
    threads may run messages (False for an async facade's)."""
    target = RUN_BY_SENDER.get(kind)
    if target is None:
        return None
    level = current_level()
    if level >= target:
        return None
    if level == CALLER and (
        not callers
        or (
            threading.current_thread() is threading.main_thread()
            and _getsignal(_SIGINT) is signal.default_int_handler
        )
    ):
        return None
    return target


class _Claimable(Protocol):
    def claim(self) -> bool: ...

    def unclaim(self) -> None: ...


def run_claimed(
    mailbox: _Claimable, level: int, run: Callable[[Any], None], build: Callable[[], object]
) -> bool:
    """Run ``run(build())`` in this thread at ``level`` if ``mailbox`` can be claimed
    (`Mailbox.claim`: the actor is idle); whether it was. The claim is taken inside
    the ``try``, so whatever interrupts (a KeyboardInterrupt between two bytecodes),
    the ``finally`` gives back the claim this thread took, restores its level and
    counts the time as nested (`add_nested`)."""
    was = current_level()
    started = time.perf_counter()
    try:
        if not mailbox.claim():
            return False
        set_level(level)
        run(build())
        return True
    finally:
        set_level(was)
        mailbox.unclaim()  # this thread's claim, if it took one
        add_nested(time.perf_counter() - started)
