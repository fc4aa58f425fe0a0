"""Issue 8: concurrency stress. Eight threads do mixed operations for a bounded time
against one persistent database; then the invariants are checked.

Each thread owns four users and their entities (so a per-thread reference model
predicts exactly the aggregate rows of those entities), but every thread shares the
cohorts, the shards, the coordinator and the persistence actor with the others.
Checked afterwards, and again after a reopen:

* stop-forward and purge exactness: for each thread, the rows of its entities, the
  statuses, leave histories, cohorts and manifests of its users equal its model's
  (a signal sent after a leave returned is gated; a purge retracts exactly);
* no score, window count or weight is negative, during the run and after;
* the counters add up (signals, gated, forwarded).

``TIDAL_STRESS_SECONDS`` sets the duration (default 3).
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, Signal, TidalDb
from tidal_actors.testing import ReferenceModel

from .conftest import HOUR, T0

SECONDS = float(os.environ.get("TIDAL_STRESS_SECONDS", "3"))
THREADS = 8
COHORTS = ("c0", "c1", "c2", "c3")
AT = T0 + HOUR


def _users(k):
    return [k * 10 + j for j in range(4)]


def _entities(u):
    return [u * 10 + j for j in range(3)]


def _approx_rows(got, want):
    assert [r[:3] + r[4:5] for r in got] == [r[:3] + r[4:5] for r in want]
    assert [r[3] for r in got] == pytest.approx([r[3] for r in want], rel=1e-9, abs=1e-12)
    assert [r[5] for r in got] == pytest.approx([r[5] for r in want], rel=1e-9, abs=1e-12)


def _manifests(mans):
    return [(m.user_id, m.cohort, m.entries, m.evicted) for m in mans]


def _compare(db, k, model):
    ents = {e for u in _users(k) for e in _entities(u)}
    _approx_rows([r for r in db.aggregate_rows(AT) if r[1] in ents], model.aggregate_rows(AT))
    for u in _users(k):
        assert db.community_layer_status(u) == model.community_layer_status(u)
        assert db.community_leave_history(u) == model.community_leave_history(u)
        assert db.cohorts_of(u) == model.cohorts_of(u)
        assert _manifests(db.list_purge_manifests(u)) == _manifests(model.list_purge_manifests(u))


def _no_negative(rows):
    for r in rows:
        assert r[3] >= 0.0 and r[4] >= 0 and r[5] >= 0.0, r


def test_eight_threads_of_mixed_operations_keep_every_invariant(tmp_path):
    cfg = Config(membership_shards=3, ledger_shards=3, signal_flush_interval_ms=1.0)
    clock = ManualClock(T0)  # frozen: leave/rejoin times and manifest times are T0
    path = str(tmp_path / "db")
    models = [ReferenceModel(cfg, ManualClock(T0)) for _ in range(THREADS)]
    counts = [
        dict.fromkeys(("ops", "signals", "purges", "leaves", "reads"), 0) for _ in range(THREADS)
    ]
    errors: list[BaseException] = []
    deadline = time.monotonic() + SECONDS

    def worker(k: int, db: TidalDb) -> None:
        rng = random.Random(k)
        model, c = models[k], counts[k]
        users = _users(k)
        try:
            while time.monotonic() < deadline:
                c["ops"] += 1
                u = rng.choice(users)
                r = rng.random()
                if r < 0.35:
                    sigs = [
                        Signal(
                            u,
                            rng.choice(_entities(u)),
                            rng.randrange(2),
                            rng.choice((0.5, 1.0, 2.5)),
                            T0 - rng.randrange(30 * HOUR),
                        )
                        for _ in range(rng.randint(1, 8))
                    ]
                    if len(sigs) == 1:
                        db.signal_with_context(*sigs[0])
                    else:
                        db.signal_batch(sigs)
                    model.signal_batch(sigs)
                    c["signals"] += len(sigs)
                elif r < 0.45:
                    cohort = rng.choice(COHORTS)
                    db.assign_cohort(u, cohort)
                    model.assign_cohort(u, cohort)
                elif r < 0.50:
                    cohort = rng.choice(COHORTS)
                    db.unassign_cohort(u, cohort)
                    model.unassign_cohort(u, cohort)
                elif r < 0.58:
                    db.leave_community_layer(u)
                    model.leave_community_layer(u)
                    c["leaves"] += 1
                elif r < 0.66:
                    db.rejoin_community_layer(u)
                    model.rejoin_community_layer(u)
                elif r < 0.76:
                    cohort = rng.choice((*COHORTS, COMMUNITY))
                    _, got = db.request_community_purge(u, cohort)
                    _, want = model.request_community_purge(u, cohort)
                    assert (got.entries, got.evicted) == (want.entries, want.evicted)
                    c["purges"] += 1
                    # exact right after the purge, whatever the other threads do
                    for e in _entities(u):
                        for t in (0, 1):
                            score = db.read_decay_score(cohort, e, t, AT)
                            assert score >= 0.0
                            assert score == pytest.approx(
                                model.read_decay_score(cohort, e, t, AT), rel=1e-9, abs=1e-12
                            )
                else:
                    c["reads"] += 1
                    cohort = rng.choice((*COHORTS, COMMUNITY))
                    e = rng.choice(_entities(u))
                    assert db.read_window(cohort, e, 0, AT) == pytest.approx(
                        model.read_window(cohort, e, 0, AT)
                    )
                    top = db.top_entities(cohort, 1, 5, AT)
                    assert all(s > 0.0 for _, s in top)
                    assert [s for _, s in top] == sorted((s for _, s in top), reverse=True)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    with TidalDb.open(path, config=cfg, clock=clock) as db:
        threads = [threading.Thread(target=worker, args=(k, db)) for k in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(SECONDS + 60)
        assert not any(t.is_alive() for t in threads), "a thread hung"
        if errors:
            raise errors[0]
        db.flush()
        for k in range(THREADS):
            _compare(db, k, models[k])
        rows = db.aggregate_rows(AT)
        _no_negative(rows)
        s = db.stats()
        assert s["signals"] == sum(c["signals"] for c in counts)
        assert s["gated"] == sum(m.stats()["gated"] for m in models)
        assert s["forwarded"] + s["gated"] == s["signals"]
        assert s["handler_errors"] == 0 and s["failed_writes"] == 0
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        for k in range(THREADS):
            _compare(db, k, models[k])
        _no_negative(db.aggregate_rows(AT))
    total = {key: sum(c[key] for c in counts) for key in counts[0]}
    assert total["purges"] > 20 and total["leaves"] > 20 and total["signals"] > 500, total
    print("stress:", total)
