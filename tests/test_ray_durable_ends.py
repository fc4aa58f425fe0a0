"""A Ray-hosted ledger's durable acknowledgements follow merged attributions: the
mailbox takes one membership shard's queued attributions as one message
(`runtime.mailbox.coalesce`), and the history batch it makes carries, in its
``LINK_STATE`` write, the highest link number of the messages merged, each of which
is reported durable once that batch commits (`runtime.ray_restart.DurableEnds`).

In process, without a Ray instance: the ledger runs on the `LocalHost` of a Ray
actor, its sends to other actors recorded instead of made. Skipped where Ray is not
installed (the module imports it).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tidal_actors import Config, ManualClock
from tidal_actors.actors import messages as M
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.core.contrib_log import LogRecord
from tidal_actors.storage.format import Keyspace, Tag, decode_key, decode_link_state

from ._ray import needs_ray
from .conftest import T0

EPOCH = 1_700_000_000_000_000_000  # the ledger incarnation's epoch (ns)


class _Links:
    """Stands in for `ray_links.Links`: records what the ledger sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[M.Address, object]] = []

    def send(self, address: M.Address, message: object, wait: bool = True) -> None:
        self.sent.append((address, message))


class _History:
    """A history source whose committed batches the test sets."""

    def __init__(self) -> None:
        self.top = 0

    def committed(self) -> int:
        return self.top

    def settled_detail(self, *args: Any) -> list[tuple[int, float]]:
        return []


class _Gate:
    """Holds the ledger's thread until opened, so messages queue up behind it."""

    def __init__(self) -> None:
        self.open = threading.Event()


def _attribute(first_rseq: int, n: int) -> M.Attribute:
    recs = [LogRecord(0, first_rseq + i, 10 + i, "blue", 5, 1, 0.5 + i, T0 + i) for i in range(n)]
    return M.Attribute.of_records(recs)


@needs_ray
def test_merged_attributions_carry_their_link_numbers_to_the_store_and_the_sender() -> None:
    from tidal_actors.runtime.ray_local import LocalHost
    from tidal_actors.runtime.ray_restart import DurableEnds, LedgerRestart

    cfg = Config(membership_shards=1, ledger_shards=1)
    links = _Links()
    ends = DurableEnds()
    host = LocalHost(cfg, ManualClock(T0), True, links, ends, 0, EPOCH)  # type: ignore[arg-type]
    ledger = LedgerShard(host.ctx, 0)
    history = _History()
    ledger.state.wire_history(history)
    ledger.on(_Gate, lambda gate: gate.open.wait(10))
    host.start([ledger])
    try:
        gate = _Gate()
        host.tell(ledger.address, gate)
        # three calls of membership shard 0's link, numbered 1..3, as `deliver` takes them
        parts = [_attribute(0, 3), _attribute(3, 2), _attribute(5, 4)]
        for seq, part in enumerate(parts, start=1):
            ends.taken("membership-0", seq, part)
            host.tell(ledger.address, part)
        gate.open.set()
        deadline = time.monotonic() + 10
        while not links.sent and time.monotonic() < deadline:
            time.sleep(0.01)
        writes = [m for a, m in links.sent if a == M.PERSIST_ADDR and type(m) is M.Write]
        # the mailbox merged the three: one history batch holding their 9 records
        assert ledger.records_in == 9 and ledger.history_batches == 1 and len(writes) == 1
        states = {}
        for _, key, value in writes[0].ops:
            shard, tag, suffix = decode_key(key)
            if tag == Tag.LINK_STATE:
                assert shard == 0  # the ledger's own
                states[suffix.decode("utf-8")] = decode_link_state(value)
        # the batch holds messages 1, 2 and 3 of the link: its state says 3
        assert states == {"membership-0": (EPOCH, 3)}
        assert all(op[0] == Keyspace.META.value for op in writes[0].ops[1:])
        assert len(writes[0].ops) == 2  # the batch and one link state

        def durable(token: Any) -> bool:
            return bool(ledger.durable(token))

        assert ends.report("membership-0", durable) == []  # the batch is not committed
        history.top = 1  # batch 0 committed
        assert sorted(ends.report("membership-0", durable)) == [1, 2, 3]
        assert ends.report("membership-0", durable) == []  # each reported once
        # a restart reading that state drops all three from what the sender keeps
        notice = LedgerRestart(ledger.address, EPOCH + 1, states)
        assert [notice.survived("membership-0", EPOCH, s, p) for s, p in enumerate(parts, 1)] == [
            True,
            True,
            True,
        ]
        assert not notice.survived("membership-0", EPOCH, 4, _attribute(9, 1))
    finally:
        host.stop([M.LEDGER])


