"""The Ray host (`runtime.ray_host`): selection, and the behaviours run unchanged in
Ray actors, checked against the reference model and against the pykka host.

One local Ray instance serves the whole test session (`ray_session`, 2 CPUs, no
dashboard); each database opened on it starts its own actors. Skipped, with the
reason, where Ray is not installed.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tidal_actors import Config, InvalidArgument, ManualClock, TidalDb
from tidal_actors.cli import commands as cli_module
from tidal_actors.runtime import hosts
from tidal_actors.testing import ReferenceModel

from ._differential import assert_matches, random_op, rows_mismatch
from ._ray import needs_ray, ray_config
from .conftest import SEC, T0

SCENARIOS = Path(__file__).resolve().parent.parent / "tidal_actors" / "scenarios"


# -- selection --------------------------------------------------------------------


def test_host_and_ray_address_are_checked_and_read_from_toml(tmp_path: Path) -> None:
    assert Config().host == "pykka" and Config().ray_address is None
    assert Config(host="ray", ray_address="auto").ray_address == "auto"
    assert Config(host="ray", ray_address="ray://head:10001").ray_address == "ray://head:10001"
    assert Config(host="ray", ray_address="10.0.0.2:6379").ray_address == "10.0.0.2:6379"
    assert Config(host="ray", ray_address="local").ray_address == "local"
    with pytest.raises(InvalidArgument) as err:
        Config(host="dask")
    assert (err.value.field, err.value.value) == ("host", "dask")
    for bad in ("ray://", "head", "head:port", 6379, "LOCAL", " local"):
        with pytest.raises(InvalidArgument) as err:
            Config(ray_address=bad)
        assert (err.value.field, err.value.value) == ("ray_address", bad)
    toml = tmp_path / "c.toml"
    toml.write_text('[runtime]\nhost = "ray"\nray_address = "auto"\n')
    assert Config.from_toml(toml) == Config(host="ray", ray_address="auto")
    toml.write_text('[runtime]\nhost = "ray"\nray_address = false\n')
    assert Config.from_toml(toml).ray_address is None


def test_host_ray_without_ray_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        hosts.importlib.util, "find_spec", lambda name: None if name == "ray" else real(name)
    )
    with pytest.raises(InvalidArgument) as err:
        TidalDb.open(config=Config(host="ray"))
    assert err.value.field == "host" and "pip install -e '.[ray]'" in str(err.value)


def test_the_cli_refuses_an_unknown_host() -> None:
    res = CliRunner().invoke(cli_module.cli, ["simulate", "--host", "dask"])
    assert res.exit_code == 2 and "dask" in res.output


# -- the behaviours through Ray ---------------------------------------------------------


# of random_op's draws: 62 % signals, 10 % assigns, 4 % unassigns, 6 % leaves, 5 %
# rejoins, 8 % purges, 5 % clock moves
RAY_MIX = (
    (0.62, "signal"),
    (0.72, "assign"),
    (0.76, "unassign"),
    (0.82, "leave"),
    (0.87, "rejoin"),
    (0.95, "purge"),
    (1.0, "advance"),
)


@needs_ray
@pytest.mark.parametrize("persistent", [False, True], ids=["ephemeral", "persistent"])
def test_seeded_workload_through_ray_matches_the_reference(
    ray_session: None, persistent: bool, tmp_path: Path
) -> None:
    seed = 11 + persistent
    rng = random.Random(seed)
    cfg = ray_config(membership_shards=2, ledger_shards=2, max_contribution_log_entries=40)
    clock, rclock = ManualClock(T0), ManualClock(T0)
    ref = ReferenceModel(cfg, rclock, history=persistent)
    path = str(tmp_path / "store") if persistent else None
    db = TidalDb.open(path, config=cfg, clock=clock)
    try:
        for step in range(240):
            random_op(db, ref, rng, (clock, rclock), RAY_MIX)
            if persistent and step in (80, 160):  # a clean close, then a reopen on Ray
                db.close()
                db = TidalDb.open(path, config=cfg, clock=clock)
            if step % 60 == 59:
                bad = rows_mismatch(db.aggregate_rows(), ref.aggregate_rows())
                assert bad is None, f"step {step}: {bad}"
        db.flush()
        assert_matches(db, ref, range(6), ats=(None, T0 + 17 * SEC))
        if not persistent:  # stats() counts since the open
            s, rs = db.stats(), ref.stats()
            for k in ("signals", "forwarded", "gated", "records", "purges", "retracted"):
                assert s[k] == rs[k], k
    finally:
        db.close()
    if persistent:  # and the store it left reads back the same under the pykka host
        with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
            assert_matches(again, ref, range(6), ats=(None,))


@needs_ray
def test_a_purge_through_ray_retracts_exactly_the_users_records(ray_session: None) -> None:
    cfg = ray_config(membership_shards=2, ledger_shards=2)
    clock = ManualClock(T0)
    with TidalDb.open(config=cfg, clock=clock) as db:
        for u in (1, 2, 3):
            db.assign_cohort(u, "c")
        sent = {1: [], 2: [], 3: []}  # user -> (entity, weight, ts) in submission order
        for i in range(300):
            u, e, w, ts = 1 + i % 3, i % 4, (1.0, 2.0, 0.5)[i % 3], T0 - i * SEC
            db.signal_with_context(u, e, 1, w, ts)
            sent[u].append((e, w, ts))
        pid, manifest = db.request_community_purge(2, "c")
        # the manifest lists user 2's records, each once, in the order they were sent
        assert [(r.entity_id, r.weight, r.timestamp_ns) for r in manifest.entries] == sent[2]
        assert all(r.user_id == 2 and r.cohort == "c" for r in manifest.entries)
        assert manifest.evicted == 0
        assert db.purge_status(pid).retracted_live == 100
        # the others' weight is untouched: each entity's window weight is the sum of
        # theirs in the window's buckets (width 10 s, 4 buckets: b(ts) >= b(at) - 3)
        at, width = T0 + 1, 10 * SEC
        rows = {(c, e): w for c, e, t, s, n, w in db.aggregate_rows(at) if c == "c"}
        for e in range(4):
            want = sum(
                w
                for u in (1, 3)
                for ee, w, ts in sent[u]
                if ee == e and ts // width >= at // width - 3
            )
            assert rows.get(("c", e), 0.0) == pytest.approx(want, abs=1e-12)
        assert [m.purge_id for m in db.list_purge_manifests(2)] == [pid]


@needs_ray
def test_leave_gates_what_follows_through_ray(ray_session: None) -> None:
    clock = ManualClock(T0)
    with TidalDb.open(config=ray_config(), clock=clock) as db:
        db.assign_cohort(5, "g")
        db.signal_with_context(5, 1, 1, 2.0, T0)
        db.leave_community_layer(5)
        for _ in range(10):  # submitted after the leave returned: gated, every one
            db.signal_with_context(5, 1, 1, 2.0, T0)
        db.rejoin_community_layer(5)
        db.signal_with_context(5, 1, 1, 0.5, T0)
        assert db.read_window("g", 1, 1, T0).weight == 2.5
        s = db.stats()
        assert (s["signals"], s["gated"], s["forwarded"]) == (12, 10, 2)
        # an ephemeral database has no environment to compact, under either host
        assert db.compact() == {"bytes_before": 0, "bytes_after": 0}


# -- the command line: the same results as the pykka host -------------------------------


def _cli(*args: object) -> Any:
    res = CliRunner().invoke(cli_module.cli, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res


@needs_ray
def test_simulate_and_replay_on_ray_give_the_pykka_hosts_results(
    ray_session: None, tmp_path: Path
) -> None:
    reports, scores = {}, {}
    events = tmp_path / "events.csv"
    for host in ("pykka", "ray"):
        report = tmp_path / f"sim-{host}.json"
        out = ["--events-out", events] if host == "pykka" else []
        res = _cli(
            "simulate", "--scenario", "small", "--scale", 0.3, "--host", host, "-q",
            "--data-dir", tmp_path / f"sim-{host}", "--report-out", report, *out,
        )  # fmt: skip
        assert "check      OK" in res.output
        reports[host] = json.loads(report.read_text())
    for key in ("signals", "mismatches", "aggregate_rows", "purges", "manifests_compared"):
        assert reports["ray"][key] == reports["pykka"][key], key
    assert reports["ray"]["check_ok"]
    # what the runs computed; not how they grouped commits, held detail rows or laid
    # out the log's index (commits, detail_rows, settled_buckets, log_bytes: timing)
    counted = ("signals", "forwarded", "gated", "records", "records_in", "retracted",
               "log_records", "keys", "purges", "handler_errors", "failed_writes")  # fmt: skip
    for key in counted:
        assert reports["ray"]["stats"][key] == reports["pykka"]["stats"][key], key
    assert reports["ray"]["reopen_differences"] == reports["pykka"]["reopen_differences"]
    for host in ("pykka", "ray"):
        scores[host] = tmp_path / f"scores-{host}.csv"
        _cli("replay", events, "--host", host, "-q", "--scores-out", scores[host])
    # the same rows; floats to 1e-9 relative (batch boundaries, which set the order of
    # the sums, follow the flusher's timing under either host)
    got, want = (_score_rows(scores[h]) for h in ("ray", "pykka"))
    assert len(got) == len(want) > 0
    assert rows_mismatch(got, want) is None


def _score_rows(path: Path) -> list[tuple[Any, ...]]:
    """``--scores-out``'s rows as (cohort, entity, type, score, count, weight)."""
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[1:]
    return [(c, int(e), int(t), float(s), int(n), float(w)) for c, e, t, s, n, w in rows]


