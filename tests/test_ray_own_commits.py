"""Each shard commits its own environment in its own process under the Ray host in
the ``shards`` layout (`runtime.ray_control`, `runtime.ray_history`): control writes,
purges and history never reach the persistence actor's commits, and what they wrote
is where `storage.layout.owner_of` says, checked against the reference model after a
reopen under the pykka host. Skipped, with the reason, where Ray is not installed.
"""

from __future__ import annotations

from pathlib import Path

import lmdb

from tidal_actors import ManualClock, Signal, TidalDb
from tidal_actors.storage.format import Keyspace
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from ._ray import needs_ray, ray_config
from .conftest import SEC, T0

COHORTS = ("red", "green", "blue")


def _users_in(path: Path, env: str) -> int:
    """How many keys the users keyspace of environment ``env`` holds."""
    e = lmdb.open(str(path / "shards" / env), max_dbs=8, readonly=True, lock=False)
    try:
        with e.begin(db=e.open_db(Keyspace.USERS.value.encode(), create=False)) as txn:
            return int(txn.stat(e.open_db(Keyspace.USERS.value.encode(), txn=txn))["entries"])
    finally:
        e.close()


@needs_ray
def test_shards_commit_their_own_writes_in_their_own_processes(
    ray_session: None, tmp_path: Path
) -> None:
    path = tmp_path / "store"
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    ref = ReferenceModel(cfg, ManualClock(T0))
    with TidalDb.open(str(path), config=cfg, clock=clock) as db:
        assert db.store_layout == "shards"
        for u in range(20):
            for c in (COHORTS[u % 3], COHORTS[(u + 1) % 3]):
                db.assign_cohort(u, c)
                ref.assign_cohort(u, c)
        batch = [Signal(i % 20, i % 7, i % 2, 1.0 + i % 3, T0 - i * SEC) for i in range(400)]
        db.signal_batch(batch)
        ref.signal_batch(batch)
        db.flush()
        db.leave_community_layer(3)
        ref.leave_community_layer(3)
        _, got = db.request_community_purge(5, COHORTS[5 % 3])
        _, want = ref.request_community_purge(5, COHORTS[5 % 3])
        assert got.entries == want.entries and len(got.entries) > 0
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        # persistence committed none of it; the shards' processes committed each of
        # the 40 assigns and the leave at their membership shard (one at a time: each
        # caller waited for its commit), the purge at the coordinator, and the history
        # at the ledgers (at least one commit): stats() counts those (it said 0)
        stats = db.stats()
        assert stats["commits"] >= 40 + 1 + 1 + 1, stats
        assert stats["failed_writes"] == 0
    # membership shard i's users are in membership-i's environment, none elsewhere
    # (each user has a cohort record, and user 3 a leave and its history too)
    from tidal_actors.core.sharding import membership_shard_of

    per_shard = [0, 0]
    for u in range(20):
        per_shard[membership_shard_of(u, 2)] += 3 if u == 3 else 1
    assert [_users_in(path, f"membership-{i}") for i in range(2)] == per_shard
    assert _users_in(path, "coordinator") == 0
    with TidalDb.open(str(path), config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None
        assert [m.entries for m in again.list_purge_manifests(5)] == [want.entries]
        assert again.community_layer_status(3) == ref.community_layer_status(3)
