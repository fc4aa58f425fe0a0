"""Child-process side of the crash tests (tests/test_crash.py and others), and the
calls with which a test starts a child and waits for it (`forkserver`,
`run_until_killed`).

Run in processes forked from a multiprocessing forkserver that has already imported
the library, so a kill point costs a fork, not an interpreter start. Each function
opens a persistent database, works, and is killed with SIGKILL by the test at some
point; it never closes the database.

The side file is the child's account of what it did: one JSON object per line,
written with a single ``os.write`` on an ``O_APPEND`` descriptor (a SIGKILL cannot
leave half a line; the reader tolerates one anyway).

* ``{"op": ..., "n": i, ...}`` is written *before* operation ``i`` is called (its
  intent: arguments and the clock's now);
* ``{"ack": i, ...}`` is written after a control operation or a flush returned,
  then fsynced.

So every acknowledged operation has an ack line, at most one control operation is
in flight (the child is sequential), and a signal is known to be durable once a
later flush has an ack line.
"""

from __future__ import annotations

import json
import os
import random
import signal
from typing import Any

USERS = 6
COHORTS = ("c1", "c4", "c5")  # c1 lives on ledger shard 1 (with @community), c4/c5 on 0
ENTITIES = 5
TYPES = 2
WEIGHTS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0)
HOUR = 3600 * 10**9


def forkserver() -> Any:
    """The multiprocessing context the tests fork children from: a forkserver that has
    imported the library (and this module) once, so a child costs a fork."""
    import multiprocessing

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tidal_actors", "tests._crash_worker"])
    return ctx


class Side:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, obj: dict[str, Any], sync: bool = False) -> None:
        os.write(self.fd, (json.dumps(obj) + "\n").encode())
        if sync:
            os.fsync(self.fd)


