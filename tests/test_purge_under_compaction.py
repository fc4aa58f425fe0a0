"""Purge exactness while the contribution log evicts and compacts around purges.

The log is compacted as soon as half of it is evicted (normally at 65,536 dead
records), so compaction lands between a purge's call, its preparation and its
application in many delivery orders. Each run is compared with the single-threaded
reference model: every manifest (entries and evicted count), every aggregate row.
Cases found by an adversarial review: two purges of one pair with the same bound; a
ledger trimming a record that a purge in flight on another ledger leaves room for; a
purge that finds nothing leaving its hold behind.
"""

from __future__ import annotations

import random

import pytest

from tidal_actors import COMMUNITY, Config
from tidal_actors.core import contrib_log as _contrib_log
from tidal_actors.testing import Harness, ReferenceModel

from ._differential import Blocking, assert_matches
from ._setups import HOUR_WINDOWS
from .conftest import MIN


def _ledgers(h: Harness) -> list:  # type: ignore[type-arg]
    return [h.behaviour(("ledger", i)) for i in range(h.config.ledger_shards)]


@pytest.fixture(autouse=True)
def _compact_often(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(_contrib_log, "_COMPACT_MIN", 1)


def _config(rng: random.Random) -> Config:
    return HOUR_WINDOWS.replace(
        membership_shards=rng.choice([1, 2, 3]),
        ledger_shards=rng.choice([1, 2, 3]),
        max_contribution_log_entries=rng.choice([3, 4, 6, 10, 20]),
    )


def _random_run(seed: int) -> None:
    """Signals, purges (repeats of one pair included), leaves and rejoins submitted in
    rounds, each round partly delivered before the next is submitted."""
    rng = random.Random(seed)
    cfg = _config(rng)
    h = Harness(seed=seed, config=cfg)
    model = ReferenceModel(cfg, h.clock)
    db = Blocking(h)
    users = [1, 2, 3, 2**64 - 1]
    cohorts = ["red", "blue", "ü"]
    for u in users:
        for c in rng.sample(cohorts, rng.randrange(3)):
            db.assign_cohort(u, c)
            model.assign_cohort(u, c)
    n = 0
    for _ in range(6):
        for _ in range(rng.randrange(20)):
            n += 1
            u = rng.choice(users)
            ts = h.clock.now_ns() - n * 1000
            h.signal_with_context(u, n % 4, 0, 0.5 + n % 3, ts, {"n": n} if n % 3 == 0 else None)
            model.signal_with_context(u, n % 4, 0, 0.5 + n % 3, ts)
        for _ in range(rng.randrange(4)):
            u, c = rng.choice(users), rng.choice([*cohorts, COMMUNITY])
            for _ in range(rng.choice([1, 1, 2])):  # sometimes twice in a row: equal bounds
                h.request_community_purge(u, c)
                model.request_community_purge(u, c)
        if rng.random() < 0.3:
            u = rng.choice(users)
            h.leave_community_layer(u)
            model.leave_community_layer(u)
        if rng.random() < 0.3:
            u = rng.choice(users)
            h.rejoin_community_layer(u)
            model.rejoin_community_layer(u)
        h.advance(MIN)
        for _ in range(rng.randrange(50)):
            if not h.step():
                break
    h.run_until_idle()
    assert_matches(db, model, users, exact_ids=False, where=f"seed {seed}: ")
    for ledger in _ledgers(h):  # every purge over: no hold, no held row, nothing in flight
        assert ledger.state.log.holds == {} and ledger.state.log.held_rows == {}, f"seed {seed}"
        assert ledger._in_flight == {}, f"seed {seed}"


def test_random_rounds_against_the_model() -> None:
    for seed in range(400):
        _random_run(seed)


def _repeated_run(seed: int, purges: int) -> None:
    cfg = HOUR_WINDOWS.replace(membership_shards=1, ledger_shards=2, max_contribution_log_entries=4)
    h = Harness(seed=seed, config=cfg)
    model = ReferenceModel(cfg, h.clock)
    db = Blocking(h)
    for u in (1, 2):
        db.assign_cohort(u, "a")
        model.assign_cohort(u, "a")
    n = 0

    def signal(u: int) -> None:
        nonlocal n
        n += 1
        ts = h.clock.now_ns() - n * 1000
        h.signal_with_context(u, n % 3, 0, 1.0 + n % 4, ts)
        model.signal_with_context(u, n % 3, 0, 1.0 + n % 4, ts)

    for _ in range(3):
        signal(1)
    h.run_until_idle()
    for _ in range(purges):
        h.request_community_purge(1, "a")
        model.request_community_purge(1, "a")
    for _ in range(6):
        signal(1)
        signal(2)
    h.run_until_idle()
    h.request_community_purge(1, "a")
    model.request_community_purge(1, "a")
    h.run_until_idle()
    assert_matches(db, model, [1, 2], exact_ids=False, where=f"seed {seed}: ")
    manifests = db.list_purge_manifests(1)
    assert sum(len(m.entries) + m.evicted for m in manifests) == 9  # each record once


@pytest.mark.parametrize("purges", [2, 3])
def test_repeated_purges_of_one_pair(purges: int) -> None:
    """Purges of one pair back to back (one bound), then more signals and a last purge:
    the records after the bound go to the last purge, listed or counted once."""
    for seed in range(150):
        _repeated_run(seed, purges)


def test_purges_that_find_nothing_leave_no_hold() -> None:
    cfg = Config(membership_shards=1, ledger_shards=2, rematerialize_after_ms=None)
    h = Harness(seed=3, config=cfg)
    db = Blocking(h)
    for u in range(50):
        db.request_community_purge(u, "nobody-here")
    h.run_until_idle()
    for ledger in _ledgers(h):
        assert (
            ledger.state.log.holds == {}
            and ledger._in_flight == {}
            and ledger._ended_early == set()
        )


def test_a_purge_waiting_for_a_rebuild_keeps_its_place_in_its_shard(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A purge of a cohort being re-materialized waits for the rebuild; a later purge
    from the same membership shard must not commit before it (it would move the
    watermark past the waiting purge's bound, and the waiting purge would count its
    live records as evicted)."""
    from tidal_actors.actors import messages as M
    from tidal_actors.core import remat as _remat

    monkeypatch.setattr(_remat, "CHUNK_ROWS", 1)  # a rebuild in many steps, as a big cohort's
    cfg = Config(
        membership_shards=1,
        ledger_shards=1,
        max_contribution_log_entries=4,
        rematerialize_after_ms=None,
    )
    h = Harness(seed=0, config=cfg)
    model = ReferenceModel(cfg, h.clock)
    db = Blocking(h)

    def both(name: str, *args: object) -> object:
        getattr(model, name)(*args)
        return getattr(h, name)(*args)

    db.assign_cohort(2, "b")
    model.assign_cohort(2, "b")
    for i in range(50):
        both("signal_with_context", 9, 100 + i, 0)  # older records, evicted by what follows
    both("signal_with_context", 1, 1, 0)  # user 1: rseq 50 (@community)
    both("signal_with_context", 1, 2, 0)  # rseq 51
    both("signal_with_context", 2, 3, 0)  # user 2: rseq 52 (b), 53 (@community): the log is full
    h.run_until_idle()
    rebuild = h.rematerialize(COMMUNITY)
    coordinator = h.behaviour(M.COORD_ADDR)
    while coordinator._remat is None:
        assert h.step()
    first = both("request_community_purge", 1, COMMUNITY)
    both("signal_with_context", 2, 4, 0)
    both("signal_with_context", 2, 5, 0)
    second = both("request_community_purge", 2, "b")
    h.run_until_idle()
    assert rebuild.done and first.done and second.done  # type: ignore[attr-defined]
    (pid1, m1), (pid2, _) = first.result(), second.result()  # type: ignore[attr-defined]
    assert pid1 < pid2
    assert [e.entity_id for e in m1.entries] == [1, 2] and m1.evicted == 0  # both live when called
    assert h.run(h.read_decay_score(COMMUNITY, 1, 0)) == 0.0
    assert_matches(db, model, [1, 2, 9], exact_ids=False)
