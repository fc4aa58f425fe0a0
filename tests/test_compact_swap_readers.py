"""Another process opening the store while ``compact()`` swaps ``data.mdb``, forced
into the window: the compaction is paused right after it took LMDB's lock byte and
voided ``lock.mdb`` (its ``invalidate`` step), a reader process (started and imported
beforehand) is released, and the compaction goes on only once the kernel lists that
reader as waiting for a lock (``/proc/locks``; Linux). Read-only, LMDB opens
``data.mdb`` before it waits for its lock (mdb.c, ``mdb_env_open``), so a reader
caught there holds the file being replaced. Expected rows come from the reference
model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tidal_actors import Config, ManualClock, StorageError, TidalDb
from tidal_actors.storage.format import Keyspace
from tidal_actors.storage.lmdb_lock import LockProbe, attached_process
from tidal_actors.testing import ReferenceModel

from ._setups import rounded_rows
from .conftest import T0
from .test_cli import ROOT
from .test_store_adversarial import CRASH_CFG, CRASH_READS, _crash_workload

pytestmark = pytest.mark.skipif(
    not Path("/proc/locks").exists(), reason="tells a waiting reader from /proc/locks (Linux)"
)

PRELUDE = """
import json, sys
import lmdb
from tidal_actors import ManualClock, TidalDb
path, times = sys.argv[1], json.loads(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
"""

# TidalDb's read-only open: the aggregates at each time
TIDAL = """
with TidalDb.open(path, read_only=True, clock=ManualClock(times[0])) as db:
    rows = [[list(r) for r in db.aggregate_rows(at)] for at in times]
print(json.dumps(rows))
"""

# a process reading the LMDB files itself (a backup, a monitor): what its open gives
RAW_LMDB = """
try:
    env = lmdb.open(path, readonly=True, max_dbs=8, subdir=True, lock=True)
except lmdb.Error as exc:
    print(json.dumps(type(exc).__name__))
else:
    with env.begin() as txn:
        print(json.dumps(txn.stat(env.open_db(b"history", txn=txn))["entries"]))
    env.close()
"""


class Reader:
    """A process that has imported everything and opens ``path`` once told to."""

    def __init__(self, path: Path, body: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + body, str(path), json.dumps(CRASH_READS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        assert self.proc.stdout.readline().strip() == "ready", self.proc.stderr
        self.waited = False

    def release_and_wait_for_lock(self) -> None:
        """Let it open, and return once it waits for a lock (or after 60 s)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            if _waiting_for_a_lock(self.proc.pid):
                self.waited = True
                return
            time.sleep(0.002)

    def result(self) -> Any:
        out, err = self.proc.communicate(timeout=300)
        assert self.proc.returncode == 0, f"the reader failed: {err[-2000:]}"
        return json.loads(out)


def _waiting_for_a_lock(pid: int) -> bool:
    """Whether /proc/locks lists process ``pid`` as blocked on a POSIX lock."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and "POSIX" in fields and str(pid) in fields:
            return True
    return False


def _rounded(rows: list[list[Any]]) -> list[tuple[Any, ...]]:
    return [(r[0], r[1], r[2], round(r[3], 9), r[4], round(r[5], 9)) for r in rows]


def _compact_releasing(db: TidalDb, release: Callable[[], None]) -> dict[str, int]:
    """``db.compact()`` with ``release`` run right after ``lock.mdb`` is voided, while
    the compaction holds LMDB's lock byte and ``data.mdb`` is still the old file."""
    probe = db._core.store._probe
    invalidate = probe.invalidate

    def invalidate_then_release() -> None:
        invalidate()
        release()

    probe.invalidate = invalidate_then_release
    try:
        return db.compact()
    finally:
        probe.invalidate = invalidate


@pytest.fixture
def written(tmp_path: Path, settle_at_once: None) -> tuple[Path, Config, list[Any]]:
    """A store holding `_crash_workload`, and the reference model's rows at each read."""
    path = tmp_path / "s"
    cfg = Config(**CRASH_CFG)
    ref = ReferenceModel(cfg, ManualClock(T0))
    _crash_workload(ref)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        _crash_workload(db, db)
    return path, cfg, [rounded_rows(ref, at) for at in CRASH_READS]


def test_a_read_only_open_caught_in_the_swap_waits_and_reads_the_new_file(written):
    path, cfg, want = written
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        reader = Reader(path, TIDAL)
        sizes = _compact_releasing(db, reader.release_and_wait_for_lock)
        got = reader.result()
        for at, rows in zip(CRASH_READS, want, strict=True):
            assert rounded_rows(db, at) == rows, at
    assert reader.waited  # it was inside the window, not after it
    assert sizes["bytes_after"] < sizes["bytes_before"]  # the file was replaced
    assert [_rounded(rows) for rows in got] == want


def test_an_lmdb_reader_caught_in_the_swap_is_refused_and_the_next_one_reads(written):
    """An LMDB read-only open of its own that started in the swap holds the old file:
    it fails (``MDB_INVALID``) instead of reading it; one opened after the compaction
    reads the new file."""
    path, cfg, _want = written
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        caught = Reader(path, RAW_LMDB)
        late = Reader(path, RAW_LMDB)
        _compact_releasing(db, caught.release_and_wait_for_lock)
        late.release_and_wait_for_lock()
        assert caught.result() == "InvalidError"
        assert late.result() == len(db._core.store.raw_keys(Keyspace.HISTORY)) > 0
    assert caught.waited


def test_a_hard_link_to_the_old_file_stays_whole(written):
    """The old file is voided only once no directory names it: a hard link made
    beforehand (a backup) still holds a store (the history merged by the compaction's
    first step, committed to the old file), read as the reference model's rows."""
    path, cfg, want = written
    backup = path.parent / "backup"
    backup.mkdir()
    os.link(path / "data.mdb", backup / "data.mdb")
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
        sizes = db.compact()
    assert sizes["bytes_after"] < sizes["bytes_before"] == (backup / "data.mdb").stat().st_size
    with TidalDb.open(backup, read_only=True, clock=ManualClock(T0)) as old:
        assert [rounded_rows(old, at) for at in CRASH_READS] == want


def test_a_lock_file_voided_by_an_unfinished_compaction_is_named(written):
    """A compaction that ended after voiding ``lock.mdb``, with another process still
    attached: an open says so (LMDB alone says "not an LMDB file"), and the
    first open after that process has gone rebuilds the lock file and reads."""
    path, cfg, want = written
    holder = Reader(path, "env = lmdb.open(path, readonly=True, max_dbs=8)\nsys.stdin.readline()")
    assert holder.proc.stdin is not None
    holder.proc.stdin.write("go\n")
    holder.proc.stdin.flush()
    deadline = time.monotonic() + 60
    while attached_process(path) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    probe = LockProbe(path)
    try:
        probe.invalidate()
    finally:
        probe.close()
    with pytest.raises(StorageError, match="voided by a compaction that did not finish"):
        TidalDb.open(path, read_only=True, clock=ManualClock(T0))
    with pytest.raises(StorageError, match="voided by a compaction that did not finish"):
        TidalDb.open(path, config=cfg, clock=ManualClock(T0))  # the writer's open too
    holder.proc.stdin.write("done\n")
    holder.proc.stdin.flush()
    assert holder.proc.wait(timeout=300) == 0
    with TidalDb.open(path, read_only=True, clock=ManualClock(T0)) as db:
        assert [rounded_rows(db, at) for at in CRASH_READS] == want
