"""Read consistency through the facades: *latest* reads (answered from the ledger
shards' published views) only ever show states that existed, in order; *read your
writes* reads see every write of the caller; a purge is never undone by a view; bad
consistency values are refused.

The property test drives the real behaviours under the deterministic harness: one
membership shard, so each ledger shard applies its records in call order and every
state it passes through is the reference model's after some prefix of the calls
(restricted to the shard's cohorts). After every delivery it reads every key and
every top-k at ``latest``, and checks each ledger shard's answers against the
model's after some prefix, the prefixes never going back."""

from __future__ import annotations

import math
import random
import threading
import time

import pytest

from tidal_actors import COMMUNITY, Config, InvalidArgument, Signal, TidalDb
from tidal_actors.actors.ledger_views import WANTED_S
from tidal_actors.core.sharding import ledger_shard_of
from tidal_actors.runtime.callers import Answered
from tidal_actors.testing import Harness, ReferenceModel
from tidal_actors.testing.harness import START_NS

from ._setups import HOUR_WINDOWS
from .conftest import HOUR, MIN

CFG = HOUR_WINDOWS.replace(membership_shards=1, ledger_shards=2)
COHORTS = ("red", "blue", COMMUNITY)
ENTITIES = range(5)
TYPES = (1, 2)
USERS = range(1, 7)
AT = START_NS + 10 * HOUR  # after every signal of the test
WEIGHTS = (0.5, 1.0, 1.5, 2.25, 3.0, 0.10000000149011612)


def _answers(h: Harness) -> dict[object, object]:
    """Every key's score and window and every (cohort, type)'s top-3 at ``AT``, read
    at ``latest``: each answered from a view at once (no message: at ``AT`` every
    contribution is settled and every group lists all its keys)."""
    out: dict[object, object] = {}
    for c in COHORTS:
        for t in TYPES:
            for e in ENTITIES:
                for kind, fn in (("score", "read_decay_score"), ("window", "read_window")):
                    call = getattr(h, fn)(c, e, t, AT, consistency="latest")
                    assert isinstance(call, Answered)
                    value = call.result()
                    out[(kind, c, e, t)] = tuple(value) if kind == "window" else value
            call = h.top_entities(c, t, 3, AT, consistency="latest")
            assert isinstance(call, Answered)
            out[("top", c, t)] = call.result()
    return out


def _model_answers(m: ReferenceModel) -> dict[object, object]:
    out: dict[object, object] = {}
    for c in COHORTS:
        for t in TYPES:
            for e in ENTITIES:
                out[("score", c, e, t)] = m.read_decay_score(c, e, t, AT)
                out[("window", c, e, t)] = tuple(m.read_window(c, e, t, AT))
            out[("top", c, t)] = m.top_entities(c, t, 3, AT)
    return out


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def _matches(got: dict[object, object], want: dict[object, object], ledger: int) -> bool:
    return all(
        _close(v, want[k])
        for k, v in got.items()
        if ledger_shard_of(k[1], CFG.ledger_shards) == ledger  # type: ignore[index]
    )


