"""The purge coordinator restarted in place under the Ray host.

The coordinator's actor of a durable database has ``max_restarts``. Ray re-runs its
constructor in a new process; the new incarnation takes nothing from the failed
one's memory (`restore`):

1. **Fence.** Every shard and persistence discard from now on the calls of the
   failed incarnation still on their way (its links carry
   ``coordinator-0@<epoch>``).
2. **The store.** In the ``shards`` layout the failed incarnation committed its
   purges (a purge's manifest, tombstones and watermark) in its own environment
   (`runtime.ray_control`): each committed, or died with it unacknowledged. The new
   incarnation has persistence commit what it holds (a rebuild's erasure writes
   purge statuses), takes over its environment's writes and reads it alone
   (`storage.shard_part.own_part`). In the ``single`` layout persistence commits what
   waits (the purges the failed incarnation sent are committed now, or were never
   sent) and reads the store. The coordinator's state (watermarks, drained records, purge
   statuses, manifests, the last purge id) comes back through the open's restore
   (`runtime.restore.build_states`); its rebuilds' tokens start at ``epoch << 40``,
   above the failed incarnation's.
3. **The membership shards' cut-over.** Each answers, in its own thread, the number
   of its newest purge marker (`MarkerCount`): every purge it marked up to then
   was sent to the failed incarnation and ends here (refused if it comes again:
   `PurgeCoordinator.receive`); later ones go to this one.
4. **The ledgers.** Each drops its rebuilds running and answers the purges it
   prepared and did not apply (`CoordinatorLost`). A committed one (its status is in
   the store) gets its retraction (`ApplyPurge`, with the ledger's own preparation:
   a copy of one applied already is a no-op); one not committed is abandoned
   (`PurgeAbandoned`). Then every ledger gets each membership shard's watermark
   from the store (`EvictionUpdate`) and forgets the markers of the purges ended
   (`ForgetMarkers`), after those on the same link.
5. **Tell.** `CoordinatorRestart` to every other actor and the facade: senders send
   again what the failed incarnation had not taken; the facade fails the calls in
   flight to it and the purge requests in flight through the membership shards,
   saying they may have been applied (`list_purge_manifests` says whether a purge
   committed).
"""

from __future__ import annotations

import functools
import time
from typing import Any

from tidal_actors.actors import messages as M
from tidal_actors.actors.coordinator import PurgeCoordinator
from tidal_actors.actors.recovery import (
    CoordinatorLost,
    FaultReport,
    ForgetMarkers,
    LoadStore,
    MarkerCount,
)
from tidal_actors.runtime.ray_asks import ask, call, fence
from tidal_actors.runtime.ray_replies import send_fault
from tidal_actors.runtime.ray_restart import CoordinatorRestart
from tidal_actors.runtime.restore import build_states
from tidal_actors.storage.layout import COORDINATOR
from tidal_actors.storage.shard_part import own_part

__all__ = ["restore"]


def restore(actor: Any) -> tuple[PurgeCoordinator, CoordinatorRestart]:
    """The new incarnation of the coordinator hosted by ``actor`` (a `ShardActor`
    whose constructor Ray re-runs; run on its restore thread, `ray_restoring`), restored as the module says, and the notice.

    Raises:
        ActorFailure, StorageError: the restart failed (Ray restarts it again).
    """
    started = time.monotonic()
    cfg, links = actor._config, actor.links
    ledgers = [(M.LEDGER, li) for li in range(cfg.ledger_shards)]
    shards = [(M.MEMBERSHIP, m) for m in range(cfg.membership_shards)]
    name = f"{M.COORDINATOR}-0"
    fence(actor, [*ledgers, *shards, M.PERSIST_ADDR], name)
    links.adopt_epochs(call(links.handle(M.PERSIST_ADDR).known_epochs.remote))
    if actor.host.commit_control is not None:
        # the shards layout: its own environment (`storage.shard_part`), once
        # persistence committed what it held (a rebuild's erasure writes statuses here)
        ask(links.handle(M.PERSIST_ADDR), functools.partial(LoadStore, read=False), "commit")
        restored = own_part(actor._resolve("store"), COORDINATOR)
        source = "its own environment"
    else:
        restored = ask(links.handle(M.PERSIST_ADDR), LoadStore, "load-store")
        source = "the whole store"
    marked = [ask(links.handle(a), MarkerCount, "marker-count") for a in shards]
    open_ = [ask(links.handle(a), CoordinatorLost, "coordinator-lost") for a in ledgers]
    state = build_states(cfg, restored, None, ledgers=())[2]
    new = PurgeCoordinator(actor.host.ctx, state)
    # its rebuilds' tokens above the failed incarnation's: a result of one of those
    # sent again is never taken for one of its own
    new._remat_seq = actor.epoch << 40
    applied = abandoned = 0
    for li, prepared in enumerate(open_):
        for prep, rows in prepared:
            if prep.purge_id in state.statuses:  # committed: its retraction
                links.send(
                    (M.LEDGER, li), M.ApplyPurge(prep.purge_id, prep.user, prep.cohort, rows)
                )
                applied += 1
                continue
            gone = M.PurgeAbandoned(prep.marker, prep.marker[0], prep.user, prep.cohort, prep.bound)
            for address in ledgers:
                links.send(address, gone)
            abandoned += 1
    for m, top in enumerate(marked):
        new._ended_upto[m] = int(top)
        update = M.EvictionUpdate(m, state.watermarks[m], len(state.drained[m]), (m, int(top)))
        for address in ledgers:
            links.send(address, update)
            links.send(address, ForgetMarkers(m, int(top) + 1))
    took = time.monotonic() - started
    cause = (
        f"its process died (restored from {source} in {took:.3f} s; {applied} committed purge(s) "
        f"applied, {abandoned} abandoned)"
    )
    send_fault(actor.sink, FaultReport(actor.address, "restarted", cause))
    return new, CoordinatorRestart(actor.address, actor.epoch)
