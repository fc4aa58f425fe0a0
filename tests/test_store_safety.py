"""The store's safety around the LMDB files (an outside review's findings 1, 6, 7, 8).

1. ``compact()`` beside another process that has the environment open (a backup
   tool, ``mdb_stat``, a monitor: anything that opens the LMDB files without our
   ``tidal.lock``) refuses, naming that process, and changes nothing; a process
   attaching during a compaction waits; no acknowledged operation is ever lost.
6. A corrupt store (a zeroed page, flipped bits) either opens or raises a
   `StorageError`; a value that does not decode is named by keyspace and key (hex).
   History batches and snapshot chunks carry a CRC-32 (`_codec.seal`); stores written
   before that still open.
7. ``lmdb_flags()`` and the store's reads racing ``compact()`` wait for it.
8. ``Config`` refuses an LMDB map too small to open; the smallest allowed one opens.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import lmdb
import msgpack
import pytest

from tidal_actors import (
    COMMUNITY,
    Config,
    InvalidArgument,
    ManualClock,
    StorageError,
    TidalDb,
    TidalError,
)
from tidal_actors._config import MIN_MAP_SIZE_BYTES
from tidal_actors.storage.format import Keyspace, Tag, decode_batch, encode_key, seal, unseal
from tidal_actors.storage.lmdb_lock import LockProbe
from tidal_actors.storage.stores import LmdbStore

from ._history_v1 import encode_batch, records_of
from ._setups import every_read
from .conftest import SEC, T0

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
        db.signal_with_context(
            u, i % 7, i % 2, 1.0 + (i % 5), context={"i": i} if i % 9 == 0 else None
        )
    db.leave_community_layer(users[1])
    db.rejoin_community_layer(users[1])
    db.leave_community_layer(users[2])
    db.request_community_purge(users[3], f"c{users[3] % 3}")
    db.request_community_purge(users[4], COMMUNITY)
    db.flush()


def _export(db: TidalDb, users=USERS):
    """Every read the tests compare: users, manifests, scores."""
    return every_read(db, users)


def _reopened(path, clock, users=USERS):
    with TidalDb.open(path, config=CFG, clock=clock) as db:
        return _export(db, users)


def _build(path: Path, crashed: bool, flushed: int = 0) -> Path:
    """A small store closed cleanly (a snapshot), or the files of one that was not
    (no snapshot: the history is replayed). ``flushed``: that many more signals after
    `_populate`'s, one a second, each flushed alone (a history batch each)."""
    clock = ManualClock(T0)
    db = TidalDb.open(path, config=CFG, clock=clock)
    _populate(db, clock)
    for i in range(flushed):
        clock.advance(SEC)
        db.signal_with_context(USERS[i % len(USERS)], 50 + i % 3, 1, 2.0)
        db.flush()
    if crashed:
        db.flush()
        out = path.parent / (path.name + "-crashed")
        out.mkdir()
        for name in ("data.mdb", "tidal.store"):
            shutil.copy(path / name, out / name)
        db.close()
        return out
    db.close()
    return path


# -- 1. compaction beside an outside reader ------------------------------------------------------

_READER = """
import sys, time, lmdb
env = lmdb.open(sys.argv[1], readonly=True, lock=True, max_dbs=8)
txn = env.begin() if sys.argv[2] == "txn" else None
if txn is not None:
    sum(1 for _ in txn.cursor(db=env.open_db(b"users", txn=txn, create=False)))
print("ready", flush=True)
time.sleep(60)
"""


def _outside_reader(path, with_txn: bool) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _READER, str(path), "txn" if with_txn else "none"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


_SWAP_THEN_WAIT = """
import os, sys, time
sys.path.insert(0, sys.argv[2])
from tidal_actors import ManualClock, TidalDb
from tidal_actors.storage import lmdb_compact as _lmdb_compact
from tests.test_store_safety import CFG, T0, _populate

clock = ManualClock(T0)
db = TidalDb.open(sys.argv[1], config=CFG, clock=clock)
_populate(db, clock, users=list(range(100, 100 + int(sys.argv[3]))))
real_replace = os.replace

def replace_then_wait(src, dst):
    real_replace(src, dst)
    print("swapped", flush=True)
    time.sleep(600)  # the window between the swap and the reopen: killed here

_lmdb_compact.os.replace = replace_then_wait
db.compact()
"""

