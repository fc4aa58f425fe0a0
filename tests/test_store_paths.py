"""A path inside a store of the ``shards`` layout given where a store goes (issue 18):
``<store>/shards/ledger-1`` and its siblings are LMDB environments with a marker of
their own, and opening one used to call the store damaged ("holds no format record:
its data file was emptied or replaced"), with ``inspect`` exiting 1 as if the run had
failed. Each is refused, for writing and reading, naming the store's directory to
open instead; the command line exits 2 (bad input); nothing is written.

The expected messages are built here from the paths the test made.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidal_actors import Config, ManualClock, StorageError, TidalDb
from tidal_actors.eventlog.log import HEADER

from .conftest import T0
from .test_cli import _subprocess_run

ENVS = ["coordinator", "membership-0", "membership-1", "ledger-0", "ledger-1"]


def _cfg() -> Config:
    return Config(membership_shards=2, ledger_shards=2, store_layout="shards")


def _seeded(path: Path) -> None:
    """A ``shards`` store: users 0..7 in cohort c<u>, one signal each of weight 1."""
    with TidalDb.open(path, config=_cfg(), clock=ManualClock(T0)) as db:
        for u in range(8):
            db.assign_cohort(u, f"c{u}")
            db.signal_with_context(u, 3, 1, 1.0, T0)


def _files(path: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``path``: its size and modification time (ns)."""
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != "lock.mdb"  # LMDB's reader table, touched by reads
    }


@pytest.mark.parametrize("env", ENVS)
def test_an_environment_opened_as_a_store_names_the_store(tmp_path: Path, env: str) -> None:
    path = tmp_path / "s"
    _seeded(path)
    before = _files(path)
    where = path / "shards" / env
    for read_only in (False, True):
        with pytest.raises(StorageError) as info:
            TidalDb.open(where, config=_cfg(), clock=ManualClock(T0), read_only=read_only)
        msg = str(info.value)
        assert msg == (
            f"{where} is one environment ({env}) of the store at {path}, not a store: "
            f"open {path}; nothing was written"
        )
        assert "damaged" not in msg and "emptied" not in msg
    assert _files(path) == before
    with TidalDb.open(path, config=_cfg(), clock=ManualClock(T0), read_only=True) as db:
        assert [db.read_decay_score(f"c{u}", 3, 1, T0) for u in range(8)] == [1.0] * 8


def test_a_relative_path_names_the_store_as_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From inside ``<store>/shards`` the store is ``..``; from the store's parent it
    is the relative name given."""
    path = tmp_path / "s"
    _seeded(path)
    monkeypatch.chdir(path / "shards")
    with pytest.raises(StorageError, match=r"^ledger-1 is one environment \(ledger-1\) of the "):
        TidalDb.open("ledger-1", config=_cfg(), read_only=True)
    with pytest.raises(StorageError) as info:
        TidalDb.open("ledger-1", config=_cfg(), read_only=True)
    assert str(info.value).endswith(
        f"store at {os.pardir}, not a store: open {os.pardir}; nothing was written"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError) as info:
        TidalDb.open(os.path.join("s", "shards"), config=_cfg())
    assert str(info.value) == (
        f"{os.path.join('s', 'shards')} holds the environments of the store at s: "
        "open that directory; nothing was written"
    )


def test_a_directory_named_like_an_environment_elsewhere_is_a_store(tmp_path: Path) -> None:
    """Only a directory inside ``<store>/shards`` (beside the coordinator's
    environment) is refused: a store of its own named ``ledger-1`` opens."""
    path = tmp_path / "shards" / "ledger-1"  # no coordinator beside it
    with TidalDb.open(path, config=Config(store_layout="single"), clock=ManualClock(T0)) as db:
        db.assign_cohort(1, "c")
        db.signal_with_context(1, 3, 1, 2.0, T0)
    with TidalDb.open(path, config=Config(), clock=ManualClock(T0), read_only=True) as db:
        assert db.read_decay_score("c", 3, 1, T0) == 2.0


@pytest.mark.parametrize("env", ["ledger-1", "coordinator", "."])
def test_the_command_line_refuses_an_environment_with_exit_2(tmp_path: Path, env: str) -> None:
    path = tmp_path / "s"
    _seeded(path)
    before = _files(path)
    where = (path / "shards" / env) if env != "." else path / "shards"
    if env == ".":
        want = (
            f"--data-dir {where} holds the environments of the store at {path}: open that directory"
        )
    else:
        want = (
            f"--data-dir {where} is one environment ({env}) of the store at {path}, "
            f"not a store: open {path}"
        )
    log = tmp_path / "log.csv"
    log.write_text(",".join(HEADER) + "\n")
    for args in (
        ["inspect", "users", "--data-dir", where],
        ["inspect", "--data-dir", where, "cohorts"],
        ["--data-dir", where, "inspect", "user", "1"],
        ["replay", log, "--append", "--data-dir", where],
    ):
        res = _subprocess_run(*args)
        assert res.code == 2, res
        assert res.err.strip() == f"tidal-actors: error: {want}", res
        assert res.out == ""
    assert _files(path) == before
    res = _subprocess_run("inspect", "users", "--data-dir", path)
    assert res.code == 0, res
    assert res.out.startswith("8 users: 8 active, 0 left"), res.out


def test_a_link_to_an_environment_names_the_store(tmp_path: Path) -> None:
    """A symbolic link to ``<store>/shards/ledger-1`` is that environment: refused
    the same way (exit 2 on the command line), naming the store the link leads to."""
    path = tmp_path / "s"
    _seeded(path)
    before = _files(path)
    link = tmp_path / "l1link"
    link.symlink_to(path / "shards" / "ledger-1")
    real = os.path.realpath(path)
    with pytest.raises(StorageError) as info:
        TidalDb.open(link, config=_cfg(), clock=ManualClock(T0), read_only=True)
    assert str(info.value) == (
        f"{link} is one environment (ledger-1) of the store at {real}, not a store: "
        f"open {real}; nothing was written"
    )
    res = _subprocess_run("inspect", "users", "--data-dir", link)
    assert res.code == 2 and res.out == "", res
    assert res.err.strip() == (
        f"tidal-actors: error: --data-dir {link} is one environment (ledger-1) of the "
        f"store at {real}, not a store: open {real}"
    ), res
    assert _files(path) == before


@pytest.mark.parametrize("under", [["new"], ["ledger-1", "sub"], ["new", "deeper"]])
def test_no_store_is_made_inside_a_stores_shards(tmp_path: Path, under: list[str]) -> None:
    """A new store in ``<store>/shards/...`` (any depth) would sit among the store's
    environments: refused, naming the store, and nothing is made."""
    path = tmp_path / "s"
    _seeded(path)
    before = _files(path)
    where = path.joinpath("shards", *under)
    want = (
        f"{where} is inside the shards directory of the store at {path}, not a store: "
        f"open {path}, or make a new store outside it"
    )
    with pytest.raises(StorageError) as info:
        TidalDb.open(where, config=_cfg(), clock=ManualClock(T0))
    assert str(info.value) == f"{want}; nothing was written"
    res = _subprocess_run("simulate", "--data-dir", where)
    assert res.code == 2 and res.err.strip() == f"tidal-actors: error: --data-dir {want}", res
    assert not where.exists()
    assert _files(path) == before
