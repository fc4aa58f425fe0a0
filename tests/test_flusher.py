"""The flusher thread: it sleeps while it has nothing to do and is woken by the work.

* with nothing buffered, no ledger shard's changes waiting and no rebuild due, it
  sleeps (no tick runs);
* the first signal buffered wakes it, and it sends the signal on;
* a ledger shard whose changes wait for a `Publish` wakes it (`wake_ticker`).

Expected scores come from the reference model.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tidal_actors import Config, ManualClock, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.testing import ReferenceModel

from .conftest import T0

SEC = 10**9
CFG = Config(ledger_shards=1, membership_shards=1)


def _until(cond: Callable[[], bool], limit_s: float = 10.0) -> bool:
    """Poll ``cond`` until it holds or ``limit_s`` seconds passed; whether it holds."""
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def test_the_flusher_sleeps_until_a_signal_is_buffered() -> None:
    with TidalDb.open(None, config=CFG, clock=ManualClock(T0)) as db:
        core = db._core
        db.assign_cohort(1, "red")
        assert _until(lambda: core._flusher_asleep)
        ticks: list[int] = []
        tune = core._tune_batches

        def counted() -> None:
            ticks.append(1)
            tune()

        core._tune_batches = counted  # type: ignore[method-assign]
        time.sleep(0.05)  # 25 flush intervals: asleep, it runs none
        assert ticks == []
        db.signal_with_context(1, 7, 1, 2.0, T0 - SEC)  # buffered: wakes it
        assert _until(lambda: not core._buffers[0].items)  # sent on by the flusher
        assert ticks
        model = ReferenceModel(CFG, ManualClock(T0))
        model.assign_cohort(1, "red")
        model.signal_with_context(1, 7, 1, 2.0, T0 - SEC)
        want = model.read_decay_score("red", 7, 1, T0)
        assert db.read_decay_score("red", 7, 1, T0) == want
        assert _until(lambda: core._flusher_asleep)  # nothing left to do: asleep again


class _Ctx:
    """A host context whose `wake_ticker` counts its calls."""

    def __init__(self) -> None:
        self.config = CFG
        self.clock = ManualClock(T0)
        self.durable = False
        self.publish_every_s = 0.005
        self.woken = 0

    def tell(self, address: object, message: object) -> None:
        pass

    def wake_ticker(self) -> None:
        self.woken += 1


def test_a_ledger_shard_with_changes_waiting_wakes_the_flusher() -> None:
    ctx = _Ctx()
    shard = LedgerShard(ctx, 0)
    shard.wanted = time.monotonic()  # a reader wants its view
    shard.receive(M.Publish())  # publishes its first view
    assert shard.view is not None and ctx.woken == 0
    shard._published_at = time.monotonic() + 60  # the next changes must wait
    shard._dirty_all = True  # changes noted since
    shard.on_idle()
    assert shard.unpublished and ctx.woken == 1  # waits for a `Publish`: wakes it
    shard.on_idle()
    assert ctx.woken == 1  # once, when the changes start waiting