_WAITING_READER = """
import sys, time, lmdb
try:
    env = lmdb.open(sys.argv[1], readonly=True, lock=True, max_dbs=8)  # waits for the lock
except lmdb.Error as exc:
    print("refused", exc, flush=True)
    sys.exit(0)
print("attached", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("extra", [5, 6])  # both parities of the old lock file's transaction id
def test_a_compaction_killed_after_the_swap_loses_nothing_with_a_reader_waiting(tmp_path, extra):
    """Killed between the swap and its reopen while an outside reader waits to attach:
    the reader used to find lock.mdb describing the old file, and an open beside it
    could read the new file through the old state (an empty meta page) and wipe the
    store. Now the lock file is voided before the swap: the reader is refused."""
    path = _build(tmp_path / "s", crashed=False)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _SWAP_THEN_WAIT,
            str(path),
            str(Path(__file__).parent.parent),
            str(extra),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    reader = None
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "swapped"
        reader = subprocess.Popen(
            [sys.executable, "-c", _WAITING_READER, str(path)], stdout=subprocess.PIPE, text=True
        )
        time.sleep(0.5)  # the reader waits in LMDB for the compacting process's lock
        child.kill()
        child.wait()
        assert reader.stdout is not None
        assert reader.stdout.readline().startswith("refused")
        with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as db:
            got = _export(db, users=[*USERS, *range(100, 100 + extra)])
    finally:
        child.kill()
        if reader is not None:
            reader.kill()
    want_path = _build(tmp_path / "want", crashed=False)  # the same steps, no compaction
    want_clock = ManualClock(T0)
    with TidalDb.open(want_path, config=CFG, clock=want_clock) as db:
        _populate(db, want_clock, users=list(range(100, 100 + extra)))
        want = _export(db, users=[*USERS, *range(100, 100 + extra)])
    assert got[1] == want[1]  # users, leave histories, cohorts, manifests: exact
    assert [r[:3] + r[4:5] for r in got[0]] == [r[:3] + r[4:5] for r in want[0]]
    for g, w in zip(got[0], want[0]):  # sums replayed from the history: to the rounding
        assert g[3] == pytest.approx(w[3], rel=1e-12) and g[5] == pytest.approx(w[5], rel=1e-12)


@pytest.mark.parametrize("with_txn", [False, True], ids=["attached", "reading"])
def test_compact_refuses_while_another_process_has_the_environment_open(tmp_path, with_txn):
    path, clock = tmp_path / "s", ManualClock(T0)
    with TidalDb.open(path, config=CFG, clock=clock) as db:
        _populate(db, clock)
    db = TidalDb.open(path, config=CFG, clock=clock)
    extra = range(100, 106)
    try:
        _populate(db, clock, extra)  # acknowledged writes of this generation too
        data = path / "data.mdb"
        inode, size = data.stat().st_ino, data.stat().st_size
        reader = _outside_reader(path, with_txn)
        try:
            with pytest.raises(
                StorageError, match=f"process {reader.pid} has the LMDB environment"
            ):
                db.compact()
            assert data.stat().st_ino == inode and data.stat().st_size == size  # not replaced
            assert not (path / "compact.tmp").exists()
            db.assign_cohort(200, "after")  # still usable
            assert db.cohorts_of(200) == {"after"}
            want = _export(db, [*USERS, *extra, 200])
            db.close()
            assert _reopened(path, clock, [*USERS, *extra, 200]) == want
        finally:
            reader.kill()
            reader.wait()
        # the reader gone, the same store compacts, and keeps everything
        with TidalDb.open(path, config=CFG, clock=clock) as db2:
            sizes = db2.compact()
            assert sizes["bytes_after"] <= sizes["bytes_before"]
            db2.assign_cohort(201, "later")
            assert _export(db2, [*USERS, *extra, 200]) == want
        assert _reopened(path, clock, [*USERS, *extra, 200]) == want
    finally:
        db.close()


def test_compact_refuses_a_reader_that_attaches_between_the_check_and_the_close(
    tmp_path, monkeypatch
):
    """The probe's first look sees nobody; the reader is there when the lock is
    taken: refused all the same (named), and nothing changed."""
    path, clock = tmp_path / "s", ManualClock(T0)
    real = LockProbe.holder
    calls: list[int] = []

    def late(self):
        calls.append(1)
        return None if len(calls) == 1 else real(self)

    with TidalDb.open(path, config=CFG, clock=clock) as db:
        _populate(db, clock)
        want = _export(db)
        reader = _outside_reader(path, False)
        try:
            monkeypatch.setattr(LockProbe, "holder", late)
            with pytest.raises(StorageError, match=f"process {reader.pid} has"):
                db.compact()
            monkeypatch.undo()
            assert len(calls) >= 2  # the first look saw nobody; a later one named the reader
            db.assign_cohort(300, "x")
            assert _export(db) == want
        finally:
            reader.kill()
            reader.wait()
    assert _reopened(path, clock) == want


_ATTACHER = """
import sys, time, lmdb
deadline, opened, errors = time.monotonic() + float(sys.argv[2]), 0, []
while time.monotonic() < deadline:
    env = None
    try:
        env = lmdb.open(sys.argv[1], readonly=True, lock=True, max_dbs=8)
        with env.begin() as txn:
            for name in (b"users", b"items", b"history", b"meta"):
                sum(1 for _ in txn.cursor(db=env.open_db(name, txn=txn, create=False)))
        opened += 1
    except Exception as exc:
        errors.append(repr(exc))
    finally:
        if env is not None:
            env.close()
