"""Reading a store beside its writer (``TidalDb.open(path, read_only=True)``,
``tidal-actors inspect``), the settings a store records, and ``--at``'s forms.

The writer is a real second process that holds the store open (and its
``tidal.lock``) while the tests read. Expected scores are worked out by hand: weight
w at t read at t + k half-lives is ``w * 2 ** -k``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import lmdb
import msgpack
import pytest

from tidal_actors import COMMUNITY, Config, InvalidArgument, ManualClock, StorageError, TidalDb
from tidal_actors.cli import store
from tidal_actors.cli.timepoints import parse_time
from tidal_actors.storage.format import Tag, encode_key

from .test_cli import ROOT, _subprocess_run

H = 3_600 * 10**9
T0 = 1_700_000_000 * 10**9
SETTINGS = Config(
    half_life_ns="1h", window_width_ns="10m", window_buckets=3, rematerialize_after_ms=None
)

WRITER = f"""
import sys
from tidal_actors import Config, ManualClock, TidalDb
cfg = Config(half_life_ns="1h", window_width_ns="10m", window_buckets=3, rematerialize_after_ms=None,
             store_layout=sys.argv[2])
db = TidalDb.open(sys.argv[1], config=cfg, clock=ManualClock({T0}))
for line in sys.stdin:
    cmd = line.split()
    try:
        if cmd[0] == "signal":   # signal USER ENTITY WEIGHT N
            for _ in range(int(cmd[4])):
                db.signal_with_context(int(cmd[1]), int(cmd[2]), 1, float(cmd[3]))
            db.flush()
        elif cmd[0] == "assign":
            db.assign_cohort(int(cmd[1]), cmd[2])
        elif cmd[0] == "compact":
            db.compact()
        elif cmd[0] == "close":
            db.close()
            print("closed", flush=True)
            break
        print("ok", flush=True)
    except Exception as exc:
        print("error", type(exc).__name__, exc, flush=True)
"""


class Writer:
    """A process holding the store open: send it a command, wait for its answer."""

    def __init__(self, path: Path, layout: str = "single") -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), layout],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def __call__(self, *cmd: object) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(" ".join(map(str, cmd)) + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self("close")
        self.proc.wait(60)


@pytest.fixture(params=["single", "shards"])
def writer(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Writer, Path]]:
    """A writer process holding a store open, in each layout (docs/storage-format.md)."""
    path = tmp_path / "store"
    w = Writer(path, request.param)
    try:
        assert w("assign", 1, "readers") == "ok"
        assert w("signal", 1, 7, 2.0, 3) == "ok"  # 3 signals of weight 2.0 at T0, durable
        yield w, path
    finally:
        w.stop()


def _files(path: Path) -> dict[str, tuple[str, int]]:
    """Each file's content hash and modification time (ns), in the store's directory
    and (the shards layout) in each of its environments' directories."""
    return {
        str(f.relative_to(path)): (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_mtime_ns)
        for f in sorted(path.rglob("*"))
        if f.is_file() and f.name != "lock.mdb"
    }


def test_a_read_only_open_reads_a_store_another_process_is_writing(writer) -> None:
    w, path = writer
    before = _files(path)
    with TidalDb.open(path, read_only=True, clock=ManualClock(T0 + H)) as db:
        # the store's own settings (half-life 1h), not the defaults (7 days)
        assert db.config.half_life_ns == H and db.recorded_settings
        assert db.read_decay_score("readers", 7, 1) == 3.0  # 6.0 after one half-life
        assert db.read_decay_score(COMMUNITY, 7, 1, at_ns=T0) == 6.0
        assert db.cohorts_of(1) == {"readers"}
        # a snapshot as of the read: the writer's later signals are not in it
        assert w("signal", 1, 7, 1.0, 4) == "ok"
        assert db.read_window("readers", 7, 1, at_ns=T0).count == 3
        with pytest.raises(StorageError, match="read-only: assign_cohort refused"):
            db.assign_cohort(2, "x")
        with pytest.raises(StorageError, match="read-only: compact refused"):
            db.compact()
    assert {k: v for k, v in _files(path).items() if not k.endswith("data.mdb")} == {
        k: v for k, v in before.items() if not k.endswith("data.mdb")
    }  # tidal.lock untouched (the writer writes the data files)
    with TidalDb.open(path, read_only=True, clock=ManualClock(T0)) as db:  # a new read sees them
        assert db.read_window("readers", 7, 1).count == 7
        assert db.read_decay_score("readers", 7, 1) == 10.0
    # the reader let go of LMDB at once: the writer can still compact
    assert w("compact") == "ok"


