"""A ledger's history read from its own environment alone (`HistoryReader`,
`ShardedStore.own_history`) gives what the read of every history key of the store
gives, on seeded random stores of both layouts, and on a ``shards`` store reopened
under another ledger count (where the own environment does not hold a ledger's whole
history, so the whole store is read).

Each store is written once (the same operations on a `ReferenceModel`), copied, and
each copy opened with one path: the reads inside settled buckets
(`HistoryReader.settled_detail`, through ``aggregate_rows``) and a rebuild of every
cohort (`RematJob`) must give the same rows and reports under both paths, and the
rows the model computes.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, TidalDb
from tidal_actors.storage.history import HistoryReader
from tidal_actors.storage.sharded import ShardedStore
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from .conftest import SEC, T0

COHORTS = ["a", "b", "c", "d", "e", "f"]
USERS = 24
READ_AT = [T0 + k * SEC for k in (-2, 4, 10, 17, 26, 38)]


def _cfg(layout: str, ledgers: int) -> Config:
    return Config(
        half_life_ns=30 * SEC,
        window_width_ns=10 * SEC,
        window_buckets=4,
        max_contribution_log_entries=12,  # most records settle: their detail is read back
        membership_shards=2,
        ledger_shards=ledgers,
        store_layout=layout,
        rematerialize_after_ms=None,
    )


def _workload(db: Any, ref: ReferenceModel, rng: random.Random, steps: int) -> None:
    """Cohort assignments, signals (a flush every few: many history batches) and purges
    drawn from ``rng``, on ``db`` and ``ref`` alike."""
    for u in range(USERS):
        for c in rng.sample(COHORTS, rng.randint(1, 2)):
            db.assign_cohort(u, c)
            ref.assign_cohort(u, c)
    for step in range(steps):
        args = (
            rng.randrange(USERS),
            rng.randrange(6),
            rng.randrange(2),
            rng.choice([0.5, 1.0, 2.0]),
            T0 + rng.randrange(-5, 40) * SEC,
        )
        db.signal_with_context(*args)
        ref.signal_with_context(*args)
        if step % 5 == 4:
            db.flush()
        if rng.random() < 0.04:
            u, c = rng.randrange(USERS), rng.choice([*COHORTS, COMMUNITY])
            _, m = db.request_community_purge(u, c)
            _, rm = ref.request_community_purge(u, c)
            assert (m.entries, m.evicted) == (rm.entries, rm.evicted)
    db.flush()


def _observe(path: str, cfg: Config) -> dict[str, Any]:
    """Rows at each of READ_AT, then each cohort's rebuild report and the rows after."""
    out: dict[str, Any] = {}
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        for t in READ_AT:
            out[f"rows@{t}"] = sorted(db.aggregate_rows(t))
        for c in [*COHORTS, COMMUNITY]:
            r = db.rematerialize(c)
            out[f"remat {c}"] = (r.records_read, r.records_excluded, r.matched_live)
        for t in READ_AT:
            out[f"after@{t}"] = sorted(db.aggregate_rows(t))
    return out


@pytest.mark.parametrize(
    ("layout", "reshard", "seed"),
    [
        ("shards", None, 1),
        ("shards", None, 2),
        ("shards", 3, 3),  # reopened under 3 ledgers: not self-contained
        ("single", None, 4),
        ("single", 2, 5),
    ],
)
def test_own_environment_reads_equal_whole_store_reads(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settle_at_once: None,
    layout: str,
    reshard: int | None,
    seed: int,
) -> None:
    rng = random.Random(seed)
    ref = ReferenceModel(_cfg(layout, 4), ManualClock(T0), history=True)
    src = str(tmp_path / "src")
    cfg = _cfg(layout, 4)
    with TidalDb.open(src, config=cfg, clock=ManualClock(T0)) as db:
        _workload(db, ref, rng, 260)
    if reshard is not None:
        cfg = _cfg(layout, reshard)
        with TidalDb.open(src, config=cfg, clock=ManualClock(T0)) as db:
            _workload(db, ref, rng, 160)  # cohorts' records now under other ledgers' keys
    expected = {t: ref.aggregate_rows(t) for t in READ_AT}

    own_envs: list[bool] = []
    real = ShardedStore.own_history

    def spied(self: ShardedStore, shard: int) -> Any:
        env = real(self, shard)
        own_envs.append(env is not None)
        return env

    monkeypatch.setattr(ShardedStore, "own_history", spied)
    shutil.copytree(src, tmp_path / "own")
    own = _observe(str(tmp_path / "own"), cfg)
    took_own = any(own_envs)
    monkeypatch.setattr(ShardedStore, "own_history", lambda self, shard: None)
    shutil.copytree(src, tmp_path / "whole")
    whole = _observe(str(tmp_path / "whole"), cfg)

    # the own environment is read alone exactly where it holds the whole history
    assert took_own is (layout == "shards" and reshard is None)
    assert own == whole
    for t in READ_AT:
        bad = rows_mismatch(own[f"rows@{t}"], expected[t])
        assert bad is None, (t, bad)
    assert any(own[f"remat {c}"][0] for c in COHORTS)  # the rebuilds read records
    # a read-only open (`ShardedSnapshotStore`: its environments read once, the format
    # record at its `load`) reads its own environment alone as a writer's open does
    monkeypatch.setattr(ShardedStore, "own_history", spied)
    own_envs.clear()
    with TidalDb.open(src, config=cfg, clock=ManualClock(T0), read_only=True) as ro:
        for t in READ_AT:
            assert sorted(ro.aggregate_rows(t)) == whole[f"rows@{t}"], t
    assert any(own_envs) is (layout == "shards" and reshard is None)


def test_a_ledgers_listing_is_its_own_keys_and_only_while_self_contained(
    tmp_path: Path,
) -> None:
    """Storage level: each ledger's reader lists exactly the keys of the whole store's
    listing that name it (a key's first 8 bytes: the ledger that wrote it,
    docs/storage-format.md), read from its own environment; once the store is opened
    under another ledger count, no ledger's environment is taken for its whole
    history, nor by a read-only open under another count than the record's."""
    rng = random.Random(7)
    ref = ReferenceModel(_cfg("shards", 4), ManualClock(T0), history=True)
    path = tmp_path / "db"
    cfg = _cfg("shards", 4)
    with TidalDb.open(str(path), config=cfg, clock=ManualClock(T0)) as db:
        _workload(db, ref, rng, 200)
    store = ShardedStore(path, cfg, read_only=True)
    try:
        every = HistoryReader(store, 0, whole=True).batch_keys()
        assert len({int.from_bytes(k[:8], "big") for k in every}) == 4  # every ledger wrote
        for j in range(4):
            assert store.own_history(j) is store.envs[f"ledger-{j}"]
            mine = [k for k in every if int.from_bytes(k[:8], "big") == j]
            assert HistoryReader(store, j).batch_keys() == mine
    finally:
        store.close()
    other = ShardedStore(path, _cfg("shards", 2), read_only=True)  # the record says 4
    try:
        assert [other.own_history(j) for j in range(2)] == [None, None]
    finally:
        other.close()
    with TidalDb.open(str(path), config=_cfg("shards", 2), clock=ManualClock(T0)) as db:
        _workload(db, ref, rng, 40)
    for n in (2, 4):
        store = ShardedStore(path, _cfg("shards", n), read_only=True)
        try:
            assert [store.own_history(j) for j in range(n)] == [None] * n
            assert (
                HistoryReader(store, 0).batch_keys()
                == HistoryReader(store, 0, whole=True).batch_keys()
            )
        finally:
            store.close()