def workload(
    path: str, side_path: str, seed: int, start_ns: int, cfg: dict[str, Any], max_ops: int = 5000
) -> None:
    """A random mixed workload until killed (or ``max_ops``, then ``os._exit``)."""
    from tidal_actors import COMMUNITY, Config, ManualClock, Signal, TidalDb

    rng = random.Random(seed)
    side = Side(side_path)
    clock = ManualClock(start_ns)
    db = TidalDb.open(path, config=Config(**cfg), clock=clock)
    side.write({"opened": True}, sync=True)
    for n in range(max_ops):
        clock.advance(rng.randint(1, 10**9))
        now = clock.now_ns()
        r = rng.random()
        u = rng.randrange(USERS)
        if r < 0.50:
            sigs = []
            for _ in range(rng.randint(1, 6)):
                w = rng.choice(WEIGHTS) if rng.random() < 0.8 else rng.uniform(0, 5)
                ts = now - rng.randrange(0, 30 * HOUR) if rng.random() < 0.9 else None
                cx = {"k": rng.randrange(100)} if rng.random() < 0.1 else None
                sigs.append(
                    [rng.randrange(USERS), rng.randrange(ENTITIES), rng.randrange(TYPES), w, ts, cx]
                )
            side.write({"op": "sig", "n": n, "now": now, "s": sigs})
            if len(sigs) == 1 and rng.random() < 0.5:
                db.signal_with_context(*sigs[0])
            else:
                db.signal_batch([Signal(*s) for s in sigs])
            continue
        if r < 0.62:
            op, args = "assign", {"u": u, "c": rng.choice(COHORTS)}
        elif r < 0.67:
            op, args = "unassign", {"u": u, "c": rng.choice(COHORTS)}
        elif r < 0.75:
            op, args = "leave", {"u": u}
        elif r < 0.83:
            op, args = "rejoin", {"u": u}
        elif r < 0.92:
            op, args = "purge", {"u": u, "c": rng.choice((*COHORTS, COMMUNITY))}
        else:
            op, args = "flush", {}
        side.write({"op": op, "n": n, "now": now, **args})
        ack: dict[str, Any] = {"ack": n}
        if op == "assign":
            db.assign_cohort(u, args["c"])
        elif op == "unassign":
            db.unassign_cohort(u, args["c"])
        elif op == "leave":
            db.leave_community_layer(u)
        elif op == "rejoin":
            db.rejoin_community_layer(u)
        elif op == "purge":
            pid, manifest = db.request_community_purge(u, args["c"])
            ack.update(pid=int(pid), entries=len(manifest.entries))
        else:
            db.flush()
        side.write(ack, sync=True)
    os._exit(0)


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def ab_purge(path: str, side_path: str, point: str, start_ns: int, cfg: dict[str, Any]) -> None:
    """Users A (weight 1) and B (weight 2) in cohort "c"; purge A; die at ``point``.

    Points: ``before`` (signals flushed, purge not sent), ``prepare`` (the ledger is
    about to list A's records), ``pre-commit`` (the manifest's transaction is about
    to run), ``post-commit`` (it has committed; nothing applied, no reply),
    ``applied`` (the ledger has retracted A live; the caller may not have its reply),
    ``replied`` (the purge returned), ``remat-pre`` / ``remat-post`` (the purge
    returned, a re-materialization of "c" was asked for, and the next commit is
    about to run / has run), ``done`` (all of it finished and flushed).
    """
    from tidal_actors import Config, ManualClock, TidalDb
    from tidal_actors.actors import messages as M
    from tidal_actors.storage.format import Tag, decode_key

    side = Side(side_path)
    clock = ManualClock(start_ns)
    config = Config(**cfg)
    half = config.half_life_ns
    db = TidalDb.open(path, config=config, clock=clock)
    core = db._core
    db.assign_cohort(1, "c")
    db.assign_cohort(2, "c")
    db.signal_with_context(1, 7, 1, 1.0, timestamp_ns=start_ns)
    db.signal_with_context(2, 7, 1, 2.0, timestamp_ns=start_ns - half)
    db.flush()
    side.write({"flushed": True}, sync=True)
    if point == "before":
        _kill_self()
    store = core.store
    original_commit = store.commit
    after_manifest = [-1]

    def is_manifest(ops: list[Any]) -> bool:
        return any(ks == "items" and decode_key(k)[1] == Tag.PURGE_MANIFEST for ks, k, _ in ops)

    def commit(ops: Any) -> None:
        ops = list(ops)
        manifest = is_manifest(ops)
        if after_manifest[0] >= 0:
            after_manifest[0] += 1
        if point == "pre-commit" and manifest:
            _kill_self()
        if point == "remat-pre" and after_manifest[0] == 1:
            _kill_self()
        original_commit(ops)
        if point == "post-commit" and manifest:
            _kill_self()
        if point == "remat-post" and after_manifest[0] == 1:
            _kill_self()
        if manifest:
            after_manifest[0] = 0

    store.commit = commit
    for b in core.ledgers:
        handlers = b._handlers
        prep, apply = handlers[M.PreparePurge], handlers[M.ApplyPurge]

        def on_prepare(msg: Any, prep: Any = prep) -> None:
            if point == "prepare":
                _kill_self()
            prep(msg)

        def on_apply(msg: Any, apply: Any = apply) -> None:
            apply(msg)
            if point == "applied":
                _kill_self()

        handlers[M.PreparePurge] = on_prepare
        handlers[M.ApplyPurge] = on_apply
    clock.advance(10**9)
    side.write({"purging": True}, sync=True)
    pid, manifest = db.request_community_purge(1, "c")
    side.write({"ack": "purge", "pid": int(pid), "entries": len(manifest.entries)}, sync=True)
    if point == "replied":
        _kill_self()
    db.rematerialize("c")
    db.flush()
    side.write({"done": True}, sync=True)
    _kill_self()


def hold_env_open(path: str, ready: Any) -> None:
    """An outside process (a backup tool, a monitor) keeping the environment open."""
    import time

    import lmdb

    env = lmdb.open(path, max_dbs=8, readonly=True)
    ready.set()
    time.sleep(120)
    env.close()


def die_holding_readers(path: str, n: int, ready: Any) -> None:
    """Open the database, start ``n`` read transactions, and wait to be killed."""
    import time

    from tidal_actors import TidalDb

    db = TidalDb.open(path)
    env = db._core.store.env
    txns = [env.begin() for _ in range(n)]
    ready.set()
    time.sleep(120)
    del txns


def run_and_die(path: str, scenario: str, start_ns: int, cfg: dict[str, Any]) -> None:
    """Open, run ``scenario`` ("module:function", called with the database), then die."""
    import importlib

    from tidal_actors import Config, ManualClock, TidalDb

    module, name = scenario.split(":")
    fn = getattr(importlib.import_module(module), name)
    db = TidalDb.open(path, config=Config(**cfg), clock=ManualClock(start_ns))
    fn(db)
    _kill_self()


def run_until_killed(mp: Any, path: str, scenario: str, start_ns: int, cfg: dict[str, Any]) -> None:
    """The test's side of `run_and_die`: run it in a child of ``mp`` (`forkserver`),
    wait for the child (60 s at most), and assert it died of its SIGKILL."""
    p = mp.Process(target=run_and_die, args=(path, scenario, start_ns, cfg))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL, p.exitcode
