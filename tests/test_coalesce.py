"""A mailbox hands an actor the signal batches, or one membership shard's
attributions, queued back to back at its head as one message (up to
``COALESCE_RECORDS`` units), in order; anything else stays where it is."""

from __future__ import annotations

import numpy as np

from tidal_actors.actors import messages as M
from tidal_actors.core.contrib_log import LogRecord
from tidal_actors.runtime.mailbox import COALESCE_RECORDS, Mailbox, units

from .conftest import T0


class _Env:
    def __init__(self, message: object) -> None:
        self.message = message


def _signals(first: int, n: int) -> M.SignalBatch:
    return M.SignalBatch([(first + i, 7, 1, 1.0, T0 + i, None) for i in range(n)])


def _attribute(
    mshard: int, first_rseq: int, n: int, contexts: dict[int, bytes] | None = None
) -> M.Attribute:
    recs = [
        LogRecord(mshard, first_rseq + i, 100 + i, f"c{i % 2}", 5, 1, 0.5, T0 + i) for i in range(n)
    ]
    return M.Attribute.of_records(recs, contexts)


def test_signal_batches_back_to_back_come_out_as_one_in_order() -> None:
    box = Mailbox(capacity=64)
    for m in (_signals(0, 3), _signals(3, 2), _signals(5, 4), "control", _signals(9, 1)):
        box.put(_Env(m))  # type: ignore[arg-type]
    first = box.get().message
    assert first == M.SignalBatch(
        _signals(0, 3).signals + _signals(3, 2).signals + _signals(5, 4).signals,
        batches=3,  # the three merged: a failure on it loses three
    )
    assert box.get().message == "control"
    assert box.get().message == _signals(9, 1)
    assert box.empty() and box._units == 0


def test_attributions_merge_within_one_membership_shard_up_to_another_kind() -> None:
    box = Mailbox(capacity=64)
    a = _attribute(0, 0, 3, {1: b"x"})
    b = _attribute(0, 3, 2, {0: b"y", 1: b"z"})
    c = _attribute(1, 0, 2)
    d = _attribute(0, 5, 1)
    e = _attribute(1, 2, 1)
    f = _attribute(0, 6, 2)
    for m in (a, b, c, d, e, "control", f):
        box.put(_Env(m))  # type: ignore[arg-type]
    got = box.get().message
    # shard 0's records before the control message, in their order; shard 1's stay
    assert got.records == a.records + b.records + d.records
    assert got.batches == 3  # a, b and d
    assert got.contexts == {1: b"x", 3: b"y", 4: b"z"}  # b's records moved up by a's 3
    assert got.rseqs.dtype == np.int64 and got.users.dtype == np.uint64
    got = box.get().message
    assert got.records == c.records + e.records
    assert got.batches == 2
    assert box.get().message == "control"
    assert box.get().message is f  # behind the control message: not merged with d
    assert box.empty() and box._units == 0


def _as_lists(a: M.Attribute) -> M.Attribute:
    """``a`` with every numeric column a list of Python numbers (a few signals'
    layout, `membership._fan_out_few`)."""
    return M.Attribute(
        a.mshard,
        *(
            c if isinstance(c, list) else c.tolist()
            for c in (a.rseqs, a.users, a.cohorts, a.entities, a.types, a.weights, a.timestamps)
        ),
        a.contexts,
        a.batches,
    )


def test_attributions_of_lists_merge_as_lists_and_with_arrays_as_arrays() -> None:
    big = M.Attribute.of_records([LogRecord(0, 9, 2**64 - 1, "c0", 2**63, 3, 0.25, T0)])
    parts = [_as_lists(_attribute(0, 0, 3)), _as_lists(_attribute(0, 3, 2)), _as_lists(big)]
    box = Mailbox(capacity=64)
    for m in parts:
        box.put(_Env(m))  # type: ignore[arg-type]
    got = box.get().message
    assert got.records == [r for m in parts for r in m.records]
    assert type(got.users) is list and got.users[-1] == 2**64 - 1
    # a list joined with an array: one array of the column's dtype, values kept
    # (2**64 - 1 and 2**63 as uint64, which numpy would not infer from the lists)
    box.put(_Env(_as_lists(_attribute(0, 10, 2))))  # type: ignore[arg-type]
    box.put(_Env(big))  # type: ignore[arg-type]
    got = box.get().message
    assert got.records == _attribute(0, 10, 2).records + big.records
    assert [got.rseqs.dtype, got.users.dtype, got.entities.dtype, got.timestamps.dtype] == [
        np.int64,
        np.uint64,
        np.uint64,
        np.int64,
    ]
    assert got.weights.dtype == np.float64 and got.users[-1] == 2**64 - 1


def test_a_merge_stops_at_the_cap() -> None:
    box = Mailbox(capacity=64)
    half = COALESCE_RECORDS // 2
    for i in range(3):
        box.put(_Env(_signals(i * half, half)))  # type: ignore[arg-type]
    assert units(box.get().message) == 2 * half  # a third would pass the cap
    assert units(box.get().message) == half


def test_signals_held_behind_a_commit_stay_within_the_capacity_when_merged() -> None:
    """A membership shard sets aside the signal batches it takes while a control
    write commits, and its mailbox counts them against its capacity (`held`), so
    queued and held together stay within ``capacity`` batches of at most
    ``signal_batch_size`` signals even though the mailbox merges the batches it
    hands out (no time budget here: the capacity is the only bound)."""
    from tidal_actors import Config, ManualClock
    from tidal_actors.actors.membership import MembershipShard
    from tidal_actors.actors.reply import Reply

    batch, cap = 8, 4

    class _Ctx:
        config = Config(ledger_shards=1, membership_shards=1, signal_batch_size=batch)
        clock = ManualClock(T0)
        durable = True

        def tell(self, address: object, message: object) -> None:
            pass

    shard = MembershipShard(_Ctx(), 0)  # type: ignore[arg-type]
    shard.receive(M.Assign(1, "red", Reply()))  # its write commits: batches wait
    box = Mailbox(capacity=cap, budget_s=None)
    box.held, box.held_units = shard.held, shard.held_units
    sent = 0
    for _ in range(3 * cap):  # producers fill every slot; the shard takes one message
        while box.offer(_Env(_signals(sent, batch))):  # type: ignore[arg-type]
            sent += batch
        if box.empty():
            break
        shard.receive(box.get().message)
    assert shard.held_units() + box._units == sent
    assert sent <= cap * batch  # the capacity: cap slots of one full batch each
