"""Group commit of control writes under faults, driven by the seeded harness: one
user's assigns, unassigns, leaves, rejoins and purges submitted back to back with
signals between them, other users' writes beside them, injected commit failures
(control and history writes) and persistence crashes mid-group. Every operation
that returned is what the reference model gives for the operations that returned,
in submission order (a signal submitted before a leave is counted, one after it
gated; a purge covers every signal submitted before it), and so is the store
reopened."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, StorageError, TidalDb
from tidal_actors.testing import Harness, ReferenceModel

from ._differential import Blocking, Recorder, assert_matches, assert_matches_and_reopened
from .conftest import T0
from .test_harness import CFG

USERS = (1, 2, 3)


def _storm(seed: int, ordering: str, crashes: bool) -> bool:
    """Run one seeded storm and check it; returns whether the store was reopened
    and checked too (no history write failed)."""
    rnd = random.Random(seed)
    cfg = CFG.replace(membership_shards=1, max_contribution_log_entries=6)
    h = Harness(seed=seed, config=cfg, ordering=ordering)  # type: ignore[arg-type]
    r = Recorder(h)
    t0 = h.clock.now_ns()
    n = 0
    for _ in range(60):
        u = rnd.choice(USERS)
        op = rnd.random()
        if op < 0.35:
            n += 1
            r.signal_with_context(u, n % 4, 0, 0.5 + n % 3, t0 - n)
        elif op < 0.5:
            r.assign_cohort(u, rnd.choice("ab"))
        elif op < 0.55:
            r.unassign_cohort(u, rnd.choice("ab"))
        elif op < 0.65:
            r.leave_community_layer(u)
        elif op < 0.75:
            r.rejoin_community_layer(u)
        elif op < 0.82:
            r.request_community_purge(u, rnd.choice(("a", "b", COMMUNITY)))
        elif op < 0.9:
            only = rnd.choice(("control",) * 8 + ("history", None))
            h.fail_next_write(rnd.randint(1, 2), only=only)  # type: ignore[arg-type]
        elif crashes and op < 0.92:
            for _ in range(rnd.randrange(6)):
                h.step()
            h.crash_persistence()
        else:
            for _ in range(rnd.randrange(8)):
                h.step()
    h.run_until_idle()
    h.fail_next_write(0)
    try:
        h.run(h.flush())
    except StorageError:  # a history write failed: its signals are live, not durable
        assert_matches(Blocking(h), r.model(cfg), USERS, exact_ids=False, where=f"seed {seed}")
        return False
    assert_matches_and_reopened(h, r.model(cfg), USERS, f"seed {seed}")
    return True


@pytest.mark.parametrize("crashes", [False, True], ids=["failures", "failures+crashes"])
@pytest.mark.parametrize("ordering", ["mailbox", "pair"])
def test_control_writes_under_commit_failures_match_the_model(ordering: str, crashes: bool) -> None:
    reopened = [seed for seed in range(40) if _storm(seed, ordering, crashes)]
    assert len(reopened) >= 5  # enough storms lost no history write to check a reopen


# -- threads of one user each, on the pykka host, with failing commits ------------------


def _thread_ops(rnd: random.Random, u: int, n: int) -> list[tuple[Any, ...]]:
    """``n`` operations on user ``u``: signals, assigns, unassigns, leaves, rejoins
    and purges, in a random order."""
    out: list[tuple[Any, ...]] = []
    for i in range(n):
        op = rnd.random()
        if op < 0.3:
            out.append(("signal_with_context", u, i % 3, 0, 1.0 + i % 4, T0 - u * 1000 - i))
        elif op < 0.5:
            out.append(("assign_cohort", u, rnd.choice("abc")))
        elif op < 0.6:
            out.append(("unassign_cohort", u, rnd.choice("abc")))
        elif op < 0.72:
            out.append(("leave_community_layer", u))
        elif op < 0.84:
            out.append(("rejoin_community_layer", u))
        else:
            out.append(("request_community_purge", u, rnd.choice(("a", "b", COMMUNITY))))
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", ["single", "shards"])
def test_threads_of_same_user_writes_with_failing_commits_persist_what_returned(
    tmp_path: Path, seed: int, layout: str
) -> None:
    """Eight threads, one user each, 40 operations each through a durable database
    whose control commits fail at random (a group fails, then its writes are
    retried one by one, each failing at random again). Each thread's operations
    that returned, replayed in its order by the reference model (the others
    skipped: a refused control operation changes nothing), give what the database
    answers, and what it answers after a reopen. In the ``shards`` layout the
    failures are each environment's (a group's part in one environment fails while
    the others commit: `ShardedWrites.commit_writes`)."""
    rnd = random.Random(seed)
    cfg = Config(
        rematerialize_after_ms=None, membership_shards=2, ledger_shards=2, store_layout=layout
    )
    path = tmp_path / "s"
    plans = {u: _thread_ops(random.Random(seed * 100 + u), u, 40) for u in range(1, 9)}
    done: dict[int, list[tuple[Any, ...]]] = {u: [] for u in plans}
    lock = threading.Lock()

    def fault(ops: list[Any]) -> None:
        if any(op[0] in ("users", "items") for op in ops):
            with lock:
                failing = rnd.random() < 0.3
            if failing:
                raise StorageError("injected: this commit fails")

    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        store = db._core.store
        targets = [store] if layout == "single" else list(store.envs.values())
        for target in targets:
            target.fault = fault

        def work(u: int) -> None:
            for op in plans[u]:
                try:
                    getattr(db, op[0])(*op[1:])
                except StorageError:
                    continue
                done[u].append(op)

        threads = [threading.Thread(target=work, args=(u,)) for u in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for target in targets:
            target.fault = None
        db.flush()
        model = ReferenceModel(cfg, ManualClock(T0))
        for u in plans:
            for op in done[u]:
                getattr(model, op[0])(*op[1:])
        assert sum(len(d) for d in done.values()) < 320  # some failed
        assert_matches(db, model, plans, exact_ids=False, where="live: ")
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        assert_matches(db, model, plans, exact_ids=False, where="reopened: ")


_CHILD = """
import os, random, sys, threading
sys.path.insert(0, sys.argv[2])
from tidal_actors import Config, ManualClock, TidalDb
from tests.test_group_commit_faults import CRASH_CFG, T0, _control_ops