@pytest.mark.parametrize("seed", range(12))
def test_latest_reads_show_only_states_that_existed_in_order(seed: int) -> None:
    rnd = random.Random(seed)
    h = Harness(seed=seed, config=CFG)
    m = ReferenceModel(CFG, h.clock)
    for u in USERS:
        for c in rnd.sample(COHORTS[:2], rnd.randint(0, 2)):
            h.run(h.assign_cohort(u, c))
            m.assign_cohort(u, c)
    prefixes = [_model_answers(m)]  # the model after each call
    at = [0] * CFG.ledger_shards  # the prefix each ledger shard was last seen at
    rounds = 0

    def check_round() -> None:
        nonlocal rounds
        got = _answers(h)
        rounds += 1
        for li in range(CFG.ledger_shards):
            p = at[li]
            while p < len(prefixes) and not _matches(got, prefixes[p], li):
                p += 1
            assert p < len(prefixes), f"ledger {li} shows a state no prefix had (round {rounds})"
            at[li] = p

    for _ in range(12):
        for _ in range(rnd.randint(1, 6)):
            h.advance(rnd.randint(1, 20) * MIN // 10)
            s = (rnd.choice(USERS), rnd.choice(ENTITIES), rnd.choice(TYPES), rnd.choice(WEIGHTS))
            h.signal_with_context(*s)
            m.signal_with_context(*s)
            prefixes.append(_model_answers(m))
        while h.step():
            check_round()
        check_round()
        if rnd.random() < 0.4:  # a purge, applied everywhere before the next signals
            u, c = rnd.choice(USERS), rnd.choice(COHORTS)
            h.run(h.request_community_purge(u, c))
            m.request_community_purge(u, c)
            prefixes.append(_model_answers(m))
            while h.step():
                check_round()
            check_round()
        if rnd.random() < 0.2:
            u = rnd.choice(USERS)
            h.run(h.leave_community_layer(u))
            m.leave_community_layer(u)
    final = prefixes[-1]  # quiescent: latest shows the last state
    assert all(_matches(_answers(h), final, li) for li in range(CFG.ledger_shards))
    ryw = {}
    for c in COHORTS:
        for t in TYPES:
            for e in ENTITIES:
                ryw[("score", c, e, t)] = h.run(h.read_decay_score(c, e, t, AT))
                ryw[("window", c, e, t)] = tuple(h.run(h.read_window(c, e, t, AT)))
            ryw[("top", c, t)] = h.run(h.top_entities(c, t, 3, AT))
    assert all(_matches(ryw, final, li) for li in range(CFG.ledger_shards))


def test_read_your_writes_waits_for_own_signals_only() -> None:
    """A signal not yet delivered: ``latest`` does not see it (answered at once),
    ``read_your_writes`` does (its call waits for delivery); a caller that wrote
    nothing is answered from the view."""
    h = Harness(seed=1, config=CFG)
    h.run(h.assign_cohort(1, "red"))
    h.signal_with_context(1, 7, 1, 2.0)
    latest = h.read_decay_score("red", 7, 1, consistency="latest")
    assert isinstance(latest, Answered) and latest.result() == 0.0
    mine = h.read_decay_score("red", 7, 1)
    assert not mine.done
    assert h.run(mine) == 2.0
    # now covered: the next read is answered from the view, which has it
    again = h.read_decay_score("red", 7, 1)
    assert isinstance(again, Answered) and again.result() == 2.0
    other: list[object] = []
    t = threading.Thread(target=lambda: other.append(h.read_decay_score("red", 7, 1)))
    t.start()
    t.join()
    assert isinstance(other[0], Answered) and other[0].result() == 2.0


def test_a_purge_is_never_undone_by_a_view() -> None:
    """Once the retraction is applied, every view published after it (latest reads
    in another thread, while signals of other users keep coming) leaves the purged
    contributions out."""
    cfg = Config(half_life_ns=HOUR, rematerialize_after_ms=None)
    with TidalDb.open(config=cfg) as db:
        for u in (1, 2):
            db.assign_cohort(u, "red")
        db.signal_batch([Signal(1, 9, 1, 5.0)] * 10)
        db.flush()
        assert db.read_decay_score("red", 9, 1, consistency="latest") > 40.0
        db.request_community_purge(1, "red")
        db.flush()  # the retraction is applied, and published
        stop = threading.Event()

        def ingest() -> None:
            while not stop.is_set():
                db.signal_batch([Signal(2, e, 1, 1.0) for e in range(100, 200)])

        t = threading.Thread(target=ingest)
        t.start()
        try:
            seen = [db.read_decay_score("red", 9, 1, consistency="latest") for _ in range(2000)]
            tops = [db.top_entities("red", 1, 5, consistency="latest") for _ in range(200)]
        finally:
            stop.set()
            t.join()
        assert seen == [0.0] * len(seen)
        assert all(9 not in [e for e, _s in top] for top in tops)


def test_latest_reads_under_ingestion_never_go_back() -> None:
    """A reader beside a thread ingesting flat out: each latest count it reads is at
    least the one before (views are published in order), and once the writer's
    flush returned, latest shows everything."""
    with TidalDb.open(config=Config(half_life_ns=HOUR)) as db:
        n = 40
        done = threading.Event()

        def ingest() -> None:
            for i in range(n):
                db.signal_batch([Signal(u, 1, 1, 1.0) for u in range(i * 500, i * 500 + 500)])
            db.flush()
            done.set()

        t = threading.Thread(target=ingest)
        t.start()
        counts = []
        while not done.is_set():
            counts.append(db.read_window(COMMUNITY, 1, 1, consistency="latest").count)
            time.sleep(0)
        t.join()
        assert counts == sorted(counts)
        assert db.read_window(COMMUNITY, 1, 1, consistency="latest").count == n * 500


@pytest.mark.parametrize("bad", ["LATEST", "", 1, None.__class__])
def test_bad_consistency_is_refused_naming_the_field(bad: object) -> None:
    with TidalDb.open() as db:
        for call in (
            lambda: db.read_decay_score("red", 1, 1, consistency=bad),  # type: ignore[arg-type]
            lambda: db.read_window("red", 1, 1, consistency=bad),  # type: ignore[arg-type]
            lambda: db.top_entities("red", 1, 3, consistency=bad),  # type: ignore[arg-type]
        ):
            with pytest.raises(InvalidArgument) as err:
                call()
            assert err.value.field == "consistency" and err.value.value == bad
    with pytest.raises(InvalidArgument) as cerr:
        Config(read_consistency="eventual")
    assert cerr.value.field == "read_consistency"


def test_views_are_published_only_while_read() -> None:
    """Without reads a ledger shard publishes nothing (ingestion pays for no view); a
    read that finds no view is answered by the shard, which then publishes; once no
    read wanted a view for ``WANTED_S``, the next message the shard handles drops it
    and it publishes nothing more until a read wants one again."""
    with TidalDb.open(config=Config(half_life_ns=HOUR, ledger_shards=1)) as db:
        core = db._core
        led = core.ledgers[0]
        for i in range(5):
            db.signal_batch([Signal(u, 1, 1, 1.0) for u in range(i * 100, i * 100 + 100)])
        db.flush()
        assert led.publications == 0 and led.view is None
        first = core.read_window(COMMUNITY, 1, 1, consistency="latest")
        assert not isinstance(first, Answered)  # no view: the shard answers
        deadline = time.monotonic() + 10.0
        while not first.done and time.monotonic() < deadline:
            time.sleep(0.001)
        assert first.result().count == 500
        deadline = time.monotonic() + 10.0
        while led.view is None and time.monotonic() < deadline:
            time.sleep(0.001)  # it publishes after that read's message
        again = core.read_window(COMMUNITY, 1, 1, consistency="latest")
        assert isinstance(again, Answered) and again.result().count == 500
        time.sleep(WANTED_S * 2)  # nobody reads
        db.signal_batch([Signal(u, 1, 1, 1.0) for u in range(500, 600)])
        db.flush()
        assert led.view is None
        n = led.publications
        for i in range(6, 10):
            db.signal_batch([Signal(u, 1, 1, 1.0) for u in range(i * 100, i * 100 + 100)])
        db.flush()
        assert led.publications == n
        assert db.read_window(COMMUNITY, 1, 1, consistency="latest").count == 1000
