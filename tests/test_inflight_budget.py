"""The load a mailbox holds is bounded by time (``Config.inflight_budget_ms``) as well
as by ``mailbox_capacity``; the facade sizes each shard's batches to the same budget;
the setting's forms. Values are worked out by hand from the units and per-unit costs
set here (nothing is timed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal_actors import Config, InvalidArgument, ManualClock, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.runtime.mailbox import Mailbox, units

from .conftest import T0


class _Env:
    def __init__(self, message: object) -> None:
        self.message = message


def batch(n: int) -> _Env:
    return _Env(M.SignalBatch([(1, 1, 1, 1.0, T0, None)] * n))


def test_units_of_each_kind_of_message() -> None:
    assert units(M.SignalBatch([(1, 1, 1, 1.0, T0, None)] * 7)) == 7
    assert units(M.Write([], None)) == 1  # a history write
    assert units(M.Write([], object())) == 0  # a control write: never held back
    assert units(M.Barrier((0,), 1, None)) == 0  # type: ignore[arg-type]


def test_the_budget_bounds_the_queued_load_in_time() -> None:
    box = Mailbox(capacity=64, budget_s=0.002)
    assert box.has_room()
    box.put(batch(100))
    assert box.has_room()  # not measured yet: only the capacity bounds it
    box.handled(100, 0.001)  # 10 µs a signal: 100 queued are 1 ms of work
    assert box.has_room()
    box.put(_Env("control"))  # not load; keeps the two batches apart (else one get takes both)
    box.put(batch(100))  # 200 signals: 2 ms, the budget
    assert not box.has_room()
    assert not box.offer(batch(1))
    box.get()  # 100 left: 1 ms
    assert box.has_room()
    box.handled(100, 0.003)  # 30 µs now: the moving average is 0.8 * 10 + 0.2 * 30 = 14 µs
    assert box.unit_s == pytest.approx(14e-6)
    box.force(batch(50))  # forced past the budget: 150 * 14 µs = 2.1 ms
    assert not box.has_room()


def test_one_message_always_fits_and_the_capacity_still_holds() -> None:
    box = Mailbox(capacity=2, budget_s=0.002)
    box.handled(1, 1.0)  # one second a signal: any signal is over the budget
    assert box.offer(batch(1000))  # an empty mailbox takes a message
    assert not box.has_room()
    unbounded = Mailbox(capacity=2, budget_s=None)
    unbounded.handled(1, 1.0)
    assert unbounded.offer(batch(1000)) and unbounded.offer(batch(1000))
    assert not unbounded.offer(batch(1))  # the capacity: 2 messages


def test_a_room_waiter_is_called_once_room_is_made() -> None:
    box = Mailbox(capacity=1, budget_s=None)
    calls: list[int] = []
    assert box.when_room(lambda: calls.append(0))  # room now: not registered
    box.put(batch(1))
    assert not box.when_room(lambda: calls.append(1))
    assert calls == []
    box.get()
    assert calls == [1]


def test_batches_are_sized_to_the_budget() -> None:
    cfg = Config(inflight_budget_ms=2.0, signal_batch_size=1024, rematerialize_after_ms=None)
    with TidalDb.open(None, config=cfg, clock=ManualClock(T0)) as db:
        core = db._core
        inbox = core.host._refs[(M.MEMBERSHIP, 0)].actor_inbox
        inbox.unit_s = 10e-6
        core._tune_batches()
        assert core._steps == [200]  # 2 ms / 10 µs
        inbox.unit_s = 1e-3
        core._tune_batches()
        assert core._steps == [64]  # the floor
        inbox.unit_s = 1e-7
        core._tune_batches()
        assert core._steps == [1024]  # the ceiling: signal_batch_size
    small = Config(inflight_budget_ms=2.0, signal_batch_size=8, rematerialize_after_ms=None)
    with TidalDb.open(None, config=small, clock=ManualClock(T0)) as db:
        core = db._core
        core.host._refs[(M.MEMBERSHIP, 0)].actor_inbox.unit_s = 1e-3
        core._tune_batches()
        assert core._steps == [8]  # never above signal_batch_size, even at the floor


def test_the_setting_forms(tmp_path: Path) -> None:
    assert Config(inflight_budget_ms="500us").inflight_budget_ms == 0.5
    assert Config(inflight_budget_ms=None).inflight_budget_ms is None
    toml = tmp_path / "c.toml"
    toml.write_text("[ingest]\ninflight_budget_ms = false\n")
    assert Config.from_toml(toml).inflight_budget_ms is None
    toml.write_text('[ingest]\ninflight_budget_ms = "250us"\n')
    assert Config.from_toml(toml).inflight_budget_ms == 0.25
    for bad in (0, -1.0, True, "x", 60_001):
        with pytest.raises(InvalidArgument) as info:
            Config(inflight_budget_ms=bad)
        assert info.value.field == "inflight_budget_ms"


def test_persistence_is_bounded_by_count_only() -> None:
    """A control write joins the history writes queued at persistence in the next
    transaction instead of waiting behind them, so only the other mailboxes are
    bounded by time."""
    with TidalDb.open(None, config=Config(inflight_budget_ms=3.0), clock=ManualClock(T0)) as db:
        refs = db._core.host._refs
        budgets = {address[0]: ref.actor_inbox._budget_s for address, ref in refs.items()}
    assert budgets == {
        "persistence": None,
        "coordinator": 0.003,
        "ledger": 0.003,
        "membership": 0.003,
    }
