"""A ledger keeps the purges' tombstones it must leave out of what it reads back
(`HistoryReader.hold_tombstones`: those committed before its restore, and each purge
it retracts live after, `retracted`) instead of reading the coordinator's items
keyspace at each rebuild and settled read.

Seeded random workloads with purges, reads inside settled buckets and rebuilds
interleaved, run twice on fresh stores of both layouts: once with the tombstones held,
once read from the store (the earlier path). The rows and rebuild reports agree
between the two and with the reference model's rows, and at the end the ledgers'
held tombstones together are exactly the store's.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, TidalDb
from tidal_actors.storage.format import Keyspace, Tag, decode_tombstone
from tidal_actors.storage.history import HistoryReader
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from .conftest import SEC, T0, until

COHORTS = ["a", "b", "c", "d", "e", "f"]
USERS = 16
READ_AT = [T0 + k * SEC for k in (-2, 6, 13, 24, 37)]


def _cfg(layout: str) -> Config:
    return Config(
        half_life_ns=30 * SEC,
        window_width_ns=10 * SEC,
        window_buckets=4,
        max_contribution_log_entries=10,
        membership_shards=2,
        ledger_shards=3,
        store_layout=layout,
        rematerialize_after_ms=None,
    )


def _store_tombstones(db: Any) -> set[tuple[int, int]]:
    """Every ``(membership shard, rseq)`` of the store's tombstones (items keyspace)."""
    out: set[tuple[int, int]] = set()
    for key, value in db._core.store.scan(Keyspace.ITEMS):
        if key[9] == Tag.PURGE_TOMBSTONE:
            out.update(decode_tombstone(value))
    return out


def _run(path: str, layout: str, seed: int) -> list[Any]:
    """The workload on a fresh store; what each read and rebuild gave, in order."""
    rng = random.Random(seed)
    cfg = _cfg(layout)
    ref = ReferenceModel(cfg, ManualClock(T0), history=True)
    seen: list[Any] = []
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        for u in range(USERS):
            for c in rng.sample(COHORTS, 2):
                db.assign_cohort(u, c)
                ref.assign_cohort(u, c)
        for step in range(420):
            args = (
                rng.randrange(USERS),
                rng.randrange(5),
                rng.randrange(2),
                rng.choice([0.5, 1.0, 2.0]),
                T0 + rng.randrange(-5, 40) * SEC,
            )
            db.signal_with_context(*args)
            ref.signal_with_context(*args)
            if step % 4 == 3:
                db.flush()
            if rng.random() < 0.06:  # most of a user's recent records are live: retracted
                u, c = rng.randrange(USERS), rng.choice([*COHORTS, COMMUNITY])
                _, m = db.request_community_purge(u, c)
                _, rm = ref.request_community_purge(u, c)
                assert (m.entries, m.evicted) == (rm.entries, rm.evicted)
            if step % 60 == 59:
                db.flush()
                for t in READ_AT:
                    rows = db.aggregate_rows(t)
                    bad = rows_mismatch(rows, ref.aggregate_rows(t))
                    assert bad is None, (step, t, bad)
                    seen.append(rows)
                c = rng.choice([*COHORTS, COMMUNITY])
                r = db.rematerialize(c)
                ref.rematerialize(c)
                seen.append((c, r.records_read, r.records_excluded, r.matched_live))
        db.flush()
        readers = [ls.state.history for ls in db._core.ledgers]
        assert all(isinstance(r, HistoryReader) for r in readers)
        in_store = _store_tombstones(db)
        assert in_store  # purges retracted records live

        def held() -> set[tuple[int, int]]:
            return {(m, int(r)) for h in readers for m, rs in h.tombstones().items() for r in rs}

        if readers[0]._held is not None:
            # each purge's retraction reaches its ledger after its commit: then the
            # ledgers' held tombstones together are the store's, none twice
            until(lambda: held() == in_store)
            assert held() == in_store
            total = sum(len(rs) for h in readers for rs in h.tombstones().values())
            assert total == len(in_store)
    return seen


@pytest.mark.parametrize(("layout", "seed"), [("shards", 21), ("shards", 22), ("single", 23)])
def test_held_tombstones_read_as_the_stores(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settle_at_once: None,
    layout: str,
    seed: int,
) -> None:
    held = _run(str(tmp_path / "held"), layout, seed)
    monkeypatch.setattr(HistoryReader, "hold_tombstones", lambda self, pairs: None)
    scanned = _run(str(tmp_path / "scan"), layout, seed)
    assert len(held) == len(scanned)
    for a, b in zip(held, scanned):
        if isinstance(a, tuple):
            assert a == b
        else:
            assert rows_mismatch(a, b) is None
    assert any(isinstance(a, tuple) and a[1] for a in held)  # the rebuilds read records


def test_retractions_merge_into_a_new_dict_a_running_rebuild_does_not_see() -> None:
    """`tombstones` returns the held set; a later `retracted` merges into a new one
    (a rebuild keeps the set it started with, as it kept the store's read)."""
    reader = HistoryReader(None, 0)  # type: ignore[arg-type]  # no store read here
    reader.hold_tombstones([(0, 5), (1, 2), (0, 3)])
    first = reader.tombstones()
    assert {m: rs.tolist() for m, rs in first.items()} == {0: [3, 5], 1: [2]}
    reader.retracted([1, 0, 1], [9, 4, 1])
    reader.retracted([], [])
    after = reader.tombstones()
    assert {m: rs.tolist() for m, rs in after.items()} == {0: [3, 4, 5], 1: [1, 2, 9]}
    assert {m: rs.tolist() for m, rs in first.items()} == {0: [3, 5], 1: [2]}
    assert all(rs.dtype == np.int64 for rs in after.values())
