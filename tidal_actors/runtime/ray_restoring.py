"""A restarted shard actor's restore, run after its constructor returns (`ShardActor`).

Ray runs no method of an actor until its constructor returns, and a restore makes
blocking calls into other actors (`ray_restart.restore`,
`ray_membership_restart.restore`, `ray_coordinator_restart.restore`). Run inside the
constructor, two actors restarting at once (the coordinator and a ledger of a lost
node) would each wait for the other. So the constructor of a restarted incarnation
only sets up its links, fences, host and store and starts `run` on a thread of its
own; meanwhile the actor answers what other restores ask of it:

* ``fence``, ``epochs``, ``known_epochs``, ``coordinator_part`` and ``ready`` as
  always (none needs the behaviour);
* ``deliver`` takes each call into its link receiver (so it is acknowledged as
  taken, never as durable: a ledger reports a message durable only once its
  behaviour handled it) and holds its messages, in order; ``ask`` holds its message
  too (its reply is polled, so the asker waits without blocking anyone). Once the
  behaviour is up the held messages go to its mailbox in the order they came, before
  any later one (`Held`);
* two questions are answered at once, since their answer does not depend on the
  restore (`early_answer`): a restarting coordinator's `CoordinatorLost` to a ledger
  restoring (its new incarnation has prepared nothing and runs no rebuild; what it
  must know of the purges in flight it learns from its own `RecoverLedger`, which the
  new coordinator answers), and its `MarkerCount` to a membership shard restoring
  (its new incarnation marks its purges above `MembershipShard.first_token` of its
  epoch, and every marker below is its failed incarnations').

Which restore waits for which then (an arrow: waits for that actor's behaviour):
a ledger -> the coordinator (`RecoverLedger`); a membership shard -> the coordinator
(`RecoverMembership`) and every ledger (`SeenRecords`); the coordinator -> nobody
restoring (its two questions are answered at once). No cycle, so any set of actors
restarting at once completes, the coordinator first.

A restore that fails (an exception) leaves no half-alive actor: `run` reports it to
the facade (a `FaultReport` ``"down"``) and ends the process, and Ray restarts it
again (`LEDGER_RESTARTS` times at most), as when a constructor fails.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import ray

from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.actors.recovery import CoordinatorLost, FaultReport, MarkerCount
from tidal_actors.runtime.ray_coordinator_restart import restore as restore_coordinator
from tidal_actors.runtime.ray_links import NOTICES, Links
from tidal_actors.runtime.ray_membership_restart import restore as restore_membership
from tidal_actors.runtime.ray_replies import send_fault
from tidal_actors.runtime.ray_restart import (
    CoordinatorRestart,
    LedgerRestart,
    MembershipRestart,
)
from tidal_actors.runtime.ray_restart import restore as restore_ledger

__all__ = ["Held", "early_answer", "fail", "run", "take_notices"]

log = logging.getLogger("tidal_actors")

REPORT_WAIT_S = 5.0  # how long a failed restore waits for its report to leave (seconds)


class Held:
    """What an actor takes before its behaviour is up, in order (thread-safe).

    ``take(step)`` runs ``step`` (a message's way into the mailbox) at once if the
    behaviour is up, else keeps it; ``release()`` runs the kept steps in order and
    lets every later one through. Both hold one lock, so no step overtakes one kept
    before it. ``holding`` is whether the behaviour is not up yet.
    """

    def __init__(self, holding: bool) -> None:
        self.lock = threading.Lock()
        self._kept: list[Callable[[], None]] | None = [] if holding else None
        self.up = threading.Event()
        if not holding:
            self.up.set()

    @property
    def holding(self) -> bool:
        return self._kept is not None

    def take(self, step: Callable[[], None]) -> None:
        with self.lock:
            if self._kept is None:
                step()
            else:
                self._kept.append(step)

    def ask(self, step: Callable[[], None], early: Callable[[], bool]) -> None:
        """As `take`, but while holding, ``early()`` may answer instead (`early_answer`:
        checked under the lock, so never once the behaviour is up)."""
        with self.lock:
            if self._kept is None:
                step()
            elif not early():
                self._kept.append(step)

    def release(self) -> int:
        """Run the kept steps in order; returns how many there were."""
        with self.lock:
            kept, self._kept = self._kept or [], None
            for step in kept:
                step()
        self.up.set()
        return len(kept)


def early_answer(address: M.Address, epoch: int, message: object) -> bool:
    """Answer ``message``, asked of the actor ``address`` while its incarnation of
    ``epoch`` restores, if its answer does not wait for the restore (see the module);
    whether it did."""
    t = type(message)
    if t is CoordinatorLost and address[0] == M.LEDGER:
        message.reply.set_result([])  # type: ignore[attr-defined]
        return True
    if t is MarkerCount and address[0] == M.MEMBERSHIP:
        message.reply.set_result(MembershipShard.first_token(epoch))  # type: ignore[attr-defined]
        return True
    return False


def take_notices(links: Links, messages: list[object]) -> None:
    """(An actor's ``deliver``.) A call discarded, numbered for another incarnation
    of the actor (or from a fenced one), still tells of the restarts in it: its
    sender numbered for an earlier incarnation because it restarted meanwhile too,
    and this actor's calls to it would be discarded there the same way, each
    waiting for the other's notice (`Links.restarted` ignores one it has taken)."""
    for msg in messages:
        if type(msg) in NOTICES:
            links.restarted(msg)  # type: ignore[arg-type]


def run(actor: Any) -> None:
    """(The restore thread of ``actor``, a restarted `ShardActor`.) Restore its
    behaviour as its kind does and start it (`ShardActor.begin`); on an exception,
    `fail`."""
    behaviour: Behaviour
    notice: LedgerRestart | MembershipRestart | CoordinatorRestart
    try:
        if actor.address[0] == M.MEMBERSHIP:
            behaviour, notice = restore_membership(actor)
        elif actor.address == M.COORD_ADDR:
            behaviour, notice = restore_coordinator(actor)
        else:
            behaviour, notice = restore_ledger(actor)
        actor.begin(behaviour, notice)
    except BaseException as exc:  # noqa: BLE001 - no half-alive actor: Ray restarts it
        fail(actor.address, actor.sink, exc)


def fail(address: M.Address, sink: str, exc: BaseException) -> None:
    """A restart of ``address`` failed with ``exc``: tell the facade behind ``sink``
    (a `FaultReport` ``"down"``) and end the process (Ray restarts it again)."""
    cause = f"its restore failed: {exc!r}; its process exits and Ray restarts it"
    log.error("%s[%s] %s", address[0], address[1], cause)
    try:
        ray.get(send_fault(sink, FaultReport(address, "down", cause)), timeout=REPORT_WAIT_S)
    finally:
        os._exit(1)
