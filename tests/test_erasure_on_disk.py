"""Once a purge's re-materialization and a compaction are done, no byte of a covered
record is in the data file, whatever closes and reopens follow.

Before the fix the purged user's evicted records left their key's columns behind
(entity id, first and last timestamps): every clean close wrote them into the
snapshot again after the compaction had cleaned the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal_actors import Config, ManualClock, TidalDb

T0 = 10**18
SECRET_ENTITY = 0x5A17_C0DE_9E3D_4B21  # only user 1 ever touched it
SECRET_TS = (T0 + 123_456_789_013, T0 + 123_456_789_877)  # only user 1's records carry these


def _needles() -> dict[str, bytes]:
    out = {
        "entity BE": SECRET_ENTITY.to_bytes(8, "big"),
        "entity LE": SECRET_ENTITY.to_bytes(8, "little"),
    }
    for i, t in enumerate(SECRET_TS):
        out[f"ts{i} LE"] = t.to_bytes(8, "little")
        out[f"ts{i} BE"] = t.to_bytes(8, "big")
    return out


def _found(path: str) -> list[str]:
    data = (Path(path) / "data.mdb").read_bytes()
    return [name for name, needle in _needles().items() if needle in data]


@pytest.mark.parametrize("ledger_shards", [1, 2])
def test_evicted_purged_records_leave_no_byte_after_any_number_of_closes(tmp_path, ledger_shards):
    path = str(tmp_path / "s")
    cfg = Config(
        max_contribution_log_entries=20, rematerialize_after_ms=None, ledger_shards=ledger_shards
    )
    clock = ManualClock(T0 + 10**12)
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        db.assign_cohort(1, "c")
        db.assign_cohort(2, "c")
        for t in SECRET_TS:
            db.signal_with_context(1, SECRET_ENTITY, 1, 3.0, timestamp_ns=t)
        for i in range(40):  # evicts user 1's records from the log (cap 20)
            db.signal_with_context(2, 1000 + i % 5, 1, 1.0, timestamp_ns=T0 + 2 * 10**11 + i)
        _, manifest = db.request_community_purge(1, "c")
        assert manifest.entries == () and manifest.evicted == 2  # both evicted: only counted
        db.rematerialize("c")
        db.rematerialize("@community")
        db.request_community_purge(1, "@community")
        db.rematerialize("@community")
        assert db.read_decay_score("c", SECRET_ENTITY, 1) == 0.0
        db.compact()
    assert _found(path) == []  # the clean close wrote a snapshot
    for _ in range(3):
        with TidalDb.open(path, config=cfg, clock=clock) as db:
            assert db.read_window("c", SECRET_ENTITY, 1).count == 0
            assert db.read_window("c", 1000, 1).count == 8
        assert _found(path) == []


def test_a_purged_latest_contribution_leaves_no_timestamp_in_the_key_columns(tmp_path):
    """User 1's record is the latest of a key user 2 keeps alive: the purge retracts it
    (the manifest lists it: msgpack writes its timestamp big-endian), and the rebuild
    must replace the key's latest-timestamp columns, which the retraction leaves as
    they were; the snapshot's little-endian columns must not carry it."""
    path = str(tmp_path / "s")
    secret = SECRET_TS[0]
    cfg = Config(rematerialize_after_ms=None, ledger_shards=1)
    clock = ManualClock(T0 + 10**12)
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        for u in (1, 2):
            db.assign_cohort(u, "c")
        db.signal_with_context(2, 77, 1, 1.0, timestamp_ns=T0 + 5)
        db.signal_with_context(1, 77, 1, 1.0, timestamp_ns=secret)
        for cohort in ("c", "@community"):
            _, manifest = db.request_community_purge(1, cohort)
            assert [e.timestamp_ns for e in manifest.entries] == [secret]
            db.rematerialize(cohort)
        assert db.read_window("c", 77, 1) == (1, 1.0)
        db.compact()
    for _ in range(3):
        assert secret.to_bytes(8, "little") not in (Path(path) / "data.mdb").read_bytes()
        with TidalDb.open(path, config=cfg, clock=clock) as db:
            assert db.read_window("c", 77, 1) == (1, 1.0)