@needs_ray
def test_the_asyncio_facade_waits_for_room_through_ray(ray_session: None) -> None:
    """A nonblocking core (offer, when_room) over small windows and mailboxes: every
    signal arrives, none is dropped, and the sums are the reference model's."""
    import asyncio

    from tidal_actors import open_tidal

    cfg = ray_config(membership_shards=2, mailbox_capacity=2, signal_batch_size=16)
    model = ReferenceModel(cfg, ManualClock(T0))

    async def main() -> tuple[Any, dict[str, int]]:
        async with open_tidal(None, config=cfg, clock=ManualClock(T0)) as db:
            for u in range(8):
                await db.assign_cohort(u, f"c{u % 3}")
                model.assign_cohort(u, f"c{u % 3}")
            for i in range(3000):
                args = (i % 8, i % 11, 1, 1.0 + i % 3, T0 - i * SEC)
                await db.signal_with_context(*args)
                model.signal_with_context(*args)
            await db.flush()
            return await db.aggregate_rows(), await db.stats()

    rows, stats = asyncio.run(main())
    assert stats["signals"] == 3000 and stats["records"] == model.stats()["records"]
    assert rows_mismatch(rows, model.aggregate_rows()) is None


@needs_ray
def test_a_failed_durable_shard_is_fenced_and_reported(ray_session: None, tmp_path: Path) -> None:
    """A ledger whose handler raises something unexpected is fenced (this host does
    not restart shards): the failure reaches the facade's fault reports, and a flush
    through the fenced shard fails instead of serving half-updated state."""
    from tidal_actors import ActorFailure, StorageError
    from tidal_actors.actors import messages as M

    path = str(tmp_path / "store")
    with (
        pytest.raises(StorageError, match="closed with a fenced shard"),
        TidalDb.open(path, config=ray_config(), clock=ManualClock(T0)) as db,
    ):
        db.assign_cohort(1, "a")
        db.signal_with_context(1, 1, 1, 1.0, T0)
        db.flush()
        for ledger in ((M.LEDGER, 0), (M.LEDGER, 1)):
            db._core.host.tell(ledger, M.Tick())  # a ledger has no handler for it
        with pytest.raises(ActorFailure, match="fenced"):
            db.flush()
        reports = db._core.fault_reports()
        assert {r.address for r in reports} == {(M.LEDGER, 0), (M.LEDGER, 1)}
        assert {r.action for r in reports} == {"fenced"}
    # close() said so; the store holds what was committed before the failure
    with TidalDb.open(path, config=ray_config(host="pykka"), clock=ManualClock(T0)) as again:
        assert again.read_window("a", 1, 1, T0).weight == 1.0


