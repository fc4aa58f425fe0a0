"""Several actors of a durable database restarted by Ray at once (`runtime.ray_restoring`:
each restore runs after its constructor returns, so the restores that ask each other
complete): the coordinator and a membership shard, a membership shard and a ledger,
and the coordinator, a membership shard and a ledger (every restartable kind of one
node), SIGKILLed together after a flush, the other membership shard's signals
streaming meanwhile. Each then takes signals and purges again: the purges' manifests
and the aggregates equal the reference model's, fed only the acknowledged operations
(a membership shard's restart may fail the calls in flight to it; none is fed to the
model), live and after a reopen. (The coordinator and a ledger: in
test_ray_own_commits_adversarial.py; a node hosting both lost: test_ray_nodes.py.)
Skipped, with the reason, where Ray is not installed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tidal_actors import ActorFailure, ManualClock, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.core.sharding import ledger_shard_of, membership_shard_of
from tidal_actors.testing import ReferenceModel

from ._differential import rows_mismatch
from ._ray import needs_ray, ray_config
from .conftest import T0
from .test_ray_membership_restart import OURS, SHARD, _stream_others
from .test_ray_restart import COHORTS, USERS, _assign, _open, _stream

RESTART_WAIT_S = 120.0  # how long the facade may wait for every notice (seconds)


def _kill_at_once(db: TidalDb, addresses: list[M.Address]) -> dict[M.Address, int]:
    """SIGKILL the processes of ``addresses`` back to back; the epochs the facade's
    links numbered for before."""
    host = db._core.host
    before = {a: int(host.links.epoch(a)) for a in addresses}
    pids = host.pids()
    for a in addresses:
        os.kill(pids[a], signal.SIGKILL)
    return before


def _all_heard(db: TidalDb, before: dict[M.Address, int]) -> float:
    """Wait until the facade has every restart's notice (its links number for a newer
    epoch of each); the seconds waited."""
    links = db._core.host.links
    started = time.monotonic()
    while any(links.epoch(a) <= e for a, e in before.items()):
        late = [a for a, e in before.items() if links.epoch(a) <= e]
        assert time.monotonic() - started < RESTART_WAIT_S, f"no notice of the restart of {late}"
        time.sleep(0.05)
    return time.monotonic() - started


def _restart_at_once(addresses: list[M.Address], tmp_path: Path) -> None:
    """Kill ``addresses`` together after a flush, stream the other membership shard's
    signals while they restart, then check signals and purges against the model."""
    path = str(tmp_path / "store")
    clock = ManualClock(T0)
    cfg = ray_config(membership_shards=2, ledger_shards=2, signal_batch_size=50)
    ref = ReferenceModel(cfg, ManualClock(T0))
    assert {ledger_shard_of(c, 2) for c in COHORTS} == {0, 1}
    others = [u for u in range(USERS) if membership_shard_of(u, 2) != SHARD]
    with _open(path, clock) as db:
        _assign(db, ref)
        _stream(db, ref, 0, 20)
        db.flush()
        before = _kill_at_once(db, addresses)
        _stream_others(db, ref, 100, 5)  # through the shard that lives
        try:  # nothing was sent to a killed membership shard since the last flush
            db.flush()
        except ActorFailure as err:
            assert "may have been applied" in str(err), str(err)
        took = _all_heard(db, before)
        print(f"{addresses} killed at once: every notice after {took:.2f} s")
        db.flush()  # acknowledges the other shard's signals
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        restarted = {r.address for r in db._core.fault_reports() if r.action == "restarted"}
        assert restarted == set(addresses)
        _stream(db, ref, 20, 20)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
        # purges of both membership shards' users, of cohorts of both ledgers: a
        # marker of the restarted shard accepted by the restarted coordinator, every
        # record listed once (numbers never handed out twice)
        for u in (*OURS[:3], *others[:3]):
            for cohort in (COHORTS[u % 4], COHORTS[(u + 1) % 4]):
                _, got = db.request_community_purge(u, cohort)
                _, want = ref.request_community_purge(u, cohort)
                assert got.entries == want.entries and got.evicted == want.evicted, (u, cohort)
                assert len(got.entries) > 0
        _stream(db, ref, 40, 5)
        db.flush()
        assert rows_mismatch(db.aggregate_rows(), ref.aggregate_rows()) is None
    with TidalDb.open(path, config=cfg.replace(host="pykka"), clock=clock) as again:
        assert rows_mismatch(again.aggregate_rows(), ref.aggregate_rows()) is None


@needs_ray
def test_the_coordinator_and_a_membership_shard_killed_at_once(
    ray_session: None, tmp_path: Path
) -> None:
    """The coordinator's restore asks the membership shard `MarkerCount` while the
    shard's asks the coordinator `RecoverMembership`."""
    _restart_at_once([M.COORD_ADDR, (M.MEMBERSHIP, SHARD)], tmp_path)


