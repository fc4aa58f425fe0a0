"""Top-k reads against a plain sort: `top_entities` equals the ``k`` best of every
key's own score (`read_decay_score`, the same database at the same read time)
sorted by score descending, then entity ascending, and agrees with the reference
model's scores; after adds with exact and near ties, contributions stamped after
the read time, purges and evictions between reads, at both consistency levels."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors import COMMUNITY, Config, ManualClock, TidalDb
from tidal_actors.testing import ReferenceModel

from .conftest import SEC, T0

CFG = Config(
    half_life_ns=10 * SEC,
    window_width_ns=5 * SEC,
    window_buckets=4,
    max_contribution_log_entries=6,
    rematerialize_after_ms=None,
    membership_shards=2,
    ledger_shards=2,
)
ENTITIES = range(12)
USERS = range(4)
COHORTS = ("a", "b", COMMUNITY)
KS = (1, 2, 3, 5, 12)
# weights with exact ties, near ties (a few ulp apart) and zero
WEIGHTS = (1.0, 1.0, 2.0, 0.5, 1.0 + 2**-52, 1.0 - 2**-53, 3.0, 0.0)

signal = st.tuples(
    st.just("signal"),
    st.sampled_from(USERS),
    st.sampled_from(ENTITIES),
    st.sampled_from((0, 1)),
    st.sampled_from(WEIGHTS),
    st.sampled_from((-20, -10, -10, 0, 0, 3, 7, 15)),  # seconds from T0
)
control = st.one_of(
    st.tuples(st.just("assign"), st.sampled_from(USERS), st.sampled_from(("a", "b"))),
    st.tuples(st.just("purge"), st.sampled_from(USERS), st.sampled_from(COHORTS)),
)
read = st.tuples(
    st.just("read"),
    st.sampled_from((-15, -10, 0, 5, 20, 100)),  # read time, seconds from T0
    st.sampled_from(("read_your_writes", "latest")),
)
ops = st.lists(st.one_of(signal, signal, signal, control, read), min_size=1, max_size=40)


def _plain_top(scores: dict[int, float], k: int) -> list[tuple[int, float]]:
    best = sorted((-s, e) for e, s in scores.items() if s > 0.0)
    return [(e, -neg) for neg, e in best[:k]]


def _check(db: TidalDb, ref: ReferenceModel, at: int, consistency: str) -> None:
    for c in COHORTS:
        for t in (0, 1):
            own = {e: db.read_decay_score(c, e, t, at, consistency) for e in ENTITIES}
            want = {e: ref.read_decay_score(c, e, t, at) for e in ENTITIES}
            for e in ENTITIES:
                assert math.isclose(own[e], want[e], rel_tol=1e-9, abs_tol=1e-300), (c, e, t)
            for k in KS:
                got = db.top_entities(c, t, k, at, consistency)
                where = (c, t, k, at, consistency)
                assert got == _plain_top(own, k), where
                model = ref.top_entities(c, t, k, at)
                assert len(got) == len(model), where
                for (_, s), (_, m) in zip(got, model):
                    assert math.isclose(s, m, rel_tol=1e-9), where


@settings(max_examples=100, deadline=None)
@given(ops)
def test_top_k_equals_a_plain_sort_of_every_score(steps: list[tuple[Any, ...]]) -> None:
    clock = ManualClock(T0)
    ref = ReferenceModel(CFG, ManualClock(T0))
    with TidalDb.open(config=CFG, clock=clock) as db:
        for step in steps:
            if step[0] == "signal":
                _, u, e, t, w, dt = step
                db.signal_with_context(u, e, t, w, T0 + dt * SEC)
                ref.signal_with_context(u, e, t, w, T0 + dt * SEC)
            elif step[0] == "assign":
                db.assign_cohort(step[1], step[2])
                ref.assign_cohort(step[1], step[2])
            elif step[0] == "purge":
                _, got = db.request_community_purge(step[1], step[2])
                _, want = ref.request_community_purge(step[1], step[2])
                assert (got.entries, got.evicted) == (want.entries, want.evicted)
            else:
                _, dt, consistency = step
                if consistency == "latest":
                    db.flush()  # a latest read sees what a flush has made visible
                _check(db, ref, T0 + dt * SEC, consistency)


def test_readers_in_threads_while_ingesting_see_the_states_in_order() -> None:
    """One membership and one ledger shard, so the ledger applies the operations in
    the order submitted. Three threads read the top 4 of one cohort and type
    (``"latest"``, and ``"read_your_writes"`` from a thread that writes nothing)
    while the main thread ingests 600 signals of two users and purges user 2's
    records every 100; every answer is the top 4 after some prefix of those
    operations (scores computed here by the formula, to 1e-9), and each thread's
    answers come from prefixes in order (a view never goes back: a purge is
    never undone)."""
    import random
    import threading

    cfg = CFG.replace(membership_shards=1, ledger_shards=1, max_contribution_log_entries=10_000)
    rnd = random.Random(7)
    at = T0 + 100 * SEC
    sent = [
        (
            1 + rnd.randrange(2),
            rnd.randrange(12),
            rnd.choice((1.0, 2.0, 0.5, 3.0)),
            T0 + rnd.randrange(-30, 30) * SEC,
        )
        for _ in range(600)
    ]
    seen: list[list[tuple[tuple[int, float], ...]]] = [[], [], []]
    stop = threading.Event()
    with TidalDb.open(config=cfg, clock=ManualClock(T0)) as db:

        def reader(out: list[tuple[tuple[int, float], ...]], consistency: str) -> None:
            while not stop.is_set():
                got = tuple(db.top_entities(COMMUNITY, 0, 4, at, consistency))
                if not out or out[-1] != got:
                    out.append(got)

        threads = [
            threading.Thread(target=reader, args=(out, c))
            for out, c in zip(seen, ("latest", "latest", "read_your_writes"))
        ]
        for th in threads:
            th.start()
        try:
            for i, (u, e, w, ts) in enumerate(sent):
                db.signal_with_context(u, e, 0, w, ts)
                if i % 100 == 99:
                    db.request_community_purge(2, COMMUNITY)
        finally:
            db.flush()
            stop.set()
            for th in threads:
                th.join()
        final = db.top_entities(COMMUNITY, 0, 4, at, "latest")
    # every key's score after each prefix of the operations, by the plain formula
    half = cfg.half_life_ns
    live: list[tuple[int, int, float, int]] = []
    prefixes = [dict.fromkeys(range(12), 0.0)]
    for i, record in enumerate(sent):
        live.append(record)
        if i % 100 == 99:
            prefixes.append(_scores(live, at, half))  # the signal, then the purge
            live = [r for r in live if r[0] != 2]
        prefixes.append(_scores(live, at, half))

    def matching(got: Sequence[tuple[int, float]]) -> list[int]:
        out = []
        for n, p in enumerate(prefixes):
            best = _plain_top(p, 4)
            if len(got) == len(best) and all(
                math.isclose(s, b, rel_tol=1e-9) and math.isclose(p[e], s, rel_tol=1e-9)
                for (e, s), (_, b) in zip(got, best)
            ):
                out.append(n)
        return out

    assert matching(final)[-1] == len(prefixes) - 1
    for answers in seen:
        assert len(answers) > 1
        low = 0
        for got in answers:
            later = [n for n in matching(got) if n >= low]
            assert later, f"{got} is the top 4 of no state at or after prefix {low}"
            low = later[0]


def _scores(records: list[tuple[int, int, float, int]], at: int, half: int) -> dict[int, float]:
    """Every entity's score at ``at`` over ``records`` ``(user, entity, weight, ts)``."""
    out = dict.fromkeys(range(12), 0.0)
    for _, e, w, ts in records:
        out[e] += w * 2.0 ** (-(at - ts) / half)
    return out
