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
