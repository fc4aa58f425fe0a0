"""The store's safety around the LMDB files (an outside review's findings).

8. ``Config`` refuses an LMDB map too small to open; the smallest allowed one opens.
"""

from __future__ import annotations

import pytest

from tidal_actors import (
    COMMUNITY,
    Config,
    InvalidArgument,
    ManualClock,
    TidalDb,
)
from tidal_actors._config import MIN_MAP_SIZE_BYTES

from .conftest import HOUR, SEC, T0

USERS = range(1, 13)
CFG = Config(ledger_shards=2, rematerialize_after_ms=None)
PSIZE = 4096


def _populate(db: TidalDb, clock: ManualClock, users=USERS) -> None:
    """A few users in cohorts, signals, a leave, a rejoin and a purge; all durable."""
    for u in users:
        db.assign_cohort(u, f"c{u % 3}")
        if u % 4 == 0:
            db.assign_cohort(u, "extra")
    for i in range(120):
        u = users[i % len(users)]
        clock.advance(SEC)
        db.signal_with_context(u, i % 7, i % 2, 1.0 + (i % 5), context={"i": i} if i % 9 == 0 else None)
    db.leave_community_layer(users[1])
    db.rejoin_community_layer(users[1])
    db.leave_community_layer(users[2])
    db.request_community_purge(users[3], f"c{users[3] % 3}")
    db.request_community_purge(users[4], COMMUNITY)
    db.flush()


def _export(db: TidalDb, users=USERS):
    """Every read the tests compare: users, manifests, scores."""
    return (
        db.aggregate_rows(T0 + HOUR),
        [(db.community_layer_status(u), db.community_leave_history(u), db.cohorts_of(u),
          db.list_purge_manifests(u)) for u in users],
    )


def _reopened(path, clock, users=USERS):
    with TidalDb.open(path, config=CFG, clock=clock) as db:
        return _export(db, users)


# -- 8. the smallest LMDB map ------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 4096, 32768, MIN_MAP_SIZE_BYTES - 1])
def test_a_map_too_small_to_open_is_refused_by_config(size):
    with pytest.raises(InvalidArgument) as err:
        Config(map_size_bytes=size, max_map_size_bytes=2**30)
    assert err.value.field == "map_size_bytes" and err.value.value == size
    assert "at least 65536" in str(err.value)
    with pytest.raises(InvalidArgument, match="max_map_size_bytes"):
        Config(map_size_bytes=MIN_MAP_SIZE_BYTES, max_map_size_bytes=size)


def test_the_smallest_map_opens_and_holds_a_store(tmp_path):
    assert MIN_MAP_SIZE_BYTES == 65536
    cfg = CFG.replace(map_size_bytes=MIN_MAP_SIZE_BYTES, max_map_size_bytes=MIN_MAP_SIZE_BYTES)
    path, clock = tmp_path / "s", ManualClock(T0)
    users = range(1, 6)
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        for u in users:
            db.assign_cohort(u, "c")
            db.signal_with_context(u, 7, 1, 2.0)
        db.request_community_purge(1, "c")
        db.flush()
        want = _export(db, users)
        assert want[0] and want[1][0][3][0].entries
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        assert _export(db, users) == want
