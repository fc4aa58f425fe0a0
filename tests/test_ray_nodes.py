"""The Ray host on the session's multi-node cluster (`tests._ray.RaySession`: a head
and two worker nodes in this machine): an ephemeral database's actors spread over
the nodes; a durable database's ledger shards placed on the node advertising the
store resource (``Config.ray_store_resource``, `runtime.ray_placement`) restart on
a replacement node when theirs is lost mid-stream (with the coordinator, placed
there by the test, restarting beside them), and on the same node after many kills
of their processes; each run checked against the reference model. Skipped,
with the reason, where Ray is not installed.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tidal_actors import InvalidArgument, ManualClock, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.testing import ReferenceModel

from ._differential import assert_matches, random_op, rows_mismatch
from ._ray import STORE_RESOURCE, RaySession, needs_ray, ray_config
from .conftest import T0
from .test_ray_host import RAY_MIX
from .test_ray_restart import COHORTS, _assign, _kill, _restarted, _stream

LEDGERS = [(M.LEDGER, 0), (M.LEDGER, 1)]


def _store_config(**changes: object) -> object:
    return ray_config(
        membership_shards=2,
        ledger_shards=2,
        signal_batch_size=50,
        ray_store_resource=STORE_RESOURCE,
        **changes,
    )


def test_ray_store_resource_is_checked_and_read_from_toml(tmp_path: Path) -> None:
    assert ray_config().ray_store_resource is None
    assert ray_config(ray_store_resource="vol-a").ray_store_resource == "vol-a"
    for bad in ("", " vol", "CPU", "memory", 3):
        with pytest.raises(InvalidArgument) as err:
            ray_config(ray_store_resource=bad)
        assert (err.value.field, err.value.value) == ("ray_store_resource", bad)
    toml = tmp_path / "c.toml"
    toml.write_text('[runtime]\nhost = "ray"\nray_store_resource = "tidal_store"\n')
    assert ray_config().from_toml(toml).ray_store_resource == "tidal_store"
    toml.write_text("[runtime]\nray_store_resource = false\n")
    assert ray_config().from_toml(toml).ray_store_resource is None


@needs_ray
def test_a_store_resource_no_node_advertises_is_refused(
    ray_session: RaySession, tmp_path: Path
) -> None:
    path = tmp_path / "store"
    cfg = _store_config().replace(ray_store_resource="no_such_volume")  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument) as err:
        TidalDb.open(str(path), config=cfg, clock=ManualClock(T0))
    assert (err.value.field, err.value.value) == ("ray_store_resource", "no_such_volume")
    assert "no node of the Ray cluster advertises" in str(err.value)


@needs_ray
def test_an_ephemeral_database_spreads_over_the_nodes_and_matches_the_reference(
    ray_session: RaySession,
) -> None:
    rng = random.Random(29)
    cfg = ray_config(membership_shards=2, ledger_shards=2, max_contribution_log_entries=40)
    clock, rclock = ManualClock(T0), ManualClock(T0)
    ref = ReferenceModel(cfg, rclock)
    with TidalDb.open(None, config=cfg, clock=clock) as db:
        nodes = db._core.host.nodes()
        # 6 actors over 3 nodes, spread: more than one node holds them
        assert len(nodes) == 6 and len(set(nodes.values())) >= 2, nodes
        for step in range(160):
            random_op(db, ref, rng, (clock, rclock), RAY_MIX)
            if step % 40 == 39:
                bad = rows_mismatch(db.aggregate_rows(), ref.aggregate_rows())
                assert bad is None, f"step {step}: {bad}"
        db.flush()
        assert_matches(db, ref, range(6), ats=(None,))
        s, rs = db.stats(), ref.stats()
        for k in ("signals", "forwarded", "gated", "records", "purges", "retracted"):
            assert s[k] == rs[k], k


@needs_ray
def test_a_lost_node_replaced_by_one_with_the_store_loses_nothing(
    ray_session: RaySession, tmp_path: Path
) -> None:
    """Twice: the node holding both ledgers is lost mid-stream (killed, then shut down
    gracefully), more signals are sent while it is gone, a node advertising the
    same store resource is added, and ``flush()`` returns: the ledgers run on the
    new node, and the records equal the reference model's (nothing acknowledged
    lost, nothing applied twice), in the facade and in the store it closed with."""
    path = str(tmp_path / "store")
    cfg = _store_config()
    clock = ManualClock(T0)
    ref = ReferenceModel(cfg, ManualClock(T0))  # type: ignore[arg-type]
    ids = ray_session.node_ids()
    try:
        with TidalDb.open(path, config=cfg, clock=clock) as db:  # type: ignore[arg-type]
            nodes = db._core.host.nodes()
            assert {nodes[a] for a in LEDGERS} == {ids["store"]}
            assert {n for a, n in nodes.items() if a not in LEDGERS} == {ids["head"]}
            _assign(db, ref)
            start = 0
            for n, graceful in enumerate((False, True), start=1):
                _stream(db, ref, start, 20)  # some of it still on its way at the loss
                lost = time.monotonic()
                ray_session.remove_store_node(graceful)
                _stream(db, ref, start + 20, 10)
                new = ray_session.add_store_node()
                added = time.monotonic()
                start += 30
                db.flush()
                how = "shut down" if graceful else "killed"
                print(
                    f"node {how}: lost -> flush() returned {time.monotonic() - lost:.2f} s, "
                    f"replacement added -> flush() returned {time.monotonic() - added:.2f} s"
                )
                assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
                assert {db._core.host.nodes()[a] for a in LEDGERS} == {new}
                assert sorted(r.address[1] for r in _restarted(db, 2 * n)) == [0] * n + [1] * n
                s = db.stats()
                assert (s["signals"], s["records"]) == (100 * start, ref.stats()["records"])
    finally:
        if ray_session.store is None:  # the next tests need a store node
            ray_session.add_store_node()
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:  # type: ignore[attr-defined]
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None


@needs_ray
def test_a_lost_node_hosting_the_coordinator_and_the_ledgers_loses_nothing(
    ray_session: RaySession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coordinator placed with the ledgers on the store node (by the test: the
    product keeps it on the facade's node, `runtime.ray_placement`), and that node
    killed mid-stream after purges, more signals sent while it is gone, then a
    replacement added: the three actors restart there together (`runtime.ray_restoring`),
    ``flush()`` returns, and the records, then purges of users of both membership
    shards, equal the reference model's (nothing acknowledged lost, every purge
    exact), live and reopened."""
    import tidal_actors.runtime.ray_host as ray_host

    placed = ray_host.placement
    monkeypatch.setattr(
        ray_host,
        "placement",
        lambda cfg, a, durable: placed(cfg, LEDGERS[0] if a == M.COORD_ADDR else a, durable),
    )
    path = str(tmp_path / "store")
    cfg = _store_config()
    clock = ManualClock(T0)
    ref = ReferenceModel(cfg, ManualClock(T0))  # type: ignore[arg-type]
    ids = ray_session.node_ids()
    lost = [*LEDGERS, M.COORD_ADDR]
    try:
        with TidalDb.open(path, config=cfg, clock=clock) as db:  # type: ignore[arg-type]
            host = db._core.host
            nodes = host.nodes()
            assert {nodes[a] for a in lost} == {ids["store"]}
            _assign(db, ref)
            _stream(db, ref, 0, 20)
            db.flush()
            for u, c in ((0, "red"), (1, "green")):  # purges before: their statuses restored
                _, got = db.request_community_purge(u, c)
                assert got.entries == ref.request_community_purge(u, c)[1].entries
            _stream(db, ref, 20, 20)  # some of it still on its way at the loss
            before = {a: host.links.epoch(a) for a in lost}
            gone = time.monotonic()
            ray_session.remove_store_node(False)
            _stream(db, ref, 40, 10)
            new = ray_session.add_store_node()
            db.flush()
            print(f"node hosting {lost} killed -> flush() returned {time.monotonic() - gone:.2f} s")
            deadline = time.monotonic() + 120
            while any(host.links.epoch(a) == e for a, e in before.items()):
                assert time.monotonic() < deadline, "not every restart was heard"
                time.sleep(0.05)
            assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
            assert {host.nodes()[a] for a in lost} == {new}
            assert sorted(r.address for r in _restarted(db, 3)) == sorted(lost)
            for u in range(2, 8):  # both membership shards' users, cohorts of both ledgers
                for c in (COHORTS[u % 4], COHORTS[(u + 1) % 4]):
                    _, got = db.request_community_purge(u, c)
                    _, want = ref.request_community_purge(u, c)
                    assert got.entries == want.entries and got.evicted == want.evicted, (u, c)
            _stream(db, ref, 50, 5)
            db.flush()
            assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
            s = db.stats()
            assert (s["signals"], s["records"]) == (5500, ref.stats()["records"])
    finally:
        if ray_session.store is None:  # the next tests need a store node
            ray_session.add_store_node()
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:  # type: ignore[attr-defined]
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None


KILLS = 12


@needs_ray
def test_many_kills_of_ledgers_on_the_store_node(ray_session: RaySession, tmp_path: Path) -> None:
    """`KILLS` SIGKILLs of the ledgers' processes on the store node, alternating
    shards, signals between every two and a flush after every third: after each
    flush the records equal the reference model's, and every kill was a restart."""
    path = str(tmp_path / "store")
    cfg = _store_config()
    clock = ManualClock(T0)
    ref = ReferenceModel(cfg, ManualClock(T0))  # type: ignore[arg-type]
    with TidalDb.open(path, config=cfg, clock=clock) as db:  # type: ignore[arg-type]
        _assign(db, ref)
        start = 0
        for k in range(KILLS):
            _stream(db, ref, start, 5)
            start += 5
            _restarted(db, k)  # the previous restart reported (its pid is the new one)
            _kill(db, k % 2)
            _stream(db, ref, start, 5)
            start += 5
            if k % 3 == 2:
                db.flush()
                assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None, k
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        reports = _restarted(db, KILLS)
        assert sorted(r.address[1] for r in reports) == [0] * (KILLS // 2) + [1] * (KILLS // 2)
        assert db.stats()["signals"] == 100 * start
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:  # type: ignore[attr-defined]
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None