log = os.open(sys.argv[3], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
db = TidalDb.open(sys.argv[1], config=CRASH_CFG, clock=ManualClock(T0))

def work(u):
    for i, op in enumerate(_control_ops(u)):
        os.write(log, f"{u} {i} try\\n".encode())
        getattr(db, op[0])(*op[1:])
        os.write(log, f"{u} {i} ok\\n".encode())

threads = [threading.Thread(target=work, args=(u,)) for u in range(1, 9)]
for t in threads:
    t.start()
print("started", flush=True)
for t in threads:
    t.join()
print("finished", flush=True)
"""

CRASH_CFG = Config(rematerialize_after_ms=None, membership_shards=2, ledger_shards=2)


def _control_ops(u: int) -> list[tuple[Any, ...]]:
    """User ``u``'s 400 control operations (no signals: those are durable only once
    flushed), the same in the child and here."""
    return [op for op in _thread_ops(random.Random(u), u, 600) if op[0] != "signal_with_context"][
        :400
    ]


def _user_state(db: Any, u: int) -> tuple[Any, ...]:
    return (
        db.community_layer_status(u),
        db.community_leave_history(u),
        db.cohorts_of(u),
        [(m.user_id, m.cohort, m.entries, m.evicted) for m in db.list_purge_manifests(u)],
    )


@pytest.mark.parametrize("after_s", [0.4, 0.9, 1.6])
def test_a_crash_amid_concurrent_control_writes_keeps_every_acknowledged_one(
    tmp_path: Path, after_s: float
) -> None:
    """Eight threads of one user each send control operations back to back, one at
    a time each, so they share commits; the process is killed (SIGKILL) meanwhile.
    Reopened, each user holds exactly the operations acknowledged to it, plus at
    most the one it was waiting for (in flight: there entirely or not at all)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    path, log = tmp_path / "s", tmp_path / "log"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), str(Path(__file__).parent.parent), str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "started"
        time.sleep(after_s)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        child.kill()
    tried: dict[int, int] = {}
    acked: dict[int, int] = {}
    for line in log.read_text().splitlines():
        u, i, what = line.split()
        (acked if what == "ok" else tried)[int(u)] = int(i)
    assert 8 < sum(acked.values()) < 8 * 399  # the kill came amid the writes
    with TidalDb.open(path, config=CRASH_CFG, clock=ManualClock(T0)) as db:
        for u in range(1, 9):
            ops = _control_ops(u)
            n = acked.get(u, -1) + 1  # acknowledged: ops[:n]
            candidates = [ops[:n]] + ([ops[: n + 1]] if tried.get(u, -1) == n else [])
            got = _user_state(db, u)
            wants = []
            for prefix in candidates:
                model = ReferenceModel(CRASH_CFG, ManualClock(T0))
                for op in prefix:
                    getattr(model, op[0])(*op[1:])
                wants.append(_user_state(model, u))
            assert got in wants, f"user {u}: {n} acknowledged, got {got}, want one of {wants}"
