"""A small trio application that embeds tidal_actors.

* several producer tasks put their users in cohorts and submit engagement signals;
  some of their users then ask to leave the community layer, others to have their
  contributions to their cohort purged;
* one task serves those leave and purge requests, in arrival order, from a channel;
* one task reads the community's top entities every few milliseconds.

Everything runs in one trio run; the database's actors run on their own threads and
wake the waiting tasks, so the event loop is never blocked. At the end the program
prints a short summary. Run:

    python examples/trio_app.py [--path DIR] [--producers N] [--users N] [--signals N]

Ctrl-C stops it: trio cancels every task, the database is closed, and one line says
so (exit status 130).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field

import trio

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
    done: trio.Event = field(default_factory=trio.Event)


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
    requests: trio.MemorySendChannel[Request],
    tally: Tally,
) -> None:
    async with requests:
        for i in range(users):
            user = p * 1000 + i
            cohort = COHORTS[user % len(COHORTS)]
            await db.assign_cohort(user, cohort)
            for j in range(signals):
                # popularity is skewed: entity isqrt(j), so a few entities lead
                await db.signal_with_context(user, math.isqrt(j) % ENTITIES, TYPE_VIEW, 1.0)
                tally.sent += 1
            if i % 5 == 0:
                await requests.send(Request("purge", user, cohort))
            if i % 10 == 3:
                leave = Request("leave", user, cohort)
                await requests.send(leave)
                await leave.done.wait()
                for j in range(AFTER_LEAVE):
                    await db.signal_with_context(user, j % ENTITIES, TYPE_VIEW, 1.0)
                    tally.sent += 1


async def request_server(
    db: AsyncTidalDb, requests: trio.MemoryReceiveChannel[Request], tally: Tally
) -> None:
    async with requests:
        async for req in requests:
            if req.kind == "leave":
                await db.leave_community_layer(req.user)
                tally.leaves += 1
            else:
                _, manifest = await db.request_community_purge(req.user, req.cohort)
                tally.purges += 1
                tally.retracted += len(manifest.entries)
            req.done.set()


async def topk_reader(
    db: AsyncTidalDb, stop: trio.Event, tally: Tally, every_s: float = 0.005
) -> None:
    while not stop.is_set():
        tally.last_top = await db.top_entities(COMMUNITY, TYPE_VIEW, 3)
        tally.topk_reads += 1
        with trio.move_on_after(every_s):
            await stop.wait()


async def main(path: str | None, producers: int, users: int, signals: int) -> Tally:
    tally = Tally()
    async with open_tidal(path) as db:
        print(f"running: {producers} producers x {users} users (Ctrl-C stops it)", flush=True)
        send, receive = trio.open_memory_channel[Request](100)
        stop = trio.Event()
        async with trio.open_nursery() as outer:
            outer.start_soon(topk_reader, db, stop, tally)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(request_server, db, receive, tally)
                async with send:
                    for p in range(producers):
                        nursery.start_soon(producer, db, p, users, signals, send.clone(), tally)
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
    interrupted = False
    try:
        trio.run(main, args.path, args.producers, args.users, args.signals)
    except* KeyboardInterrupt:  # Ctrl-C: trio cancels every task; the database is closed
        interrupted = True
    if interrupted:
        print("interrupted (Ctrl-C): stopped, database closed", file=sys.stderr)
        sys.exit(130)