@needs_ray
def test_a_killed_persistence_process_fails_calls_instead_of_hanging(
    ray_session: None, tmp_path: Path
) -> None:
    """SIGKILL of persistence's process (nothing restarts it under this host; the
    shards and the coordinator restart, tests/test_ray_restart.py and
    tests/test_ray_membership_restart.py): the calls waiting and the calls after fail
    with an error saying they may have been applied; close() refuses to write a
    snapshot from the lost actor; the store keeps everything flushed before the
    kill."""
    import os
    import signal

    from tidal_actors import ActorFailure, StorageError
    from tidal_actors.actors import messages as M

    path = str(tmp_path / "store")
    with (
        pytest.raises(
            StorageError, match=r"closed with a fenced shard \(persistence\[0\]'s process died"
        ),
        TidalDb.open(path, config=ray_config(), clock=ManualClock(T0)) as db,
    ):
        for u in range(4):
            db.assign_cohort(u, "a")
            db.signal_with_context(u, 1, 1, 1.0, T0)
        db.flush()
        os.kill(db._core.host.pids()[M.PERSIST_ADDR], signal.SIGKILL)
        with pytest.raises(ActorFailure, match="may have been applied"):
            for _ in range(100):  # calls until the death is seen
                db.community_layer_status(0)
                db.community_layer_status(1)
    with TidalDb.open(path, config=ray_config(host="pykka"), clock=ManualClock(T0)) as again:
        assert again.read_window("a", 1, 1, T0).weight == 4.0