@needs_ray
def test_a_membership_shard_and_a_ledger_killed_at_once(ray_session: None, tmp_path: Path) -> None:
    """The membership shard's restore asks the ledger `SeenRecords` while the ledger
    restores (and the membership shard's fences reach it meanwhile)."""
    _restart_at_once([(M.MEMBERSHIP, SHARD), (M.LEDGER, 0)], tmp_path)


@needs_ray
def test_the_coordinator_a_membership_shard_and_a_ledger_killed_at_once(
    ray_session: None, tmp_path: Path
) -> None:
    """Every restartable kind at once, as a node hosting them would be lost."""
    _restart_at_once([M.COORD_ADDR, (M.MEMBERSHIP, SHARD), (M.LEDGER, 0)], tmp_path)


@needs_ray
def test_what_a_restoring_actor_takes_is_held_in_order_and_two_questions_answered_at_once() -> None:
    """`Held` runs nothing before `release`, then the kept steps in the order taken and
    every later step at once; `early_answer` answers `CoordinatorLost` at a ledger
    ([]) and `MarkerCount` at a membership shard (``epoch << 40``, the number its
    restored incarnation starts from) and nothing else."""
    from tidal_actors.actors.recovery import CoordinatorLost, MarkerCount, SeenRecords
    from tidal_actors.actors.reply import Reply
    from tidal_actors.runtime.ray_restoring import Held, early_answer

    ran: list[int] = []
    held = Held(holding=True)
    for k in range(3):
        held.take(lambda k=k: ran.append(k))
    assert ran == [] and held.holding and not held.up.is_set()
    assert held.release() == 3
    held.take(lambda: ran.append(3))
    assert ran == [0, 1, 2, 3] and not held.holding and held.up.is_set()
    held.ask(lambda: ran.append(4), lambda: ran.append(-1) is None)  # up: no early answer
    assert ran == [0, 1, 2, 3, 4]
    waiting = Held(holding=True)
    waiting.ask(lambda: ran.append(5), lambda: True)  # answered early: never run
    waiting.ask(lambda: ran.append(6), lambda: False)  # held
    assert waiting.release() == 1 and ran == [0, 1, 2, 3, 4, 6]
    epoch = 1_700_000_000_000_000_000
    lost, count, seen = (
        CoordinatorLost(Reply("a")),
        MarkerCount(Reply("b")),
        SeenRecords(0, Reply("c")),
    )
    assert early_answer((M.LEDGER, 1), epoch, lost) and lost.reply.result() == []
    assert early_answer((M.MEMBERSHIP, 0), epoch, count)
    assert count.reply.result() == epoch * 2**40
    assert not early_answer((M.LEDGER, 0), epoch, seen) and not seen.reply.done
    other = MarkerCount(Reply("d"))  # asked of a ledger: not its question
    assert not early_answer((M.LEDGER, 0), epoch, other) and not other.reply.done
