"""The serving reads' fast path (`runtime.serving`: ``<read>_now`` answering from a
published view without a `Call`, the checks inlined) against the slow path (the
ledger shard's own read, `Serving._serve`) and the reference model, through the
blocking facade and under trio and asyncio; its validation against the checks of
`core.validate`; the read time it takes from the clock; and read-your-writes,
closing and wrong-thread errors on it."""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio

from tidal_actors import (
    COMMUNITY,
    Config,
    DatabaseClosed,
    InvalidArgument,
    ManualClock,
    Signal,
    TidalDb,
    WrongThread,
)
from tidal_actors.core.validate import check_id, check_k, check_timestamp
from tidal_actors.facades.aio import AsyncTidalDb, open_tidal
from tidal_actors.runtime.call import Call
from tidal_actors.testing import ReferenceModel

from .conftest import HOUR, MIN, T0

CFG = Config(half_life_ns=HOUR, window_width_ns=10 * MIN, window_buckets=6, ledger_shards=2)
COHORTS = ("red", "blue", COMMUNITY)
ENTITIES = (0, 1, 7, 2**44 - 1, 2**44, 2**64 - 1)  # narrow key codes and tuple ones
TYPES = (0, 3, 63, 64)  # 64: a type too wide for a narrow key code


def _load(db: TidalDb, model: ReferenceModel, seed: int) -> None:
    """The same assignments and signals into ``db`` and ``model`` (stamped before T0)."""
    rnd = random.Random(seed)
    for u in range(1, 9):
        for c in ("red", "blue")[: 1 + u % 2]:
            db.assign_cohort(u, c)
            model.assign_cohort(u, c)
    signals = [
        Signal(
            rnd.randrange(1, 9),
            rnd.choice(ENTITIES),
            rnd.choice(TYPES),
            rnd.choice((0.5, 1.0, 2.25, 3.0)),
            T0 - rnd.randrange(1, 2 * HOUR),
        )
        for _ in range(400)
    ]
    db.signal_batch(signals)
    model.signal_batch(signals)
    db.flush()


def _shard_read(db: TidalDb, name: str, kind: str, cohort: str, *args: Any) -> Any:
    """The slow path: the read sent to the cohort's ledger shard, answered from its state."""
    core = db._core
    _c, li = core._read_cohort(cohort)
    finish: Callable[[Any], Any] | None = None
    if kind == "window":
        finish = lambda v: tuple(v)  # noqa: E731
    return db._run(core._serve(name, li, kind, (cohort, *args), "latest", finish))


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("seed", [1, 2])
def test_view_answers_equal_the_shards_read_and_the_model(seed: int) -> None:
    """Every key's score and window and every top-k, at the clock's now and at given
    times: the fast path's answer (no `Call`) is bit for bit the shard's own read,
    and equals the reference model's."""
    clock = ManualClock(T0)
    model = ReferenceModel(config=CFG, clock=ManualClock(T0))
    with TidalDb.open(config=CFG, clock=clock) as db:
        _load(db, model, seed)
        core = db._core
        db.read_decay_score("red", 0, 0)  # wants a view: the shards publish one
        db.flush()
        fast = 0
        for at in (None, T0 + 5 * MIN, T0 + 3 * HOUR):
            at_model = T0 if at is None else at
            for c in COHORTS:
                for t in TYPES:
                    for e in ENTITIES:
                        now = core.read_decay_score_now(c, e, t, at)
                        fast += not isinstance(now, Call)
                        got = db.read_decay_score(c, e, t, at)
                        assert got == _shard_read(
                            db, "read_decay_score", "score", c, e, t, T0 if at is None else at
                        )
                        assert _close(got, model.read_decay_score(c, e, t, at_model))
                        win = db.read_window(c, e, t, at)
                        assert tuple(win) == _shard_read(
                            db, "read_window", "window", c, e, t, at_model
                        )
                        assert tuple(win) == tuple(model.read_window(c, e, t, at_model))
                    for k in (1, 3, 10):
                        top = db.top_entities(c, t, k, at)
                        assert top == _shard_read(db, "top_entities", "top", c, t, k, at_model)
                        assert _close(top, model.top_entities(c, t, k, at_model))
        assert fast > 0.9 * 3 * len(COHORTS) * len(TYPES) * len(ENTITIES)


