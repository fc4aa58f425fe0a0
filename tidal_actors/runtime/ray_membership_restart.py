"""A membership shard restarted in place under the Ray host, and the epoch of a restart.

A membership shard's Ray actor of a durable database has ``max_restarts`` (as a
ledger's, `runtime.ray_restart`). Ray re-runs its constructor in a new process; the
new incarnation takes nothing from the failed one's memory (`restore`):

1. **Fence.** Every ledger, the coordinator and persistence discard from now on the
   calls of the failed incarnation still on their way (`ShardActor.fence`; each call
   carries its sender's incarnation, ``membership-<i>@<epoch>``, so the new
   incarnation's links start at 1 beside the old ones and are never taken for their
   duplicates). The new incarnation's links take the epochs of the ledgers that
   restarted before from persistence, which hears every restart's notice; a ledger
   restarting meanwhile sends its notice again once it hears of this restart
   (`ray_links.Links.restarted_membership`).
2. **Purges.** The coordinator abandons the shard's purges that did not commit
   (their callers hear nothing of them was committed) and waits for one committing;
   then it tells every ledger to drop the markers of the failed incarnation it
   still holds (`RecoverMembership`, `ForgetMarkers`: one the failed incarnation
   sent to a ledger before it died, whose purge never reached the coordinator).
3. **The records the ledgers hold.** Each ledger answers `SeenRecords` through its
   mailbox, after every attribution the failed incarnation got into it: the highest
   record sequence it holds from this shard, durable or not. The new incarnation
   numbers its records above every answer (and above what the store shows), so no
   number is handed out twice (a purge tombstones records by number).
4. **The store.** In the ``shards`` layout the failed incarnation committed its
   control writes in its own environment (`runtime.ray_control`): the new one takes
   over that environment's writes and reads it, with the coordinator's records
   (`ShardActor.coordinator_part`; `storage.shard_part`); in the ``single`` layout
   persistence commits what waits (every control write the failed incarnation got
   to it, which is fenced from then on) and reads the store (`LoadStore`). The
   shard restores from it through the open's restore
   (`supervision.restore_membership`: memberships, leave epochs, cohorts, routes).
   Its write tokens and purge markers start at ``epoch << 40``, above the failed
   incarnation's (epochs grow: `next_epoch`).
5. **Tell.** `MembershipRestart` to every other actor and the facade: each sender
   drops what it keeps for the failed incarnation (not sent again), and the facade
   fails every call in flight to it with `ActorFailure` saying it may have been
   applied, and the next flush if signals were sent to it since the last flush
   (`ray_links.Links.restarted`).

What the failed incarnation had sent and was not yet durable stays where it got to:
an attribution in a ledger's state (counted by step 3), a control write at
persistence (committed before the read of step 4), or nowhere (lost with the
process). None of it was acknowledged to a caller except through a call that now
fails, so losing part of it loses nothing acknowledged.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import ray

from tidal_actors.actors import messages as M
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.actors.recovery import FaultReport, LoadStore, RecoverMembership, SeenRecords
from tidal_actors.runtime.ray_asks import ask, call, fence
from tidal_actors.runtime.ray_links import actor_name
from tidal_actors.runtime.ray_replies import NAMESPACE, send_fault
from tidal_actors.runtime.ray_restart import MembershipRestart
from tidal_actors.runtime.supervision import restore_membership
from tidal_actors.storage.layout import membership_env
from tidal_actors.storage.shard_part import own_part

__all__ = ["epoch_after", "next_epoch", "restore"]


def next_epoch(db: str, address: M.Address, opened: int) -> int:
    """The epoch (int ns) of a new incarnation of ``address`` in database ``db``:
    the wall clock, but strictly above every epoch of ``address`` used before
    (``opened``, the first incarnation's, and the highest the coordinator and
    persistence know of: `ShardActor.epochs`; every restart's notice reaches
    them), so a clock stepped back cannot make a new incarnation's epoch lower than
    a fenced one.

    Raises:
        ActorFailure, RayError: the coordinator or persistence cannot answer (the
            restart fails; Ray tries again).
    """
    name = f"{address[0]}-{address[1]}"
    handles: list[Any] = [
        ray.get_actor(actor_name(db, a), namespace=NAMESPACE)
        for a in (M.COORD_ADDR, M.PERSIST_ADDR)
        if a != address  # the coordinator restarting asks persistence only
    ]
    seen: list[int] = [call(functools.partial(h.epochs.remote, name, address)) for h in handles]
    return epoch_after(time.time_ns(), opened, seen)


def epoch_after(now_ns: int, opened: int, seen: list[int]) -> int:
    """A new incarnation's epoch: ``now_ns`` (the wall clock, int ns), raised to one
    above ``opened`` (the first incarnation's epoch) and each epoch in ``seen`` (the
    highest ones other actors know of) when the clock is behind them."""
    return max(now_ns, opened + 1, *(int(s) + 1 for s in seen))


def restore(actor: Any) -> tuple[MembershipShard, MembershipRestart]:
    """The new incarnation of the membership shard hosted by ``actor`` (a
    `ShardActor` whose constructor Ray re-runs; run on its restore thread,
    `ray_restoring`), restored as the module says, and
    the notice for the other actors and the facade. A `FaultReport` ("restarted",
    its ``cause`` saying how long the restore took) goes to the facade.

    Raises:
        ActorFailure, StorageError: the restart failed (Ray restarts it again).
    """
    started = time.monotonic()
    i, cfg, links = actor.address[1], actor._config, actor.links
    ledgers = [(M.LEDGER, li) for li in range(cfg.ledger_shards)]
    name = f"{M.MEMBERSHIP}-{i}"
    fence(actor, [*ledgers, M.COORD_ADDR, M.PERSIST_ADDR], name)
    # the ledgers restarted before: persistence heard every notice
    links.adopt_epochs(call(links.handle(M.PERSIST_ADDR).known_epochs.remote))
    # its purges not committed end; markers of them the ledgers hold are dropped
    below = MembershipShard.first_token(actor.epoch)  # its own markers start above
    recover = functools.partial(RecoverMembership, i, below)
    ask(links.handle(M.COORD_ADDR), recover, "recover-membership")
    seen = [
        ask(links.handle(a), functools.partial(SeenRecords, i), "seen-records") for a in ledgers
    ]
    # its own environment and the coordinator's records (`storage.shard_part`), or,
    # in the single layout, the whole store as persistence reads it
    restored = None
    source = "its own environment and the coordinator's records"
    if actor.host.commit_control is not None:
        part = call(links.handle(M.COORD_ADDR).coordinator_part.remote)
        if part is not None:
            restored = own_part(actor._resolve("store"), membership_env(i), part)
    if restored is None:
        source = "the whole store"
        restored = ask(links.handle(M.PERSIST_ADDR), LoadStore, "load-store")
    numbered = max([-1, *seen]) + 1
    new = restore_membership(cfg, actor.host.ctx, restored, None, i, actor.epoch, numbered=numbered)
    took = time.monotonic() - started
    cause = (
        f"its process died (restored from {source} in {took:.3f} s; records numbered "
        f"from {numbered})"
    )
    send_fault(actor.sink, FaultReport(actor.address, "restarted", cause))
    return new, MembershipRestart(actor.address, actor.epoch)
