"""Regression tests for what the adversarial review found."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from tidal_actors import (
    COMMUNITY,
    Config,
    InvalidArgument,
    ManualClock,
    StorageError,
    TidalDb,
    UnknownPurge,
)

from .conftest import T0


def test_rematerialize_racing_a_purge_of_the_same_cohort_never_undoes_it(clock):
    cfg = Config(rematerialize_after_ms=None)
    with TidalDb.open(config=cfg, clock=clock) as db:
        for u in range(30):
            db.assign_cohort(u, "x")
        for u in range(30):
            for e in range(200):
                db.signal_with_context(u, e, 1, 1.0, T0)
        db.flush()
        for u in range(30):
            t = threading.Thread(target=db.rematerialize, args=("x",))
            t.start()
            _, m = db.request_community_purge(u, "x")
            t.join()
            assert len(m.entries) == 200
            # the purged user's contributions stay gone, whatever the rebuild did
            assert db.read_window("x", 0, 1, T0).count == 30 - u - 1
        db.rematerialize("x")
        assert db.read_window("x", 0, 1, T0).count == 0
        assert db.read_window(COMMUNITY, 0, 1, T0).count == 30


def test_unknown_purge_is_not_a_handler_error(db):
    with pytest.raises(UnknownPurge):
        db.purge_status(123)
    assert db.stats()["handler_errors"] == 0


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"membership_shards": 256}, "membership_shards"),
        ({"half_life_ns": 2**70}, "half_life_ns"),
        ({"half_life_ns_by_type": {2: 2**80}}, "half_life_ns_by_type[2]"),
        ({"window_width_ns": 2**64}, "window_width_ns"),
    ],
)
def test_config_upper_bounds(kw, field):
    with pytest.raises(InvalidArgument) as ei:
        Config(**kw)
    assert ei.value.field == field


def test_config_toml_keys_stay_in_their_sections(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[window]\nhalf_life_ns = 7\n")
    with pytest.raises(
        InvalidArgument, match=r"not a setting of section \[window\]; it belongs in \[decay\]"
    ):
        Config.from_toml(bad)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InvalidArgument):
        Config.from_toml(binary)


def test_bad_paths_raise_tidal_errors(tmp_path):
    with pytest.raises(InvalidArgument):
        TidalDb.open("")
    with pytest.raises(StorageError):
        TidalDb.open(str(tmp_path) + "/a\x00b")


def test_truncated_or_emptied_store_is_refused_not_crashed(tmp_path):
    path = str(tmp_path / "s")
    with TidalDb.open(path, clock=ManualClock(T0)) as db:
        for i in range(3000):
            db.signal_with_context(i, i, 1, 1.0)
    data = os.path.join(path, "data.mdb")
    size = os.path.getsize(data)
    code = (
        "import sys\nfrom tidal_actors import TidalDb, StorageError\n"
        "try:\n    TidalDb.open(sys.argv[1])\nexcept StorageError as e:\n    print('refused:', e)\n"
    )
    with open(data, "r+b") as fh:
        fh.truncate(size // 2)
    out = subprocess.run(
        [sys.executable, "-c", code, path], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.startswith("refused:") and "truncated" in out.stdout
    with open(data, "r+b") as fh:
        fh.truncate(0)
    out = subprocess.run(
        [sys.executable, "-c", code, path], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.startswith("refused:"), out.stderr


def test_inspect_does_not_create_a_store_in_a_foreign_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidal_actors.cli",
            "inspect",
            "--data-dir",
            str(tmp_path),
            "user",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "not a tidal_actors data directory" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_an_unclosed_database_is_flushed_and_closed_at_exit(tmp_path):
    path = str(tmp_path / "s")
    code = (
        "import sys\nfrom tidal_actors import TidalDb\n"
        "db = TidalDb.open(sys.argv[1])\n"
        "for i in range(100):\n    db.signal_with_context(1, i, 1, 1.0, 10**18)\n"
    )
    subprocess.run([sys.executable, "-c", code, path], check=True, timeout=60)
    with TidalDb.open(path) as db:
        assert sum(r[4] for r in db.aggregate_rows(10**18)) == 100


def test_reopening_with_another_half_life_rebuilds_instead_of_misreading_the_snapshot(tmp_path):
    path = str(tmp_path / "s")
    hour = 3600 * 10**9
    with TidalDb.open(path, config=Config(half_life_ns=hour), clock=ManualClock(T0)) as db:
        db.signal_with_context(1, 1, 1, 1.0, T0 - hour)
        assert db.read_decay_score(COMMUNITY, 1, 1) == 0.5
    with TidalDb.open(path, config=Config(half_life_ns=2 * hour), clock=ManualClock(T0)) as db:
        assert db.read_decay_score(COMMUNITY, 1, 1) == 2**-0.5


# -- found by a second adversarial review ------------------------------------------


def _drop_snapshot(path: str) -> None:
    """Remove the clean-close snapshot, as a crash would leave the store."""
    import lmdb

    from tidal_actors.storage.format import Keyspace, Tag, encode_key

    env = lmdb.open(path, max_dbs=8, subdir=True)
    try:
        with env.begin(write=True, db=env.open_db(Keyspace.META.value.encode())) as txn:
            txn.delete(encode_key(0, Tag.SNAPSHOT_MARK))
    finally:
        env.close()


def test_manifest_keeps_log_order_across_a_ledger_shard_change(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Batches written under 2 ledger shards and then 1 join in key order (shard,
    seq), not in the order they were written: the replay puts each membership
    shard's records back in rseq order, so a purge lists them in log order."""
    from tidal_actors import Config, ManualClock, TidalDb
    from tidal_actors.storage.format import ledger_shard_of

    cohort = next(c for c in (f"c{i}" for i in range(100)) if ledger_shard_of(c, 2) == 1)
    path, clock = str(tmp_path / "db"), ManualClock(10**18)

    def open_(n: int) -> TidalDb:
        return TidalDb.open(
            path, config=Config(ledger_shards=n, rematerialize_after_ms=None), clock=clock
        )

    with open_(2) as db:
        db.assign_cohort(1, cohort)
        db.signal_with_context(1, 10, 1, 1.0, 10**18 + 1)
    with open_(1) as db:
        db.signal_with_context(1, 20, 1, 1.0, 10**18 + 2)
    _drop_snapshot(path)
    with open_(2) as db:
        _, m = db.request_community_purge(1, cohort)
    assert [e.entity_id for e in m.entries] == [10, 20]


