"""A writer compacting again and again is killed (SIGKILL) at a random moment while
another process opens the store read-only in a loop: every read-only open either
reads a store holding every assign acknowledged before it began or is refused
with a `StorageError` (a lock file voided by the unfinished compaction), never
anything else; and once the readers are gone the store reopens with every
acknowledged assign. Linux (``/proc``), each run bounded to a few seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidal_actors import Config, ManualClock, TidalDb

from .conftest import T0

CFG = Config(rematerialize_after_ms=None)
ROOT = str(Path(__file__).parent.parent)

_WRITER = """
import os, sys
sys.path.insert(0, sys.argv[3])
from tidal_actors import Config, ManualClock, TidalDb
log = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
db = TidalDb.open(sys.argv[1], config=Config(rematerialize_after_ms=None), clock=ManualClock(10**18))
print("open", flush=True)
u = 0
while True:
    db.assign_cohort(u, "k")
    os.write(log, f"{u}\\n".encode())
    u += 1
    if u % 4 == 0:
        try:
            db.compact()
        except StorageError as exc:
            assert "compaction refused" in str(exc), exc
"""

_READER = """
import json, sys, time
sys.path.insert(0, sys.argv[3])
from tidal_actors import ManualClock, StorageError, TidalDb
deadline = time.monotonic() + float(sys.argv[4])
opened = refused = 0
errors = []
while time.monotonic() < deadline:
    with open(sys.argv[2]) as f:
        acked = [int(x) for x in f.read().split()]
    try:
        with TidalDb.open(sys.argv[1], read_only=True, clock=ManualClock(10**18)) as db:
            missing = [u for u in acked[-5:] if db.cohorts_of(u) != frozenset({"k"})]
            if missing:
                errors.append(f"acknowledged before the open, missing: {missing}")
        opened += 1
    except StorageError:
        refused += 1
    except Exception as exc:
        errors.append(repr(exc))
print(json.dumps([opened, refused, errors[:3]]), flush=True)
"""


@pytest.mark.skipif(not Path("/proc").exists(), reason="Linux")
@pytest.mark.parametrize("kill_after_s", [0.3, 1.1, 2.1])
def test_a_compacting_writer_killed_beside_read_only_openers_loses_nothing(
    tmp_path: Path, kill_after_s: float
) -> None:
    path, log = tmp_path / "s", tmp_path / "acked"
    log.write_text("")
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path), str(log), ROOT],
        stdout=subprocess.PIPE,
        text=True,
    )
    reader = None
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "open"
        reader = subprocess.Popen(
            [sys.executable, "-c", _READER, str(path), str(log), ROOT, str(kill_after_s + 1.5)],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(kill_after_s)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=10)
        out, _ = reader.communicate(timeout=60)
    finally:
        writer.kill()
        if reader is not None:
            reader.kill()
    opened, _refused, errors = json.loads(out)
    assert errors == []
    assert opened > 0
    acked = [int(x) for x in log.read_text().split()]
    assert len(acked) > 4  # compactions ran before the kill
    with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as db:
        missing = [u for u in acked if db.cohorts_of(u) != frozenset({"k"})]
        assert missing == []
