"""A small asyncio application that embeds tidal_actors (the twin of trio_app.py).

* several producer tasks put their users in cohorts and submit engagement signals;
  some of their users then ask to leave the community layer, others to have their
  contributions to their cohort purged;
* one task serves those leave and purge requests, in arrival order, from a queue;
* one task reads the community's top entities every few milliseconds.

Everything runs in one ``asyncio.run``; the database's actors run on their own threads
and wake the waiting tasks with ``loop.call_soon_threadsafe``, so the event loop is
never blocked, not even by backpressure (a task that finds a mailbox full is parked). At the end the program
prints a short summary. Run:

    python examples/asyncio_app.py [--path DIR] [--producers N] [--users N] [--signals N]

Ctrl-C stops it: asyncio cancels the main task, the database is closed, and one line says
so (exit status 130).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
from dataclasses import dataclass, field

from tidal_actors import COMMUNITY, AsyncTidalDb, open_tidal

COHORTS = ("readers", "writers", "lurkers")
TYPE_VIEW = 1
ENTITIES = 10
AFTER_LEAVE = 5  # signals a user submits after leaving (they are gated)


@dataclass
class Request:
    kind: str  # "leave" or "purge"
    user: int
    cohort: str
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Tally:
    sent: int = 0
    leaves: int = 0
    purges: int = 0
    retracted: int = 0
    topk_reads: int = 0
    last_top: list[tuple[int, float]] = field(default_factory=list)


async def producer(
    db: AsyncTidalDb,
    p: int,
    users: int,
    signals: int,
    requests: asyncio.Queue[Request | None],
    tally: Tally,
) -> None:
    for i in range(users):
        user = p * 1000 + i
        cohort = COHORTS[user % len(COHORTS)]
        await db.assign_cohort(user, cohort)
        for j in range(signals):
            # popularity is skewed: entity isqrt(j), so a few entities lead
            await db.signal_with_context(user, math.isqrt(j) % ENTITIES, TYPE_VIEW, 1.0)
            tally.sent += 1
        if i % 5 == 0:
            await requests.put(Request("purge", user, cohort))
        if i % 10 == 3:
            leave = Request("leave", user, cohort)
            await requests.put(leave)
            await leave.done.wait()
            for j in range(AFTER_LEAVE):
                await db.signal_with_context(user, j % ENTITIES, TYPE_VIEW, 1.0)
                tally.sent += 1


async def request_server(
    db: AsyncTidalDb, requests: asyncio.Queue[Request | None], tally: Tally
) -> None:
    while (req := await requests.get()) is not None:  # None: every producer is done
        if req.kind == "leave":
            await db.leave_community_layer(req.user)
            tally.leaves += 1
        else:
            _, manifest = await db.request_community_purge(req.user, req.cohort)
            tally.purges += 1
            tally.retracted += len(manifest.entries)
        req.done.set()


async def topk_reader(
    db: AsyncTidalDb, stop: asyncio.Event, tally: Tally, every_s: float = 0.005
) -> None:
    while not stop.is_set():
        tally.last_top = await db.top_entities(COMMUNITY, TYPE_VIEW, 3)
        tally.topk_reads += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def main(path: str | None, producers: int, users: int, signals: int) -> Tally:
    tally = Tally()
    async with open_tidal(path) as db:
        print(f"running: {producers} producers x {users} users (Ctrl-C stops it)", flush=True)
        requests: asyncio.Queue[Request | None] = asyncio.Queue(100)
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as outer:
            outer.create_task(topk_reader(db, stop, tally))
            async with asyncio.TaskGroup() as group:
                group.create_task(request_server(db, requests, tally))
                async with asyncio.TaskGroup() as producing:
                    for p in range(producers):
                        producing.create_task(producer(db, p, users, signals, requests, tally))
                await requests.put(None)
            await db.flush()
            stop.set()
        tally.last_top = await db.top_entities(COMMUNITY, TYPE_VIEW, 3)
        stats = await db.stats()
    print(f"producers: {producers}, users: {producers * users}")
    print(
        f"signals sent: {tally.sent} applied: {stats['signals']} "
        f"forwarded: {stats['forwarded']} gated: {stats['gated']}"
    )
    print(f"leaves: {tally.leaves} purges: {tally.purges} records retracted: {tally.retracted}")
    print(f"top-k reads: {tally.topk_reads}")
    print("top 3 @community: " + " ".join(f"{e}={s:.2f}" for e, s in tally.last_top))
    return tally


def positive(text: str) -> int:
    """An argument that must be a positive integer (argparse's ``type``)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default=None, help="LMDB directory (default: ephemeral)")
    ap.add_argument("--producers", type=positive, default=4)
    ap.add_argument("--users", type=positive, default=25, help="users per producer")
    ap.add_argument("--signals", type=positive, default=20, help="signals per user")
    args = ap.parse_args()
    try:
        asyncio.run(main(args.path, args.producers, args.users, args.signals))
    except KeyboardInterrupt:  # Ctrl-C: asyncio cancels the main task; the database is closed
        print("interrupted (Ctrl-C): stopped, database closed", file=sys.stderr)
        sys.exit(130)
