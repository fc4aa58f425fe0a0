"""A purge's erasure of the history computed off the persistence actor's thread
(``ctx.run_aside``, `actors.erasure`): writes commit meanwhile, every other message
waits for the erasure's commit and keeps its order, and the history read in slices
(`storage.history_slices`) is the history read whole.

The job here runs when the test says (a context whose ``run_aside`` only records
it), so the interleavings are exact; the records left on disk are counted by the
independent reader of ``_history_scan``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidal_actors import Config, ManualClock, Signal, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.actors.erasure import _Erased
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.reply import Reply
from tidal_actors.storage.format import Keyspace, cohorts_op
from tidal_actors.storage.lmdb_env import LmdbStore

from ._history_scan import history

T0 = 10**18
SHARD = (M.MEMBERSHIP, 0)


class _Job:
    def __init__(self, fn: Callable[[], Any], done: Callable[[Any], None]) -> None:
        self.fn, self.done = fn, done
        self.result: tuple[Any, BaseException | None] | None = None

    def run(self) -> None:
        try:
            self.result = (self.fn(), None)
        except Exception as exc:  # noqa: BLE001 - handed to wait()
            self.result = (None, exc)
        self.done(self)

    def wait(self) -> tuple[Any, BaseException | None]:
        if self.result is None:
            self.run()
        assert self.result is not None
        return self.result


class _Ctx:
    """Keeps every message told; ``run_aside`` records the job without running it."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.clock = ManualClock(T0)
        self.durable = True
        self.sent: list[tuple[M.Address, object]] = []
        self.jobs: list[_Job] = []

    def tell(self, address: M.Address, message: object) -> None:
        self.sent.append((address, message))

    def run_aside(self, fn: Callable[[], Any], done: Callable[[Any], None]) -> _Job:
        job = _Job(fn, done)
        self.jobs.append(job)
        return job


def _store_with_history(path: str, cfg: Config) -> None:
    """Users 1-4 in cohort ``a``, each with signals in several history batches; the
    database is left without a clean close's snapshot (the history is the record)."""
    db = TidalDb.open(path, config=cfg, clock=ManualClock(T0 + 10**12))
    for u in range(1, 5):
        db.assign_cohort(u, "a")
    for k in range(6):
        db.signal_batch([Signal(u, 100 + k, 1, 1.0, T0 + 10**9 * k + u) for u in range(1, 5)])
        db.flush()
    db.close()


def _records(path: str) -> dict[int, int]:
    """user -> records of cohort ``a`` in the durable history."""
    out: dict[int, int] = {}
    for records, _ in history(path).values():
        for cohort, user, *_ in records:
            if cohort == "a":
                out[user] = out.get(user, 0) + 1
    return out


def test_history_slices_read_the_history_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    cfg = Config(ledger_shards=2)
    _store_with_history(path, cfg)
    store = LmdbStore(path, cfg)
    try:
        whole = list(store.history_items())
        assert len(whole) >= 6
        for limit in (1, 2, 5, len(whole), len(whole) + 3):
            assert list(store.history_slices(limit)) == whole
        keys = [k for k, _ in whole]
        assert store.history_slice(keys[2], 2) == whole[3:5]
        assert store.history_slice(None, 1) == whole[:1]
        assert store.history_slice(keys[-1], 4) == []
    finally:
        store.close()


def test_writes_commit_while_an_erasure_is_computed_aside_and_the_rest_waits(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "s")
    cfg = Config(ledger_shards=2)
    _store_with_history(path, cfg)
    before = _records(path)
    assert before == {1: 6, 2: 6, 3: 6, 4: 6}
    ctx = _Ctx(cfg)
    store = LmdbStore(path, cfg)
    persistence = Persistence(ctx, store)  # type: ignore[arg-type]
    erased, flushed = Reply(), Reply()
    persistence.receive(M.EraseHistory("a", {1: 2**62}, [], erased))
    assert len(ctx.jobs) == 1 and not erased.done
    # a control write goes on while the erasure is computed
    op = cohorts_op(9, ("b",))
    persistence.receive(M.Write([op], (SHARD, 7), ahead=True))
    persistence.on_idle()
    assert [m for _, m in ctx.sent] == [M.Committed(7, None, ())]
    assert store.raw_get(Keyspace.USERS, op[1]) == op[2]
    # anything else waits for the erasure's commit
    persistence.receive(M.FlushStore(flushed))
    assert not flushed.done and not erased.done
    order: list[str] = []
    erased.add_done_callback(lambda r: order.append("erased"))
    flushed.add_done_callback(lambda r: order.append("flushed"))
    job = ctx.jobs[0]
    job.run()
    assert not erased.done  # the result comes back as a message to the actor
    address, done = ctx.sent[-1]
    assert address == M.PERSIST_ADDR and isinstance(done, _Erased)
    persistence.receive(done)
    assert order == ["erased", "flushed"]
    assert erased.result() is None and flushed.result() is None
    store.close()
    after = _records(path)
    assert after == {u: n for u, n in before.items() if u != 1}


def test_a_stopping_persistence_finishes_the_erasure_it_computes_aside(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    cfg = Config(ledger_shards=1)
    _store_with_history(path, cfg)
    before = _records(path)
    ctx = _Ctx(cfg)
    store = LmdbStore(path, cfg)
    persistence = Persistence(ctx, store)  # type: ignore[arg-type]
    erased, flushed = Reply(), Reply()
    persistence.receive(M.EraseHistory("a", {2: 2**62, 3: 2**62}, [], erased))
    persistence.receive(M.FlushStore(flushed))
    assert not erased.done and not flushed.done
    persistence.on_stop()
    assert erased.result() is None and flushed.result() is None
    store.close()
    assert _records(path) == {u: n for u, n in before.items() if u not in (2, 3)}