@needs_ray
@pytest.mark.parametrize("fails", [False, True])
def test_a_ledger_owning_its_environment_group_commits_and_a_flush_reports_a_failure(
    fails: bool,
) -> None:
    """The shards layout under Ray: the ledger's history writes (a batch and its link
    state each) are committed by its own group commit (`ray_history`), not sent to
    persistence; a barrier's part waits for them. A failed commit fails the writes
    it carried and every later one, unwritten (no later link state may pass over
    it); the next part of a barrier that reports losses (a flush) carries them, once."""
    from tidal_actors import StorageError
    from tidal_actors.actors.reply import Reply
    from tidal_actors.runtime.ray_local import LocalHost
    from tidal_actors.runtime.ray_restart import DurableEnds

    cfg = Config(membership_shards=1, ledger_shards=1)
    links = _Links()
    ends = DurableEnds()
    host = LocalHost(cfg, ManualClock(T0), True, links, ends, 0, EPOCH)  # type: ignore[arg-type]
    calls: list[list[Any]] = []

    def commit(ops: list[Any]) -> None:
        calls.append(ops)
        if fails:
            raise StorageError("the disk refused it (test)")

    host.commit_history = commit
    ledger = LedgerShard(host.ctx, 0)
    ledger.state.wire_history(_History())
    host.start([ledger])

    def sync() -> M.BarrierPart:
        part = M.BarrierPart(M.Barrier((0,), 1, Reply("sync")))  # reports no loss
        host.tell(M.PERSIST_ADDR, part)
        return part

    def attribute(seq: int, msg: M.Attribute) -> None:
        ends.taken("membership-0", seq, msg)
        host.tell(ledger.address, msg)
        deadline = time.monotonic() + 10
        while ledger.history_batches < seq and time.monotonic() < deadline:
            time.sleep(0.01)

    try:
        attribute(1, _attribute(0, 3))
        first = sync()  # waits for the commit of the batch handed over before it
        attribute(2, _attribute(3, 2))
        second = sync()
        assert ledger.history_batches == 2
        assert [a for a, m in links.sent if type(m) is M.Write] == []  # none to persistence
        parts = [m for a, m in links.sent if type(m) is M.BarrierPart]
        assert parts == [first, second]  # unchanged: no loss reported to a sync
        flush = M.BarrierPart(M.Barrier((0,), 1, Reply("flush"), reports_loss=True))
        host.tell(M.PERSIST_ADDR, flush)
        host.tell(M.PERSIST_ADDR, flush)
        flushed = [m for a, m in links.sent if type(m) is M.BarrierPart][2:]
        if not fails:
            assert len(calls) == 2  # one transaction each: the sync came between them
            for ops in calls:
                assert [decode_key(key)[1] for _, key, _ in ops] == [
                    Tag.CONTRIBUTION_BATCH,
                    Tag.LINK_STATE,
                ]
            assert [p.lost for p in flushed] == [(), ()]
            return
        assert len(calls) == 1  # after the failure, the second batch was not written
        (loss,) = flushed[0].lost
        assert isinstance(loss, StorageError)
        assert "2 history write(s) of ledger 0 failed in its process" in str(loss)
        assert "the disk refused it (test)" in str(loss)
        assert flushed[1].lost == ()  # reported once
    finally:
        host.stop([M.LEDGER])
