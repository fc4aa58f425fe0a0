"""Issue 2 "failure cases seen in the field", one test each."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tidal_actors import (
    COMMUNITY,
    Config,
    DatabaseLocked,
    InvalidArgument,
    PurgeId,
    TidalDb,
)

from .conftest import T0


def test_good_bad_good_reads_three_with_every_shard_alive(db):
    db.assign_cohort(1, "c")
    db.signal_with_context(1, 1, 1, 1.0)
    with pytest.raises(InvalidArgument):
        db.signal_with_context(1, 1, 1, "heavy")
    db.signal_with_context(1, 1, 1, 2.0)
    assert db.read_decay_score("c", 1, 1) == 3.0
    assert all(t.is_alive() for t in _actor_threads())
    assert db.stats()["handler_errors"] == 0


def _actor_threads():
    import threading

    return [t for t in threading.enumerate() if t.name.startswith("tidal-")]


def test_a_failing_handler_is_counted_and_the_actor_keeps_serving(db):
    # a message no behaviour understands, sent straight to a ledger shard's mailbox
    db._core.host.tell(("ledger", 0), "not a message")
    db._core.host.tell(("membership", 0), object())
    db.signal_with_context(1, 1, 1, 1.0)
    assert db.read_decay_score(COMMUNITY, 1, 1) == 1.0
    assert db.stats()["handler_errors"] == 2


def test_purge_id_is_16_bytes_and_round_trips(pdb_path, clock):
    with TidalDb.open(pdb_path, clock=clock) as db:
        pid, m = db.request_community_purge(1, "c")
    assert int(pid) >= 2**64  # wider than a msgpack int
    assert pid.to_bytes16() == int(pid).to_bytes(16, "big")
    with TidalDb.open(pdb_path, clock=clock) as db:
        [m2] = db.list_purge_manifests(1)
    assert m2 == m and isinstance(m2.purge_id, PurgeId) and isinstance(m2.entries, tuple)


def test_purge_id_reads_the_hex_form_it_prints_and_refuses_bad_values():
    pid = PurgeId((1_700_000_000 * 10**9 << 64) | 7)
    printed = str(pid)
    assert printed == f"{(1_700_000_000 * 10**9 << 64) | 7:032x}" and len(printed) == 32
    assert PurgeId(printed) == pid and PurgeId("0x" + printed.upper()) == pid
    assert PurgeId(np.uint64(5)) == 5 and type(PurgeId(5)) is PurgeId
    for bad, says in (
        ("abc", "32 hexadecimal digits"),
        ("g" * 32, "32 hexadecimal digits"),
        (b"\x00" * 16, "not bytes"),
        (True, "not bool"),
        (2.0, "not float"),
        (-1, "[0, 2**128)"),
        (2**128, "[0, 2**128)"),
    ):
        with pytest.raises(InvalidArgument, match="purge_id") as err:
            PurgeId(bad)
        assert says in str(err.value) and err.value.value == bad


def test_purge_status_takes_the_id_parsed_from_its_printed_form(db):
    db.assign_cohort(1, "c")
    for entity in (1, 2):
        db.signal_with_context(1, entity, 1, 1.0)
    pid, manifest = db.request_community_purge(1, "c")
    status = db.purge_status(PurgeId(str(pid)))
    assert (status.purge_id, status.user_id, status.cohort) == (pid, 1, "c")
    assert status.retracted_live == len(manifest.entries) == 2


def test_lmdb_environment_flags_are_fully_durable(pdb_path):
    with TidalDb.open(pdb_path) as db:
        flags = db.lmdb_flags()
    assert flags["sync"] is True and flags["metasync"] is True
    assert flags["writemap"] is False and flags["map_async"] is False


def test_same_directory_twice_in_one_process_is_refused_then_reopens(pdb_path):
    db = TidalDb.open(pdb_path)
    with pytest.raises(DatabaseLocked, match="already open"):
        TidalDb.open(pdb_path)
    db.close()
    with TidalDb.open(pdb_path) as db2:
        assert db2.stats()["signals"] == 0


def test_same_directory_from_another_process_is_refused(pdb_path):
    code = textwrap.dedent(
        """
        import sys
        from tidal_actors import TidalDb, DatabaseLocked
        try:
            TidalDb.open(sys.argv[1])
        except DatabaseLocked as e:
            print("locked:", e)
        """
    )
    with TidalDb.open(pdb_path):
        out = subprocess.run(
            [sys.executable, "-c", code, pdb_path], capture_output=True, text=True, timeout=60
        )
    assert out.stdout.startswith("locked:"), out.stderr


def test_close_flushes_buffered_signals_before_stopping(pdb_path, clock):
    with TidalDb.open(pdb_path, clock=clock) as db:
        for i in range(100):
            db.signal_with_context(1, i % 3, 1, 1.0, timestamp_ns=T0)
    with TidalDb.open(pdb_path, clock=clock) as db:
        assert sum(r[4] for r in db.aggregate_rows(T0)) == 100


def test_crash_without_close_restores_flushed_state_from_history(pdb_path):
    """No snapshot after a crash: the history replay gives the same aggregates
    (to float rounding) and never brings back purged contributions."""
    code = textwrap.dedent(
        f"""
        import os, sys
        from tidal_actors import TidalDb, ManualClock, Config
        db = TidalDb.open(sys.argv[1], config=Config(half_life_ns=10**10), clock=ManualClock({T0}))
        db.assign_cohort(1, "c"); db.assign_cohort(2, "c")
        db.signal_with_context(1, 7, 1, 1.0)
        db.signal_with_context(2, 7, 1, 2.0, timestamp_ns={T0 - 10**10})
        db.request_community_purge(1, "c")
        db.flush()
        os._exit(0)   # no close: the process dies here
        """
    )
    subprocess.run([sys.executable, "-c", code, pdb_path], check=True, timeout=60)
    with TidalDb.open(pdb_path, config=Config(half_life_ns=10**10)) as db:
        # B's 2.0, one half-life old, remains; A's contribution is gone
        assert db.read_decay_score("c", 7, 1, T0) == pytest.approx(1.0, rel=1e-12)
        assert db.read_decay_score(COMMUNITY, 7, 1, T0) == pytest.approx(2.0, rel=1e-12)
        assert len(db.list_purge_manifests(1)[0].entries) == 1


@pytest.mark.parametrize("bad", [1.5, -1, True, 2**63, "5"])
def test_manual_clock_checks_its_time(bad) -> None:  # type: ignore[no-untyped-def]
    from tidal_actors import InvalidArgument, ManualClock

    with pytest.raises(InvalidArgument, match="start_ns"):
        ManualClock(bad)
    clock = ManualClock(5)
    with pytest.raises(InvalidArgument, match="now_ns"):
        clock.set(bad)
    assert clock.now_ns() == 5
    with pytest.raises(InvalidArgument):
        clock.advance(-6)
    assert clock.now_ns() == 5 and clock.advance(-5) == 0
