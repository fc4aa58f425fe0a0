"""Restore by handshake: a crashed ledger shard restarts with its links.

The links into a ledger shard of a durable store keep each message until it is
durable there (`runtime.links`, `actors.ledger_durability`); a crashed ledger
restarts from the store, the senders drop what the store shows survived and re-send
the rest, and a purge in flight waits for its marker again. So a ledger crash loses
nothing, and every purge's manifest stays exact with FIFO per sender/receiver pair
only and lost, duplicated and reordered messages on every link. The oracle is the
reference model over every operation (nothing is left out for a ledger crash).
"""

from __future__ import annotations

import random

import pytest

from tidal_actors import COMMUNITY
from tidal_actors.actors import messages as M
from tidal_actors.testing import Harness, LinkFaults

from ._differential import Recorder, assert_matches_and_reopened, model_without_lost
from .test_harness import CFG, _workload

EVERY_LINK = LinkFaults(drop=0.2, duplicate=0.2, reorder=0.2)
ONE = CFG.replace(membership_shards=1, ledger_shards=1)
L0, L1, M0 = (M.LEDGER, 0), (M.LEDGER, 1), (M.MEMBERSHIP, 0)


def _run(seed: int, faults: LinkFaults | None, crashes: list[tuple[int, M.Address]]) -> tuple:
    """The crash workload under FIFO per pair only; each ``(steps, address)`` crashes
    ``address`` after that many more steps. Returns the harness, recorder, reports."""
    h = Harness(seed=seed, config=CFG, ordering="pair", link_faults=faults)
    r = Recorder(h)
    _workload(r)
    reports = []
    for steps, address in crashes:
        for _ in range(steps):
            h.step()
        if address not in h.host.down:
            reports.append(h.crash_shard(address))
    h.run_until_idle()
    return h, r, reports


@pytest.mark.parametrize("faults", [None, EVERY_LINK], ids=["no-faults", "every-link"])
@pytest.mark.parametrize("ledger", [L0, L1])
@pytest.mark.parametrize("crash_at", [0, 5, 12, 25, 45, 70])
def test_a_ledger_crash_loses_nothing_with_fifo_per_pair_only(
    faults: LinkFaults | None, ledger: M.Address, crash_at: int
) -> None:
    for seed in range(8):
        h, r, (report,) = _run(seed, faults, [(crash_at, ledger)])
        where = f"seed {seed}, {ledger} at {crash_at}"
        assert "restart ledger" in h.trace(), where
        assert not report.lost_records and not report.lost_signals, where
        assert_matches_and_reopened(h, r.model(CFG), range(1, 6), where)


@pytest.mark.parametrize("seed", range(10))
def test_crashes_of_both_ledgers_and_a_membership_shard_under_link_faults(seed: int) -> None:
    """Two ledgers crash (one of them twice, once while the other is down), and a
    membership shard: only what the membership shard's crash loses is missing."""
    crashes = [(3 + seed, L0), (7, L1), (11, L0), (5 + seed % 4, M0), (20, L1)]
    h, r, reports = _run(seed, EVERY_LINK, crashes)
    for report in reports:
        if report.address[0] == M.LEDGER:
            assert not report.lost_records and not report.lost_signals, report
    (mreport,) = [rep for rep in reports if rep.address == M0]
    model = model_without_lost(r, CFG, mreport)
    assert_matches_and_reopened(h, model, range(1, 6), f"seed {seed}")


def _step_until_delivered(h: Harness, what: str, to: str) -> None:
    while not any(what in line and line.split()[1] == to for line in h.trace_lines()[-1:]):
        assert h.step(), f"{what} never reached {to}"


