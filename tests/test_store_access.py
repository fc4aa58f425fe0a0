"""Opening a store the file system does not let us open: the error names the
directory and the access each kind of open needs (a read-only open writes LMDB's
reader table in ``lock.mdb``); a path that is a file is said to be one; ``inspect``
of a directory that holds no store names the file that marks one.

As root, ``chmod`` does not refuse anything: then the file system's refusal is
simulated (``lmdb.open`` raising what py-lmdb raises for ``EACCES``), and only the
message is checked.
"""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import pytest

from tidal_actors import Config, ManualClock, StorageError, TidalDb

from .test_cli import _subprocess_run

ROOT_USER = os.geteuid() == 0
T0 = 1_700_000_000 * 10**9
CFG = Config(rematerialize_after_ms=None)


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "c")
    return path


def _refuse_lmdb(monkeypatch: pytest.MonkeyPatch, exc: Exception) -> None:
    def refused(*_: object, **__: object) -> None:
        raise exc

    monkeypatch.setattr(lmdb, "open", refused)


@pytest.mark.parametrize(
    "refusal",
    [
        lambda p: lmdb.ReadonlyError(f"{p}: Permission denied"),  # what py-lmdb raises
        lambda p: PermissionError(13, "Permission denied", str(p / "lock.mdb")),
    ],
)
def test_a_refused_read_only_open_says_what_access_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal
) -> None:
    path = _store(tmp_path)
    _refuse_lmdb(monkeypatch, refusal(path))
    with pytest.raises(StorageError) as err:
        TidalDb.open(path, read_only=True)
    text = str(err.value)
    assert "Permission denied" in text
    assert f"write access to {path / 'lock.mdb'}" in text
    assert f"read access to {path / 'data.mdb'}" in text


def test_a_refused_writer_open_says_what_access_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _store(tmp_path)
    _refuse_lmdb(monkeypatch, lmdb.ReadonlyError(f"{path}: Permission denied"))
    with pytest.raises(StorageError) as err:
        TidalDb.open(path, config=CFG)
    assert f"write access to the directory {path}" in str(err.value)
    # the failed open let go of the directory: it opens once the access is there
    monkeypatch.undo()
    TidalDb.open(path, config=CFG, clock=ManualClock(T0)).close()


def test_other_lmdb_errors_keep_their_own_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _store(tmp_path)
    _refuse_lmdb(monkeypatch, lmdb.InvalidError(f"{path}: MDB_INVALID: File is not an LMDB file"))
    with pytest.raises(StorageError) as err:
        TidalDb.open(path, read_only=True)
    assert "MDB_INVALID" in str(err.value) and "access" not in str(err.value)


@pytest.mark.skipif(ROOT_USER, reason="as root, chmod does not refuse anything")
def test_a_read_only_open_of_a_store_without_write_access_to_lock_mdb(tmp_path: Path) -> None:
    path = _store(tmp_path)
    (path / "lock.mdb").chmod(0o444)
    path.chmod(0o555)
    try:
        with pytest.raises(StorageError) as err:
            TidalDb.open(path, read_only=True)
        assert f"write access to {path / 'lock.mdb'}" in str(err.value)
        res = _subprocess_run("inspect", "--data-dir", path, "users")
        assert res.code == 1 and "lock.mdb" in res.err, res
    finally:
        path.chmod(0o755)
        (path / "lock.mdb").chmod(0o644)
    with TidalDb.open(path, read_only=True) as db:  # with the access, it reads
        assert db.cohorts_of(1) == frozenset({"c"})


@pytest.mark.parametrize("read_only", [False, True])
def test_opening_a_file_says_it_is_a_file(tmp_path: Path, read_only: bool) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a store")
    with pytest.raises(StorageError, match="is a file, not a directory"):
        TidalDb.open(afile, read_only=read_only)
    assert afile.read_text() == "not a store"


def test_inspect_of_a_directory_of_other_files_names_the_store_marker(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    res = _subprocess_run("inspect", "--data-dir", tmp_path, "users")
    assert res.code == 2
    assert "not a tidal_actors data directory" in res.err and "tidal.store" in res.err
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # nothing made there