@needs_ray
def test_the_store_grows_and_ledgers_read_their_history_from_their_processes(
    ray_session: None, tmp_path: Path
) -> None:
    """A map that must grow many times (persistence grows it in its process; the
    ledgers' read-only views and the facade's adopt the new size), and rebuilds that
    read the history back in the ledgers' processes: the same reports and rows as
    the pykka host, and the store it leaves reads back the same."""
    from tidal_actors import Signal, StorageError

    def run(host: str) -> tuple[Any, ...]:
        cfg = ray_config(
            host=host, map_size_bytes=65_536, max_contribution_log_entries=2_000, ledger_shards=2
        )
        path = str(tmp_path / host)
        with TidalDb.open(path, config=cfg, clock=ManualClock(T0)) as db:
            for u in range(50):
                db.assign_cohort(u, f"c{u % 3}")
            for k in range(12):
                db.signal_batch(
                    [Signal(i % 50, i % 97, 1, 1.0, T0 - (k * 1000 + i) * SEC) for i in range(1000)]
                )
            _, manifest = db.request_community_purge(7, "c1")
            report = db.rematerialize("c1")
            rows = db.aggregate_rows(T0)
            if host == "ray":  # other processes hold the environment open
                with pytest.raises(StorageError, match="compact under the pykka host"):
                    db.compact()
        with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=ManualClock(T0)) as again:
            assert again.aggregate_rows(T0) == rows
        return (len(manifest.entries), manifest.evicted, report.records_read,
                report.records_excluded, rows)  # fmt: skip

    ray_run, pykka_run = run("ray"), run("pykka")
    assert ray_run == pykka_run
    assert ray_run[1] > 0  # the purge covered records the log had evicted: read from the history
    # the Ray host's default layout: one environment per shard, the history in the ledgers'
    history = [tmp_path / "ray" / "shards" / f"ledger-{j}" / "data.mdb" for j in range(2)]
    assert sum(f.stat().st_size for f in history) > 16 * 65_536  # grew from 64 KiB
    assert not (tmp_path / "ray" / "data.mdb").exists()


@needs_ray
def test_calls_carry_link_numbers_and_a_receiver_takes_each_once(ray_session: None) -> None:
    """Every call carries its sender's number on the link; the receiver acknowledges
    what it took (the sender then keeps nothing), discards a duplicate, holds back a
    call after a gap until the missing one comes."""
    import ray

    from tidal_actors import COMMUNITY
    from tidal_actors.actors import messages as M
    from tidal_actors.runtime.ray_stores import Marks

    with TidalDb.open(None, config=ray_config(ledger_shards=2), clock=ManualClock(T0)) as db:
        for u in range(6):
            db.signal_with_context(u, 1, 1, 1.0, T0)
        db.flush()
        links = db._core.host.links
        for address in db._core.host.behaviours:
            assert links.kept(address) == 0, address
        ledger = links.handle((M.LEDGER, 0))
        # a probe link of its own; Marks is a host-level message an ephemeral ledger ignores
        epoch = db._core.host.opened  # the first incarnation's
        acks = [
            ray.get(ledger.deliver.remote(None, "probe", epoch, seq, [Marks(0, 0)]))
            for seq in (1, 1, 3, 2)
        ]
        # duplicate: 1 again; gap: held; filled: 3 (an ephemeral ledger reports none durable)
        assert acks == [(epoch, 1, []), (epoch, 1, []), (epoch, 1, []), (epoch, 3, [])]
        # a call numbered for another incarnation of the receiver is discarded
        assert ray.get(ledger.deliver.remote(None, "probe", epoch + 1, 4, [Marks(0, 0)])) is None
        assert db.read_window(COMMUNITY, 1, 1, T0).count == 6


ASYNC_OPEN_STARTS_RAY = """
import asyncio, sys, time
from tidal_actors import Config, open_tidal

async def main():
    async with open_tidal(None, config=Config(host="ray", ray_address="local")) as db:
        time.sleep(3)  # the open's worker thread has ended by now
        await db.assign_cohort(1, "red")
        await db.signal_with_context(1, 7, 0, 2.0)
        await db.flush()
        print(await db.read_window("red", 7, 0))

asyncio.run(main())
"""


@needs_ray
def test_an_async_open_that_starts_ray_keeps_it_alive() -> None:
    """An async facade opens in a worker thread; a local Ray instance started there
    (``ray_address="local"``: its own, whatever else runs on the machine)
    must outlive that thread (Ray's processes die with the thread that started them
    unless it lives on): a call made after the open still gets its answer."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")])
    )
    res = subprocess.run(
        [sys.executable, "-c", ASYNC_OPEN_STARTS_RAY],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "WindowCount(count=1, weight=2.0)"