def test_a_batch_committed_after_the_crash_is_not_applied_again() -> None:
    """The ledger applied an attribution and sent its history write, then crashed:
    the write commits, so the restarted shard finds the records in the store and
    its sender drops the attribution instead of re-sending it."""
    h = Harness(seed=0, config=ONE, ordering="pair")
    t0 = h.clock.now_ns()
    h.signal_with_context(1, 7, 0, 2.0, t0 - 1)
    h.flush()
    _step_until_delivered(h, "Attribute", "ledger[0]")
    assert any(isinstance(m, M.Write) for m in h.pending_messages().get(M.PERSIST_ADDR, []))
    report = h.crash_shard(L0)
    h.run_until_idle()
    assert not report.lost_records
    after = h.trace().split("restart ledger[0]")[1]
    assert "re-send membership[0] -> ledger[0] after its restart: 1 message(s)" in after
    assert "ledger[0] <- membership[0]: BarrierPart" in after  # the flush's, not applied
    assert "ledger[0] <- membership[0]: Attribute" not in after
    # one signal of weight 2.0 an instant old, counted once (not 4.0)
    assert h.run(h.read_window(COMMUNITY, 7, 0)) == (1, 2.0)


def test_a_batch_not_committed_at_the_crash_is_re_sent_and_applied_once() -> None:
    """The attribution was on its way when the ledger crashed: its sender keeps it
    and re-sends it to the restarted shard, which applies it once."""
    h = Harness(seed=0, config=ONE, ordering="pair")
    t0 = h.clock.now_ns()
    h.signal_with_context(1, 7, 0, 2.0, t0 - 1)
    h.signal_with_context(1, 7, 0, 3.0, t0 - 2)
    h.flush()
    _step_until_delivered(h, "SignalBatch", "membership[0]")
    assert any(isinstance(m, M.Attribute) for m in h.pending_messages().get(L0, []))
    report = h.crash_shard(L0)
    h.run_until_idle()
    assert not report.lost_records
    after = h.trace().split("restart ledger[0]")[1]
    assert "ledger[0] <- membership[0]: Attribute" in after
    assert h.run(h.read_window(COMMUNITY, 7, 0)) == (2, 5.0)


def test_a_re_sent_purge_application_is_a_no_op() -> None:
    """The purge committed and its retraction was on its way when the ledger
    crashed: the restored state leaves the purged records out, and the retraction
    handled by the new incarnation changes nothing."""
    h = Harness(seed=0, config=ONE, ordering="pair")
    t0 = h.clock.now_ns()
    h.run(h.assign_cohort(1, "red"))
    h.signal_with_context(1, 7, 0, 2.0, t0 - 1)
    h.signal_with_context(2, 7, 0, 5.0, t0 - 2)
    purge = h.request_community_purge(1, "red")
    while not any(isinstance(m, M.ApplyPurge) for m in h.pending_messages().get(L0, [])):
        assert h.step()
    h.crash_shard(L0)
    h.run_until_idle()
    _, manifest = purge.result()
    assert [e.weight for e in manifest.entries] == [2.0]
    assert "ledger[0] <- coordinator[0]: ApplyPurge" in h.trace().split("restart ledger[0]")[1]
    assert h.run(h.read_window("red", 7, 0)) == (0, 0.0)
    assert h.run(h.read_window(COMMUNITY, 7, 0)) == (2, 7.0)


