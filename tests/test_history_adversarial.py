"""Adversarial review of a ledger's history reads from its own environment and of the
purges' tombstones it holds (`HistoryReader.hold_tombstones`, `ShardedStore.own_history`).

The claim (docs/cluster.md, "What a ledger's process reads beyond its own
environment"): the held tombstones equal the store's wherever a read back needs them.
Attacked here with the deterministic harness (purges, rebuilds and settled reads
interleaved message by message, ledgers crashed at random steps: between a purge's
commit and its retraction, during a rebuild), run twice on the same schedule, once with
the tombstones held and once read from the store (the earlier path): every answer must
be the same, the final state the reference model's, and at every pause each settled,
tombstoned record of a ledger's history must be among its held tombstones. Then with
the pykka host: a store reopened under another ledger count and back, compacted
between purges, and opened read-only, against the reference model and the
whole-store path.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.storage.format import Keyspace, Tag, decode_tombstone
from tidal_actors.storage.history import HistoryReader
from tidal_actors.testing import Harness, ReferenceModel

from ._differential import Blocking, Recorder, lost_of, rows_mismatch
from .conftest import SEC, T0

COHORTS = ["a", "b", "c", "d", "e"]
USERS = 10


def _cfg(layout: str, ledgers: int = 3) -> Config:
    return Config(
        half_life_ns=30 * SEC,
        window_width_ns=10 * SEC,
        window_buckets=4,
        max_contribution_log_entries=10,  # most records settle: read back from the history
        membership_shards=2,
        ledger_shards=ledgers,
        store_layout=layout,
        rematerialize_after_ms=None,
    )


def _store_tombstones(store: Any) -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for key, value in store.scan(Keyspace.ITEMS):
        if key[9] == Tag.PURGE_TOMBSTONE:
            out.update(decode_tombstone(value))
    return out


def _missing_needed(h: Harness) -> list[tuple[int, int, int]]:
    """``(ledger, mshard, rseq)`` of each record of a ledger's history (the batches
    listed under its own key) that the store tombstones, that the ledger has settled
    (rseq below its membership shard's bound), and that the ledger's held tombstones
    lack: a read back would count it."""
    store = h.core.store
    in_store = _store_tombstones(store)
    bad: list[tuple[int, int, int]] = []
    for i in range(h.core.config.ledger_shards):
        state = h.behaviour((M.LEDGER, i)).state  # type: ignore[attr-defined]
        reader = state.history
        if not isinstance(reader, HistoryReader) or reader._held is None:
            continue
        held = reader.tombstones()
        upto = state.aggregates.settled_upto
        whole = HistoryReader(store, i, whole=True)
        for b in whole.batches(whole.batch_keys()):
            if b.shard != i:
                continue
            for m, r in zip(b.m.tolist(), b.r.tolist()):
                needed = (m, r) in in_store and r < upto.get(m, 0)
                if needed and not np.isin(r, held.get(m, np.zeros(0, dtype=np.int64))):
                    bad.append((i, m, r))
    return bad


def _answer(call: Any) -> Any:
    """A call's result in a comparable form, or its error's type name."""
    try:
        value = call.result()
    except Exception as exc:  # noqa: BLE001 - the error is the answer compared
        return type(exc).__name__
    if isinstance(value, list):
        return sorted(value)
    if hasattr(value, "records_read"):
        return (value.records_read, value.records_excluded, value.matched_live)
    if isinstance(value, tuple) and len(value) == 2 and hasattr(value[1], "entries"):
        return (len(value[1].entries), value[1].evicted)
    return value


def _answer_now(h: Harness, call: Any) -> Any:
    """``call`` run to its end, its answer (`_answer`)."""
    h.run_until_idle()
    return _answer(call)


def _harness_run(
    path: str,
    layout: str,
    seed: int,
    crash: float = 0.35,
    remat: float = 0.5,
    final: bool = True,
    membership: bool = False,
) -> tuple[list[Any], int]:
    """Rounds of signals, purges, rebuilds and settled reads submitted together, the
    harness stepped a random count, a ledger crashed at random, the rest delivered;
    the answers in order and the number of crashes. At each pause the held
    tombstones cover what a read back needs; at the end the rows equal the reference
    model's, before and after a reopen."""
    cfg = _cfg(layout)
    h = Harness(seed=seed, config=cfg, store=f"lmdb:{path}")
    rng = random.Random(seed)
    rec = Recorder(h)
    t0 = h.clock.now_ns()
    reads = [t0 + k * SEC for k in (-3, 5, 14, 27)]
    for u in range(USERS):
        for c in rng.sample(COHORTS, 2):
            h.run(rec.assign_cohort(u, c))
    answers: list[Any] = []
    crashes = 0
    lost: set[tuple[int, int]] = set()  # (user, ts) of the signals a crash lost
    for _ in range(24):
        calls = []
        for _ in range(rng.randrange(8, 20)):
            rec.signal_with_context(
                rng.randrange(USERS),
                rng.randrange(4),
                rng.randrange(2),
                rng.choice([0.5, 1.0, 2.0]),
                t0 + rng.randrange(-5, 35) * SEC + len(rec.ops),  # (user, ts) unique
            )
        calls.append(rec.flush())
        for _ in range(rng.randrange(0, 3)):
            calls.append(
                rec.request_community_purge(rng.randrange(USERS), rng.choice([*COHORTS, COMMUNITY]))
            )
        if rng.random() < remat:
            calls.append(rec.rematerialize(rng.choice(COHORTS)))
        calls.append(h.aggregate_rows(rng.choice(reads)))
        for _ in range(rng.randrange(0, 80)):
            h.step()
        if rng.random() < crash:
            if membership and rng.random() < 0.5:
                lost |= lost_of(h.crash_shard((M.MEMBERSHIP, rng.randrange(2))))
            else:
                h.crash_shard((M.LEDGER, rng.randrange(cfg.ledger_shards)))
            crashes += 1
        h.run_until_idle()
        answers.extend(_answer(c) for c in calls)
        assert _missing_needed(h) == []
        for t in reads:
            answers.append(sorted(h.run(h.aggregate_rows(t))))
    for c in COHORTS if final else ():
        answers.append(_answer_now(h, rec.rematerialize(c)))
    model = rec.model(
        cfg, skip=lambda name, args: name == "signal_with_context" and (args[0], args[4]) in lost
    )
    db = Blocking(h)
    for t in reads:
        bad = rows_mismatch(db.aggregate_rows(t), model.aggregate_rows(t))
        assert bad is None, (t, bad)
    h.close_and_reopen()
    for t in reads:
        bad = rows_mismatch(db.aggregate_rows(t), model.aggregate_rows(t))
        assert bad is None, ("after reopen", t, bad)
    h.close()
    return answers, crashes


@pytest.mark.parametrize(
    ("layout", "seed", "membership"),
    [("shards", 1, False), ("shards", 2, False), ("single", 3, False), ("shards", 7, True)],
)
def test_held_tombstones_under_crashes_read_as_the_stores(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settle_at_once: None,
    layout: str,
    seed: int,
    membership: bool,
) -> None:
    """With ``membership``, membership shards crash too (their signals in flight lost,
    numbering resumed above what the ledgers hold: a tombstone never names a new
    record)."""
    run = _harness_run
    kw: dict[str, Any] = {"crash": 0.5, "membership": True} if membership else {}
    held, crashes = run(str(tmp_path / "held"), layout, seed, **kw)
    assert crashes  # the seed crashes shards
    monkeypatch.setattr(HistoryReader, "hold_tombstones", lambda self, pairs: None)
    scanned, _ = run(str(tmp_path / "scan"), layout, seed, **kw)
    assert len(held) == len(scanned)
    for i, (a, b) in enumerate(zip(held, scanned)):
        if isinstance(a, list) and a and isinstance(a[0], tuple) and len(a[0]) == 6:
            assert rows_mismatch(a, b) is None, i
        else:
            assert a == b, i


# -- the pykka host: ledger counts changed and back, compaction, read-only opens --------


def _phase(db: Any, ref: ReferenceModel, rng: random.Random, steps: int) -> None:
    """Signals (a flush every few), purges, a compaction and a rebuild drawn from
    ``rng``, on ``db`` and ``ref`` alike; the rows at settled times checked between."""
    for step in range(steps):
        args = (
            rng.randrange(USERS),
            rng.randrange(4),
            rng.randrange(2),
            rng.choice([0.5, 1.0, 2.0]),
            T0 + rng.randrange(-5, 35) * SEC,
        )
        db.signal_with_context(*args)
        ref.signal_with_context(*args)
        if step % 4 == 3:
            db.flush()
        if rng.random() < 0.06:
            u, c = rng.randrange(USERS), rng.choice([*COHORTS, COMMUNITY])
            _, m = db.request_community_purge(u, c)
            _, rm = ref.request_community_purge(u, c)
            assert (len(m.entries), m.evicted) == (len(rm.entries), rm.evicted)
        if step % 50 == 49:
            db.flush()
            if rng.random() < 0.5:
                db.compact()
            c = rng.choice([*COHORTS, COMMUNITY])
            db.rematerialize(c)
            ref.rematerialize(c)
            _check_rows(db, ref, f"step {step}")
    db.flush()


READ_AT = [T0 + k * SEC for k in (-3, 5, 14, 27, 36)]


def _check_rows(db: Any, ref: ReferenceModel, where: str) -> None:
    for t in READ_AT:
        bad = rows_mismatch(db.aggregate_rows(t), ref.aggregate_rows(t))
        assert bad is None, (where, t, bad)


def _held_and_store(db: Any) -> tuple[list[set[tuple[int, int]]], set[tuple[int, int]]]:
    """Each ledger's held tombstones, and the store's."""
    held = []
    for ls in db._core.ledgers:
        reader = ls.state.history
        assert isinstance(reader, HistoryReader) and reader._held is not None
        held.append({(m, int(r)) for m, rs in reader.tombstones().items() for r in rs})
    return held, _store_tombstones(db._core.store)


@pytest.mark.parametrize(("layout", "counts"), [("shards", (3, 2, 3)), ("single", (3, 4, 3))])
def test_ledger_counts_changed_and_back_with_purges_and_compactions(
    tmp_path: Path, settle_at_once: None, layout: str, counts: tuple[int, ...]
) -> None:
    """A store written under 3 ledgers, reopened under another count, then under 3
    again (its history no longer self-contained), purges, compactions and rebuilds in
    each phase: the rows at settled times are the reference model's throughout, in a
    read-only open at the end too; the ledgers' held tombstones together are the
    store's at every close."""
    rng = random.Random(11)
    path = str(tmp_path / "db")
    ref = ReferenceModel(_cfg(layout), ManualClock(T0), history=True)
    for phase, n in enumerate(counts):
        cfg = _cfg(layout, n)
        with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
            if phase == 0:
                for u in range(USERS):
                    for c in rng.sample(COHORTS, 2):
                        db.assign_cohort(u, c)
                        ref.assign_cohort(u, c)
            _check_rows(db, ref, f"phase {phase} open")
            _phase(db, ref, rng, 240)
            for c in [*COHORTS, COMMUNITY]:
                db.rematerialize(c)
                ref.rematerialize(c)
            _check_rows(db, ref, f"phase {phase} rebuilt")
            held, in_store = _held_and_store(db)
            assert set().union(*held) == in_store
            assert in_store
    with TidalDb.open(path, config=_cfg(layout, counts[-1]), read_only=True) as ro:
        _check_rows(ro, ref, "read-only")


def _split_pair() -> tuple[str, str]:
    """Cohorts X, Y on one ledger of 2 and on two ledgers of 3, Y's being the same
    number (its rebuild reads its old keys as its own) and not @community's (so Y's
    ledger of 3 holds Y's records alone)."""
    from tidal_actors.storage.format import ledger_shard_of

    names = [f"c{i}" for i in range(200)]
    com = ledger_shard_of(COMMUNITY, 3)
    for x in names:
        for y in names:
            if (
                ledger_shard_of(x, 2) == ledger_shard_of(y, 2)
                and ledger_shard_of(x, 3) != ledger_shard_of(y, 3)
                and ledger_shard_of(y, 3) not in (com, ledger_shard_of(x, 3))
                and ledger_shard_of(y, 3) == ledger_shard_of(y, 2)
            ):
                return x, y
    raise AssertionError("no such cohorts")


@pytest.mark.parametrize("layout", ["shards", "single"])
def test_settled_reads_of_a_store_reopened_under_another_ledger_count_read_every_batch(
    tmp_path: Path, settle_at_once: None, layout: str
) -> None:
    """Written under 2 ledgers, X's and Y's records share ledger 0's history keys;
    under 3, Y's ledger reads them (the whole store: not self-contained). Y's records
    of user 1 (membership shard 1), then 140 batches of X's records of user 0
    (membership shard 0) alone, then Y's again: Y's ledger has settled nothing of
    membership shard 0, so each batch of X's is 'past every settled record' by the
    rule of a self-contained history (`HistoryReader.past_settled`: no settled record,
    none tombstoned) and the read stopped there, a chunk of 64 batches in: Y's later
    settled records were missed by the reads inside their buckets and by the
    rebuild. Every batch of another ledger's key may hold them: the rows must be the
    reference model's."""
    from tidal_actors.storage.format import membership_shard_of

    x, y = _split_pair()
    assert [membership_shard_of(u, 2) for u in (0, 1)] == [0, 1]
    path = str(tmp_path / "db")
    ref = ReferenceModel(_cfg(layout, 2), ManualClock(T0), history=True)
    cfg2 = _cfg(layout, 2).replace(max_contribution_log_entries=4)

    def sig(db: Any, *args: Any) -> None:
        db.signal_with_context(*args)
        ref.signal_with_context(*args)

    with TidalDb.open(path, config=cfg2, clock=ManualClock(T0)) as db:
        for u, c in ((0, x), (1, y)):
            db.assign_cohort(u, c)
            ref.assign_cohort(u, c)
        for i in range(3):
            sig(db, 1, 7, 0, 1.0, T0 - 35 * SEC + i)
        db.flush()
        for k in range(140):  # X's alone, one batch each
            sig(db, 0, 8, 0, 1.0, T0 - 35 * SEC + k)
            db.flush()
        for i in range(3):
            sig(db, 1, 7, 0, 2.0, T0 - 25 * SEC + i)
        db.flush()
        for i in range(6):  # Y's latest: the ones before leave the log
            sig(db, 1, 9, 0, 1.0, T0 + i)
        db.flush()
    reads = [T0 - 35 * SEC + 1, T0 - 25 * SEC + 1, T0 + 2, T0 + 5 * SEC]
    shutil.copytree(path, tmp_path / "copy")
    cfg3 = cfg2.replace(ledger_shards=3)
    with TidalDb.open(str(tmp_path / "copy"), config=cfg3, clock=ManualClock(T0)) as db:
        # the rebuild reads each of Y's records once: 3 + 3 + 6, settled or held
        assert db.rematerialize(y).records_read == 12
    with TidalDb.open(path, config=cfg3, clock=ManualClock(T0)) as db:
        for t in reads:
            bad = rows_mismatch(db.aggregate_rows(t), ref.aggregate_rows(t))
            assert bad is None, (t, bad)
        db.rematerialize(y)
        ref.rematerialize(y)
        for t in reads:
            bad = rows_mismatch(db.aggregate_rows(t), ref.aggregate_rows(t))
            assert bad is None, ("rebuilt", t, bad)