def _awaited(loop: str, fn: Callable[[AsyncTidalDb], Any]) -> Any:
    async def body() -> Any:
        async with open_tidal(config=CFG, clock=ManualClock(T0)) as db:
            return await fn(db)

    return asyncio.run(body()) if loop == "asyncio" else trio.run(body)


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_awaited_reads_from_views_equal_blocking_reads_and_do_not_park(loop: str) -> None:
    """The same store read blocking and awaited: equal answers; the awaited reads a
    view answers never reach the waiting logic (``_run``)."""
    signals = [Signal(u, e, 1, 1.0 + e, T0 - e * MIN) for u in (1, 2) for e in range(20)]
    keys = [(c, e, 1) for c in ("red", COMMUNITY) for e in range(22)]

    async def reads(db: AsyncTidalDb) -> tuple[list[object], int]:
        for u in (1, 2):
            await db.assign_cohort(u, "red")
        await db.signal_batch(signals)
        await db.flush()
        await db.read_decay_score("red", 0, 1)  # wants a view
        await db.flush()
        runs = 0
        run = db._run

        async def counted(call: Call[Any]) -> Any:
            nonlocal runs
            runs += 1
            return await run(call)

        db._run = counted  # type: ignore[method-assign]
        out: list[object] = [await db.read_decay_score(*k) for k in keys]
        out += [tuple(await db.read_window(*k)) for k in keys]
        out += [await db.top_entities(c, 1, 5) for c in ("red", COMMUNITY)]
        return out, runs

    got, runs = _awaited(loop, reads)
    assert runs == 0
    with TidalDb.open(config=CFG, clock=ManualClock(T0)) as db:
        for u in (1, 2):
            db.assign_cohort(u, "red")
        db.signal_batch(signals)
        db.flush()
        want: list[object] = [db.read_decay_score(*k) for k in keys]
        want += [tuple(db.read_window(*k)) for k in keys]
        want += [db.top_entities(c, 1, 5) for c in ("red", COMMUNITY)]
    assert got == want
    # by hand: user 1's and user 2's signal of entity 3 (weight 4.0 each, 3 minutes
    # before the read), in "red" as in @community
    assert got[3] == 2 * 4.0 * 2.0 ** (-3 * MIN / HOUR)


BAD_IDS = [-1, 2**64, True, 1.5, "7", None]


def _error(check: Callable[[], object]) -> tuple[str, object, str]:
    with pytest.raises(InvalidArgument) as err:
        check()
    return err.value.field, err.value.value, str(err.value)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_fast_path_validation_names_field_and_value_as_the_checks_do(bad: object) -> None:
    """With the cohort known (the fast path's dict lookup) each bad argument raises
    what `core.validate`'s check raises, in argument order, blocking and awaited."""
    ok_at = T0
    cases: list[tuple[str, tuple[object, ...], Callable[[], object]]] = [
        ("read_decay_score", ("red", bad, 1), lambda: check_id("entity_id", bad)),
        ("read_decay_score", ("red", bad, bad), lambda: check_id("entity_id", bad)),
        ("read_decay_score", ("red", 1, bad), lambda: check_id("signal_type", bad)),
        ("read_window", ("red", bad, 1), lambda: check_id("entity_id", bad)),
        ("read_window", ("red", 1, bad), lambda: check_id("signal_type", bad)),
        ("top_entities", ("red", bad, 3), lambda: check_id("signal_type", bad)),
        ("top_entities", ("red", 1, bad), lambda: check_k(bad)),
    ]
    if bad is not None:  # None is a valid read time
        cases.append(
            ("read_decay_score", ("red", 1, 1, bad), lambda: check_timestamp("at_ns", bad))
        )
        cases.append(("top_entities", ("red", 1, 3, bad), lambda: check_timestamp("at_ns", bad)))
    with TidalDb.open(config=CFG, clock=ManualClock(T0)) as db:
        db.read_decay_score("red", 1, 1, ok_at)  # the cohort is now known
        for name, args, check in cases:
            assert _error(lambda n=name, a=args: getattr(db, n)(*a)) == _error(check)

    async def awaited(db: AsyncTidalDb) -> list[tuple[str, object, str]]:
        await db.read_decay_score("red", 1, 1)
        out = []
        for name, args, _check in cases:
            try:
                await getattr(db, name)(*args)
            except InvalidArgument as e:
                out.append((e.field, e.value, str(e)))
        return out

    want = [_error(check) for _n, _a, check in cases]
    assert _awaited("trio", awaited) == want
    assert _awaited("asyncio", awaited) == want


def test_bad_cohort_and_consistency_on_the_fast_path() -> None:
    with TidalDb.open(config=CFG) as db:
        db.read_decay_score("red", 1, 1)
        for bad in ("", "@other", 5):
            assert _error(lambda b=bad: db.read_decay_score(b, 1, 1))[:2] == ("cohort", bad)  # type: ignore[arg-type]
        assert _error(lambda: db.read_decay_score("red", 1, 1, None, "x"))[:2] == (
            "consistency",
            "x",
        )
        assert _error(lambda: db.read_decay_score("red", -1, 1, None, "x"))[0] == "entity_id"