def test_a_read_only_open_writes_nothing(tmp_path: Path) -> None:
    """A cleanly closed store (snapshot present) and one with history to replay."""
    path = tmp_path / "s"
    with TidalDb.open(path, config=SETTINGS, clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "a")
        db.signal_with_context(1, 5, 1, 1.0)
        db.request_community_purge(1, "a")  # a rebuild left pending (timer off)
    before = _files(path)
    with TidalDb.open(path, read_only=True, clock=ManualClock(T0)) as db:
        assert db.read_decay_score(COMMUNITY, 5, 1) == 1.0
        assert db.read_decay_score("a", 5, 1) == 0.0
        (m,) = db.list_purge_manifests(1)
        assert not db.purge_status(m.purge_id).rematerialized  # still pending
    assert _files(path) == before  # data.mdb, tidal.lock, tidal.store byte for byte


def test_read_only_needs_a_store(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as err:
        TidalDb.open(None, read_only=True)
    assert err.value.field == "read_only"
    with pytest.raises(StorageError, match="holds no store"):
        TidalDb.open(tmp_path / "nothing", read_only=True)
    assert not (tmp_path / "nothing").exists()  # not created


def test_inspect_reads_a_live_store_and_says_it_is_a_snapshot(writer) -> None:
    w, path = writer
    res = _subprocess_run("inspect", "top", "readers", "--data-dir", path, "--at", T0 + 2 * H)
    assert res.code == 0, res
    assert "entity 7" in res.out and "score 1.5" in res.out  # 6.0 after two half-lives
    assert f"process {w.proc.pid} has {path} open" in res.err
    assert "consistent snapshot of the store as of its read" in res.err
    assert w("signal", 1, 7, 1.0, 1) == "ok"  # the writer goes on


def test_inspect_of_a_replay_still_running_reads_at_its_latest_event(writer) -> None:
    """A replay writes its settings file before its first row, without a last event
    time; inspect then reads at the latest event in the store, not at the wall clock
    (years after the log's events, where every score has decayed to nothing)."""
    _, path = writer
    store.write_state(path, SETTINGS, None, "replay log.csv")
    res = _subprocess_run("inspect", "top", "readers", "--data-dir", path)
    assert res.code == 0, res
    assert f"at {T0} " in res.out and "score 6.0" in res.out, res  # 3 x 2.0 at T0
    res = _subprocess_run("inspect", "top", "readers", "--data-dir", path, "--at", "+1h")
    assert "score 3.0" in res.out, res


# ---------------------------------------------------------------- settings


def _settings_record(path: Path) -> dict[str, object] | None:
    env = lmdb.open(str(path), max_dbs=8, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            raw = txn.get(
                encode_key(0, Tag.STORE_SETTINGS), db=env.open_db(b"meta", txn=txn, create=False)
            )
        return None if raw is None else msgpack.unpackb(raw, strict_map_key=False)
    finally:
        env.close()


def _drop_settings_record(path: Path) -> None:
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.delete(
            encode_key(0, Tag.STORE_SETTINGS), db=env.open_db(b"meta", txn=txn, create=False)
        )
    env.close()


def test_the_store_records_the_settings_its_writer_used(tmp_path: Path) -> None:
    path = tmp_path / "s"
    cfg = SETTINGS.replace(half_life_ns_by_type={2: "30m"}, ledger_shards=3)
    with TidalDb.open(path, config=cfg, clock=ManualClock(T0)):
        pass
    assert _settings_record(path) == {
        "half_life_ns": H,
        "half_life_ns_by_type": [[2, H // 2]],
        "window_width_ns": 600 * 10**9,
        "window_buckets": 3,
        "membership_shards": 1,
        "ledger_shards": 3,
        "max_contribution_log_entries": 5_000_000,
    }
    with TidalDb.open(path, config=Config(half_life_ns="2h"), clock=ManualClock(T0)):
        pass  # a writer with other settings: the record is theirs now
    assert _settings_record(path)["half_life_ns"] == 2 * H  # type: ignore[index]


def test_a_store_without_the_record_still_opens_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with TidalDb.open(path, config=SETTINGS, clock=ManualClock(T0)) as db:
        db.signal_with_context(1, 5, 1, 4.0)
    _drop_settings_record(path)  # as written before stores recorded settings
    with TidalDb.open(
        path, read_only=True, clock=ManualClock(T0 + H), config=Config(half_life_ns="30m")
    ) as db:
        assert not db.recorded_settings
        assert db.read_decay_score(COMMUNITY, 5, 1) == 1.0  # the given half-life: 4 * 2**-2
    res = _subprocess_run("inspect", "cohorts", "--data-dir", path)
    assert res.code == 0, res
    assert "records no settings" in res.err and "the default settings, half-life 7d" in res.err
    assert _settings_record(path) is None  # inspect wrote nothing


def test_a_corrupt_settings_record_is_named(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with TidalDb.open(path, config=SETTINGS, clock=ManualClock(T0)):
        pass
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(
            encode_key(0, Tag.STORE_SETTINGS),
            msgpack.packb({"window_buckets": 0}),
            db=env.open_db(b"meta", txn=txn, create=False),
        )
    env.close()
    with pytest.raises(StorageError, match=r"settings record .* window_buckets=0"):
        TidalDb.open(path, read_only=True)


# ---------------------------------------------------------------- --at


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1535640923830000000", 1535640923830000000),
        ("2018-08-30 14:55:23.830 UTC", 1535640923830000000),  # as the command line prints it
        ("2018-08-30T14:55:23.83Z", 1535640923830000000),
        ("2018-08-30T16:55:23.830+02:00", 1535640923830000000),
        ("2018-08-30", 1535587200 * 10**9),
        ("-1d", 1535640923830000000 - 86_400 * 10**9),
        ("+250ms", 1535640923830000000 + 250_000_000),
    ],
)
def test_time_point_forms(text: str, want: int) -> None:
    assert parse_time(text, "--at", 1535640923830000000) == want


@pytest.mark.parametrize("text", ["-1", "yesterday", "2018-13-01", "1969-12-31", "+1x"])
def test_bad_time_points_name_the_option_and_value(text: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_time(text, "--at", 0)
    assert err.value.field == "--at" and err.value.value == text


def test_inspect_at_takes_dates_and_offsets(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with TidalDb.open(path, config=SETTINGS, clock=ManualClock(T0)) as db:
        db.signal_with_context(1, 5, 1, 8.0)
    iso = "2023-11-14 22:13:20.000 UTC"  # T0
    assert parse_time(iso) == T0
    by_ns = _subprocess_run("inspect", "top", COMMUNITY, "--data-dir", path, "--at", T0 + 3 * H)
    by_date = _subprocess_run(
        "inspect", "top", COMMUNITY, "--data-dir", path, "--at", "2023-11-15T01:13:20Z"
    )
    assert by_ns.code == 0 and "score 1.0" in by_ns.out, by_ns  # 8 * 2**-3
    assert by_date.out == by_ns.out
    bad = _subprocess_run("inspect", "top", COMMUNITY, "--data-dir", path, "--at", "soon")
    assert bad.code == 2 and "invalid --at='soon'" in bad.err


def test_a_second_writer_is_refused_naming_the_process_that_has_the_store(writer) -> None:
    w, path = writer
    from tidal_actors import DatabaseLocked

    with pytest.raises(
        DatabaseLocked, match=rf"is open in another process \(process {w.proc.pid}\)"
    ):
        TidalDb.open(path, config=SETTINGS)
    assert w("signal", 1, 7, 1.0, 1) == "ok"  # the writer goes on