@pytest.mark.parametrize("crash", [False, True])
def test_rematerialize_a_fully_purged_cohort_after_reopen(tmp_path, crash) -> None:  # type: ignore[no-untyped-def]
    """Its records all purged and erased, the cohort is still known after a restore
    from the history (its purge names it): no UnknownCohort, as live."""
    from tidal_actors import Config, ManualClock, TidalDb

    path, cfg, clock = (
        str(tmp_path / "db"),
        Config(rematerialize_after_ms=None),
        ManualClock(10**18),
    )
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        db.assign_cohort(1, "c")
        db.signal_with_context(1, 10, 1, 1.0)
        db.request_community_purge(1, "c")
        assert db.rematerialize("c").records_read == 0
    if crash:
        _drop_snapshot(path)
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        report = db.rematerialize("c")
        assert report.records_read == 0 and report.records_excluded == 0


def test_log_cap_below_the_membership_shard_count_is_refused() -> None:
    """Each membership shard gets a share of the cap; a share of 0 would evict a
    record as it arrives (and lose it from the manifests' evicted counts)."""
    from tidal_actors import Config, InvalidArgument

    with pytest.raises(InvalidArgument, match="max_contribution_log_entries"):
        Config(max_contribution_log_entries=1, membership_shards=2)
    assert (
        Config(max_contribution_log_entries=2, membership_shards=2).max_contribution_log_entries
        == 2
    )