def test_the_read_time_is_the_clocks_now() -> None:
    """A manual clock: the score decays exactly as the clock moves (by hand: one
    contribution of 2.0, half-life an hour). The system clock: the score lies
    between the ones at the times read just before and just after."""
    clock = ManualClock(T0)
    with TidalDb.open(config=CFG, clock=clock) as db:
        db.assign_cohort(1, "red")
        db.signal_with_context(1, 5, 1, 2.0, T0)
        db.flush()
        for _ in range(2):  # the second read answers from the view
            assert db.read_decay_score("red", 5, 1) == 2.0
        clock.advance(HOUR)
        assert db.read_decay_score("red", 5, 1) == 1.0
        clock.advance(2 * HOUR)
        assert db.read_decay_score("red", 5, 1) == 0.25  # three hours: 2.0 / 2**3
    with TidalDb.open(config=CFG) as db:
        ts = time.time_ns() - HOUR
        db.assign_cohort(1, "red")
        db.signal_with_context(1, 5, 1, 2.0, ts)
        db.flush()
        for _ in range(3):
            before = time.time_ns()
            got = db.read_decay_score("red", 5, 1)
            after = time.time_ns()
            assert (
                2.0 * 2.0 ** (-(after - ts) / HOUR) <= got <= 2.0 * 2.0 ** (-(before - ts) / HOUR)
            )


def test_a_caller_with_writes_in_flight_is_not_answered_from_the_view() -> None:
    """A view exists and answers other callers; the writing thread's read waits for
    its own signal (by hand: 1.0 + 3.0 at the read time), another thread's read at
    the same moment may not see it, and after the flush every read does."""
    clock = ManualClock(T0)
    with TidalDb.open(config=CFG, clock=clock) as db:
        db.assign_cohort(1, "red")
        db.signal_with_context(1, 5, 1, 1.0, T0)
        db.flush()
        assert db.read_decay_score("red", 5, 1) == 1.0
        db.flush()  # the view is published
        assert not isinstance(db._core.read_decay_score_now("red", 5, 1), Call)
        db.signal_with_context(1, 5, 1, 3.0, T0)
        assert isinstance(db._core.read_decay_score_now("red", 5, 1), Call)
        other: list[float] = []
        t = threading.Thread(target=lambda: other.append(db.read_decay_score("red", 5, 1)))
        t.start()
        t.join()
        assert other[0] in (1.0, 4.0)
        assert db.read_decay_score("red", 5, 1) == 4.0
        assert db.read_decay_score("red", 5, 1, consistency="latest") == 4.0


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_fast_path_errors_after_close_and_from_another_thread(loop: str) -> None:
    kept: list[AsyncTidalDb] = []
    errors: list[BaseException] = []

    async def body() -> None:
        async with open_tidal(config=CFG) as db:
            await db.read_decay_score("red", 1, 1)
            kept.append(db)

            def other() -> None:
                try:
                    coro = db.read_decay_score("red", 1, 1)
                    coro.send(None)
                except BaseException as e:  # noqa: BLE001 - the error under test
                    errors.append(e)

            t = threading.Thread(target=other)
            t.start()
            t.join()
        try:
            await kept[0].read_decay_score("red", 1, 1)
        except BaseException as e:  # noqa: BLE001 - the error under test
            errors.append(e)

    asyncio.run(body()) if loop == "asyncio" else trio.run(body)
    assert [type(e) for e in errors] == [WrongThread, DatabaseClosed]
    with TidalDb.open(config=CFG) as db:
        db.read_decay_score("red", 1, 1)
    with pytest.raises(DatabaseClosed):
        db.read_decay_score("red", 1, 1)


def test_each_read_counts_in_the_shards_reads_and_is_noted_when_seen() -> None:
    """A read that wants a view adds one to its shard's ``reads`` (no clock read); the
    shard, or the flusher thread through ``unread``, notes the time it sees them
    move, and a view nobody wanted for ``WANTED_S`` since is unread."""
    from tidal_actors.actors.ledger_views import WANTED_S

    with TidalDb.open(config=CFG.replace(ledger_shards=1)) as db:
        led = db._core.ledgers[0]
        db.read_decay_score("red", 1, 1)
        db.flush()  # the view is published
        before = led.reads
        t0 = time.monotonic()
        for _ in range(5):
            db.read_decay_score("red", 1, 1, consistency="latest")
        assert led.reads == before + 5
        now = time.monotonic()
        assert not led.unread(now)
        assert t0 <= led.wanted <= now  # noted here, or by the flusher thread's look
        assert led.unread(led.wanted + WANTED_S + 0.1)  # no read since
        t1 = time.monotonic()
        db.read_window("red", 1, 1)
        assert led.reads == before + 6
        assert not led.unread(time.monotonic() + WANTED_S / 2)
        assert t1 <= led.wanted  # a look after the read noted it