print(opened, len(errors), errors[:3], flush=True)
"""


def test_readers_attaching_during_compactions_wait_or_refuse_it_and_nothing_is_lost(tmp_path):
    path, clock = tmp_path / "s", ManualClock(T0)
    with TidalDb.open(path, config=CFG, clock=clock) as db:
        _populate(db, clock)
        child = subprocess.Popen(
            [sys.executable, "-c", _ATTACHER, str(path), "4"],
            stdout=subprocess.PIPE,
            text=True,
        )
        done = refused = 0
        u = 1000
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            db.assign_cohort(u, "during")  # acknowledged between compactions
            u += 1
            try:
                db.compact()
                done += 1
            except StorageError as exc:
                assert "compaction refused: " in str(exc)
                refused += 1
        out, _ = child.communicate(timeout=30)
        opened, n_errors, errors = out.split(" ", 2)
        assert int(n_errors) == 0, errors
        assert int(opened) > 0
        assert done + refused > 5
        want = _export(db, [*USERS, *range(1000, u)])
    assert _reopened(path, clock, [*USERS, *range(1000, u)]) == want
    assert want[1][-1][2] == {"during"}


# -- 7. lmdb_flags and reads racing compact --------------------------------------------------


def test_lmdb_flags_and_reads_racing_compact_wait_for_it(tmp_path):
    path, clock = tmp_path / "s", ManualClock(T0)
    errors: list[BaseException] = []
    stop = threading.Event()
    with TidalDb.open(path, config=CFG, clock=clock) as db:
        _populate(db, clock)
        store = db._core.store
        key = encode_key(USERS[0], Tag.COHORT_ASSIGNMENT)
        want = store.raw_get(Keyspace.USERS, key)
        counts = [0, 0]

        def flags():
            while not stop.is_set():
                try:
                    f = db.lmdb_flags()
                    assert f["sync"] and f["metasync"] and not f["writemap"]
                    counts[0] += 1
                    time.sleep(0.0002)  # hammer, but leave the actors the interpreter lock
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)
                    return

        def reads():
            while not stop.is_set():
                try:
                    assert store.raw_get(Keyspace.USERS, key) == want
                    assert sum(1 for _ in store.history_items()) > 0
                    assert db.cohorts_of(USERS[0]) == {f"c{USERS[0] % 3}"}
                    counts[1] += 1
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=flags) for _ in range(2)] + [
            threading.Thread(target=reads)
        ]
        for t in threads:
            t.start()
        try:
            for i in range(25):
                db.assign_cohort(500 + i, "c")
                db.compact()
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert errors == []
        assert counts[0] > 25 and counts[1] > 0
        exported = _export(db)
    assert _reopened(path, clock) == exported


def test_store_calls_after_close_raise_tidal_errors(tmp_path):
    store = LmdbStore(tmp_path / "s", CFG)
    store.close()
    for call in (
        store.flags,
        lambda: store.raw_get(Keyspace.USERS, b"k" * 10),
        store.load,
        lambda: list(store.history_items()),
        store.compact,
    ):
        with pytest.raises(TidalError, match="closed"):
            call()


def test_a_read_only_store_refuses_to_compact(tmp_path):
    path = _build(tmp_path / "s", crashed=False)
    before = (path / "data.mdb").read_bytes()
    store = LmdbStore(path, CFG, read_only=True)
    try:
        with pytest.raises(StorageError, match="open read-only: compaction refused"):
            store.compact()
    finally:
        store.close()
    assert (path / "data.mdb").read_bytes() == before


def test_compaction_refuses_when_lock_mdb_was_replaced_under_the_store(tmp_path):
    """Deleting lock.mdb under an open store (an operator's error) hides who else has
    it open: an outside reader attached after it would see no lock on the file the
    store holds. Compaction refuses instead of swapping data.mdb under that reader."""
    path, clock = tmp_path / "s", ManualClock(T0)
    with TidalDb.open(path, config=CFG, clock=clock) as db:
        _populate(db, clock)
        want = _export(db)
        (path / "lock.mdb").unlink()
        reader = _outside_reader(path, with_txn=True)
        try:
            before = (path / "data.mdb").read_bytes()
            with pytest.raises(StorageError, match=r"lock\.mdb was removed or replaced"):
                db.compact()
            assert (path / "data.mdb").read_bytes() == before
            assert _export(db) == want
        finally:
            reader.kill()
            reader.wait()
    assert _reopened(path, clock) == want


def test_a_read_only_open_writes_nothing_and_a_missing_keyspace_is_damage(tmp_path):
    path = _build(tmp_path / "s", crashed=False)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"history", txn=txn), delete=True)
    env.close()
    before = (path / "data.mdb").read_bytes()
    for read_only in (True, False):
        with pytest.raises(StorageError, match="has no history keyspace: it is damaged"):
            LmdbStore(path, CFG, read_only=read_only)
        assert (path / "data.mdb").read_bytes() == before  # no keyspace made anew
    with pytest.raises(StorageError, match="has no history keyspace"):
        TidalDb.open(path, config=CFG)
    assert (path / "data.mdb").read_bytes() == before


@pytest.mark.parametrize("field", ["map_size_bytes", "max_map_size_bytes"])
def test_a_map_larger_than_the_address_space_is_refused_by_config(field):
    with pytest.raises(InvalidArgument) as err:
        Config(
            **{field: 2**64, "max_map_size_bytes": 2**64}
            if field == "map_size_bytes"
            else {field: 2**64}
        )
    assert err.value.field == field and err.value.value == 2**64
    Config(map_size_bytes=2**30, max_map_size_bytes=2**47)  # the largest accepted


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


def test_the_map_grows_at_open_when_lmdb_needs_more(tmp_path):
    """A map smaller than LMDB's own records (what 64 KiB is on a system with larger
    pages; forced here past Config's check) grows at open like any full map."""
    cfg = Config()
    object.__setattr__(cfg, "map_size_bytes", 4096)
    path, clock = tmp_path / "s", ManualClock(T0)
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        assert db._core.store.map_size > 4096
        db.assign_cohort(1, "c")
    with TidalDb.open(path, config=cfg, clock=clock) as db:
        assert db.cohorts_of(1) == {"c"}


def test_an_lmdb_error_while_a_keyspace_is_read_back_names_it(tmp_path):
    """LMDB reports a corrupt page it meets while reading (MDB_CORRUPTED): a
    StorageError naming the keyspace."""
    path = _build(tmp_path / "s", crashed=True)
    store = LmdbStore(path, CFG)
    try:

        class Broken:
            def __init__(self, txn):
                self.txn = txn

            def cursor(self, db):
                raise lmdb.CorruptedError("simulated")

        with pytest.raises(StorageError, match="cannot read the users keyspace"):
            list(store._read(Broken(None), Keyspace.USERS))
    finally:
        store.close()


# -- 6. corrupt values and pages -----------------------------------------------------------------


def test_seal_frames_a_payload_with_its_crc():
    raw = seal(b"\x01\x02", b"\x81\xa1a\x01")
    assert raw[:2] == b"\xc1\x01" and len(raw) == 6 + 4
    assert raw[2:6] == zlib.crc32(b"\x01\x02\x81\xa1a\x01").to_bytes(4, "little")
    assert bytes(unseal(raw, "history", b"\x01\x02")) == b"\x81\xa1a\x01"
    with pytest.raises(StorageError, match="cannot decode history key 0103: CRC-32 mismatch"):
        unseal(raw, "history", b"\x01\x03")  # the same value under another key
    assert unseal(b"\x81\xa1a\x01", "history", b"k") == b"\x81\xa1a\x01"  # written before seals
    bad = raw[:-1] + b"\x02"
    with pytest.raises(StorageError, match="cannot decode history key 0102: CRC-32 mismatch"):
        unseal(bad, "history", b"\x01\x02")
    with pytest.raises(StorageError, match="cannot decode meta key ff: sealed value cut short"):
        unseal(raw[:4], "meta", b"\xff")
    with pytest.raises(StorageError, match="unknown seal version 9"):
        unseal(b"\xc1\x09" + raw[2:], "meta", b"\xff")
    for zeroed in (b"\x00" * 10, b""):  # a zeroed frame is not taken for an old value
        with pytest.raises(
            StorageError, match="cannot decode meta key ff: neither sealed nor a msgpack map"
        ):
            unseal(zeroed, "meta", b"\xff")


def _entries(path: Path) -> dict[str, dict[bytes, bytes]]:
    env = lmdb.open(str(path), max_dbs=8, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return {
                k.value: dict(txn.cursor(db=env.open_db(k.value.encode(), txn=txn, create=False)))
                for k in Keyspace
            }
    finally:
        env.close()


def _rewrite(path: Path, changes: list[tuple[str, bytes, bytes]]) -> None:
    env = lmdb.open(str(path), max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            for ks, key, value in changes:
                txn.put(key, value, db=env.open_db(ks.encode(), txn=txn))
    finally:
        env.close()


def _version_1(key: bytes, value: bytes) -> bytes:
    """A sealed history batch rewritten in the version 1 layout (`_history_v1`);
    another value as it is."""
    if key[9] != Tag.CONTRIBUTION_BATCH:
        return value
    b = decode_batch(0, 0, value, key)
    return seal(key, encode_batch(records_of(b), b.contexts))


def _is_sealed_kind(key: bytes) -> bool:
    return key[9] in (Tag.CONTRIBUTION_BATCH, Tag.SNAPSHOT_CHUNK)


@pytest.mark.parametrize("crashed", [False, True], ids=["clean", "crashed"])
def test_values_are_sealed_and_stores_written_before_seals_still_open(tmp_path, crashed):
    path = _build(tmp_path / "s", crashed)
    entries = _entries(path)
    sealed = [(ks, k, v) for ks, kv in entries.items() for k, v in kv.items() if _is_sealed_kind(k)]
    assert any(k[9] == Tag.CONTRIBUTION_BATCH for _, k, _ in sealed)
    assert any(k[9] == Tag.SNAPSHOT_CHUNK for _, k, _ in sealed) != crashed
    assert all(v[:2] == b"\xc1\x01" for _, _, v in sealed)
    clock = ManualClock(T0)
    original = tmp_path / "original"
    shutil.copytree(path, original)
    with TidalDb.open(original, config=CFG, clock=clock) as db:
        want = _export(db)
    # the layout before seals: the bare msgpack payload, history batches in version 1
    unsealed = [(ks, k, _version_1(k, v)[6:]) for ks, k, v in sealed]
    _rewrite(path, unsealed)
    assert all(isinstance(msgpack.unpackb(v, strict_map_key=False), dict) for _, _, v in unsealed)
    with TidalDb.open(path, config=CFG, clock=clock) as db:
        assert _export(db) == want


@pytest.mark.parametrize("tag", [Tag.CONTRIBUTION_BATCH, Tag.SNAPSHOT_CHUNK])
def test_a_flipped_byte_inside_a_sealed_value_is_named(tmp_path, tag):
    path = _build(tmp_path / "s", crashed=tag == Tag.CONTRIBUTION_BATCH)
    entries = _entries(path)
    ks = "history" if tag == Tag.CONTRIBUTION_BATCH else "meta"
    key, value = next((k, v) for k, v in entries[ks].items() if k[9] == tag)
    flipped = bytearray(value)
    flipped[len(value) // 2] ^= 0x10  # msgpack would still decode most such flips
    _rewrite(path, [(ks, key, bytes(flipped))])
    with pytest.raises(StorageError, match=f"cannot decode {ks} key {key.hex()}: CRC-32 mismatch"):
        TidalDb.open(path, config=CFG, clock=ManualClock(T0))


@pytest.mark.parametrize("tag", [Tag.CONTRIBUTION_BATCH, Tag.SNAPSHOT_CHUNK])
def test_a_sealed_value_under_another_key_is_named(tmp_path, tag):
    """The CRC covers the key: a history batch copied under a new sequence number
    (its records counted twice after a crash) or shard 0's snapshot chunk stored as
    shard 1's (every read of shard 1's cohorts wrong, then snapshotted again) is
    refused like a corrupt value."""
    path = _build(tmp_path / "s", crashed=tag == Tag.CONTRIBUTION_BATCH)
    entries = _entries(path)
    ks = "history" if tag == Tag.CONTRIBUTION_BATCH else "meta"
    key, value = next((k, v) for k, v in entries[ks].items() if k[9] == tag)
    moved = encode_key(int.from_bytes(key[:8], "big") + 1, tag, key[10:])
    if tag == Tag.CONTRIBUTION_BATCH:  # a new sequence number in the same shard
        moved = key[:10] + (int.from_bytes(key[10:], "big") + 1000).to_bytes(8, "big")
    _rewrite(path, [(ks, moved, value)])
    with pytest.raises(
        StorageError, match=f"cannot decode {ks} key {moved.hex()}: CRC-32 mismatch"
    ):
        TidalDb.open(path, config=CFG, clock=ManualClock(T0))


@pytest.mark.parametrize(
    "ks,tag,value",
    [
        ("users", Tag.COMMUNITY_LEAVE, b"\x07" * 9),
        ("users", Tag.LEAVE_HISTORY, msgpack.packb("nope")),
        ("users", Tag.COHORT_ASSIGNMENT, msgpack.packb([1, 2])),
        ("items", Tag.PURGE_TOMBSTONE, msgpack.packb([[1]])),
        ("meta", Tag.EVICTION_STATE, msgpack.packb(["a", [], 0])),
        (
            "history",
            Tag.CONTRIBUTION_BATCH,
            msgpack.packb({"r": b"\x00" * 8, "ci": b"\x00", "c": []}),
        ),
        ("history", Tag.CONTRIBUTION_BATCH, b"\x81"),
    ],
)
def test_a_value_that_does_not_decode_is_named_by_keyspace_and_key(tmp_path, ks, tag, value):
    path = _build(tmp_path / "s", crashed=True)
    key = encode_key(
        USERS[0], tag, (7).to_bytes(8, "big") if tag == Tag.CONTRIBUTION_BATCH else b""
    )
    _rewrite(path, [(ks, key, value)])
    with pytest.raises(StorageError, match=f"cannot decode {ks} key {key.hex()}: "):
        TidalDb.open(path, config=CFG, clock=ManualClock(T0))


def _try_open(path: Path, keys: set[str]) -> str:
    """ "opened" (and closed), "refused" (a StorageError), "undecodable" (one naming
    a keyspace and a stored key in hex), or what else went wrong."""
    try:
        with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as db:
            db.aggregate_rows(T0)
        return "opened"
    except StorageError as exc:
        msg = str(exc)
        if msg.startswith("cannot decode "):
            ks, _, key = msg.split(" ", 5)[2:5]
            if ks not in {k.value for k in Keyspace} or key.rstrip(":") not in keys:
                return f"a decode error naming no stored key: {msg}"
            return "undecodable"
        return "refused"
    except Exception as exc:  # noqa: BLE001 - what the test looks for
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("crashed", [False, True], ids=["clean", "crashed"])
def test_every_zeroed_page_opens_or_raises_a_storage_error(tmp_path, crashed):
    src = _build(tmp_path / "s", crashed)
    keys = {k.hex() for kv in _entries(src).values() for k in kv}
    data = (src / "data.mdb").read_bytes()
    pages = len(data) // PSIZE
    assert 5 < pages < 200
    outcomes: dict[str, int] = {}
    failures = []
    for page in range(pages):
        copy = tmp_path / f"p{page}"
        copy.mkdir()
        shutil.copy(src / "tidal.store", copy / "tidal.store")
        (copy / "data.mdb").write_bytes(
            data[: page * PSIZE] + bytes(PSIZE) + data[(page + 1) * PSIZE :]
        )
        outcome = _try_open(copy, keys)
        if outcome not in ("opened", "refused", "undecodable"):
            failures.append((page, outcome))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        shutil.rmtree(copy)
    assert failures == []
    # free pages open; LMDB's own pages are refused; the pages of a value too large for
    # a leaf page (an overflow page: a snapshot chunk) fail its CRC-32 (the history
    # batches of this small store are compressed into values that fit a leaf page)
    overflow = any(len(v) > PSIZE // 2 for kv in _entries(src).values() for v in kv.values())
    assert outcomes["opened"] > 0 and outcomes["refused"] > 0, outcomes
    assert (outcomes.get("undecodable", 0) > 0) == overflow, outcomes


def test_random_bit_flips_open_or_raise_a_storage_error(tmp_path):
    src = _build(tmp_path / "s", crashed=False)
    keys = {k.hex() for kv in _entries(src).values() for k in kv}
    data = (src / "data.mdb").read_bytes()
    rng = random.Random(6)
    failures = []
    for i in range(24):
        flipped = bytearray(data)
        for _ in range(rng.choice((1, 4, 16))):
            bit = rng.randrange(
                2 * PSIZE * 8, len(data) * 8
            )  # the meta pages have their own test above
            flipped[bit // 8] ^= 1 << (bit % 8)
        copy = tmp_path / f"f{i}"
        copy.mkdir()
        shutil.copy(src / "tidal.store", copy / "tidal.store")
        (copy / "data.mdb").write_bytes(bytes(flipped))
        outcome = _try_open(copy, keys)
        if outcome not in ("opened", "refused", "undecodable"):
            failures.append((i, outcome))
        shutil.rmtree(copy)
    assert failures == []


def test_restored_values_that_do_not_fit_together_are_a_storage_error(tmp_path, monkeypatch):
    """The last line: whatever restoring decoded values raises is a StorageError."""
    from tidal_actors.runtime import restore

    path = _build(tmp_path / "s", crashed=True)

    def broken(*args):
        raise IndexError("index 7 is out of bounds")

    monkeypatch.setattr(restore, "_replay_history", broken)
    with pytest.raises(StorageError, match=f"cannot restore from {path}: IndexError: index 7"):
        TidalDb.open(path, config=CFG, clock=ManualClock(T0))
    monkeypatch.undo()
    with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as db:  # nothing was changed
        assert db.cohorts_of(USERS[0]) == {f"c{USERS[0] % 3}"}