def _purge_in_flight_at_restart(seed: int, crash: bool) -> bool:
    """One membership and one ledger shard, the log holding 4 records. User 1's
    two records come first (red, community), then two purges of theirs (red, then
    community, which waits behind the first), then 4 records of user 2. The ledger
    restarts once it has every record and before the red purge's preparation
    reached it (``crash``: crashed, restored by handshake; else its handler fails
    on a read, restored with its links kept): the red purge fails with the restart,
    and the community purge is in flight. Until it ends the log keeps what was not
    evicted when it was taken (user 1's community record, rseq 1; the records past
    the cap are counted once its drain is known), so its manifest lists that record
    as an entry and its retraction takes it out, as in the reference model.
    Returns whether the community purge was in flight at the restart."""
    cfg = ONE.replace(max_contribution_log_entries=4)
    h = Harness(seed=seed, config=cfg, ordering="pair")
    r = Recorder(h)
    t0 = h.clock.now_ns()
    h.run(r.assign_cohort(1, "red"))
    r.signal_with_context(1, 7, 0, 2.0, t0 - 1)
    h.run(r.flush())
    r.request_community_purge(1, "red")
    community = r.request_community_purge(1, COMMUNITY)
    for i in range(4):
        r.signal_with_context(2, 8, 0, 1.0, t0 - 2 - i)
    r.flush()
    prepared = "ledger[0] <- coordinator[0]: PreparePurge"
    while h.behaviour(L0).state.rseq_seen.get(0, -1) < 5:
        if prepared in h.trace():
            return False
        assert h.step(), "the ledger never got user 2's records"
    if prepared in h.trace():
        return False
    if crash:
        h.crash_shard(L0)
    else:

        def failing(*_: object) -> None:
            raise RuntimeError("injected fault in a read")

        h.behaviour(L0)._read = failing  # type: ignore[method-assign]
        h.stats()
    h.run_until_idle()
    assert_matches_and_reopened(h, r.model(cfg), (1, 2), f"seed {seed}")
    return community.error is None


@pytest.mark.parametrize("crash", [True, False], ids=["crash", "handler-failure"])
def test_a_purge_in_flight_at_a_ledger_restart_holds_the_log_trim(crash: bool) -> None:
    assert [seed for seed in range(200) if _purge_in_flight_at_restart(seed, crash)]


def _ledger_crash_storm(seed: int, faults: LinkFaults | None) -> None:
    """70 random steps on 5 users with a log of 8 records (evictions): signals,
    assigns, leaves, rejoins, purges, rebuilds run to their end (a ledger crashing
    in the middle of some), ledger crashes (some back to back, some with a read
    waiting at the shard), and harness steps between them. Checked against the
    reference model over every operation that returned, live and reopened."""
    rnd = random.Random(seed)
    cfg = CFG.replace(max_contribution_log_entries=8)
    h = Harness(seed=seed, config=cfg, ordering="pair", link_faults=faults)
    r = Recorder(h)
    t0 = h.clock.now_ns()

    def crash(address: M.Address) -> None:
        if address not in h.host.down:
            h.crash_shard(address)

    for n in range(70):
        u = rnd.randrange(1, 6)
        op = rnd.random()
        if op < 0.45:
            r.signal_with_context(u, n % 4, n % 2, 0.5 + n % 3, t0 - n)
        elif op < 0.55:
            r.assign_cohort(u, rnd.choice(("red", "blue")))
        elif op < 0.6:
            r.leave_community_layer(u)
        elif op < 0.65:
            r.rejoin_community_layer(u)
        elif op < 0.75:
            r.request_community_purge(u, rnd.choice(("red", "blue", COMMUNITY)))
        elif op < 0.78:  # a rebuild, run to its end (its order with signals is then known)
            h.run_until_idle()
            r.rematerialize(rnd.choice(("red", "blue", COMMUNITY)))
            for _ in range(rnd.randrange(12)):
                h.step()
            if rnd.random() < 0.5:
                crash(rnd.choice((L0, L1)))
            h.run_until_idle()
        elif op < 0.85:
            crash(rnd.choice((L0, L1)))
            if rnd.random() < 0.3:
                crash(rnd.choice((L0, L1)))
        elif op < 0.9:
            r.read_window(rnd.choice(("red", COMMUNITY)), 1, 0)
            crash(rnd.choice((L0, L1)))
        else:
            for _ in range(rnd.randrange(10)):
                h.step()
    h.run_until_idle()
    assert_matches_and_reopened(h, r.model(cfg), range(1, 6), f"seed {seed}")


@pytest.mark.parametrize("faults", [None, EVERY_LINK], ids=["no-faults", "every-link"])
def test_ledger_crashes_amid_evictions_purges_rebuilds_and_reads(
    faults: LinkFaults | None,
) -> None:
    for seed in range(30):
        _ledger_crash_storm(seed, faults)
