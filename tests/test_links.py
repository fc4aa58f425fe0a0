"""The link protocol (`runtime.links`): exactly-once, in-order delivery per link.

The unit tests work the protocol by hand; the property test lets hypothesis choose
any interleaving of sends, deliveries in any order, drops, duplicates, lost and
reordered acknowledgements and re-sends, then lets the link settle, and checks that
the receiver applied each message exactly once, in the order sent.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidal_actors.runtime.links import HOLD, LinkReceiver, LinkSender

EXAMPLES = {"ci": 300, "large": 5000}[os.environ.get("TIDAL_HYPOTHESIS_PROFILE", "ci")]


def test_sender_numbers_from_one_and_keeps_until_acknowledged() -> None:
    s: LinkSender[str] = LinkSender()
    assert [s.stamp(m) for m in "abc"] == [1, 2, 3]
    assert s.unacked() == [(1, "a"), (2, "b"), (3, "c")]
    assert s.ack(2) == 2  # cumulative: 1 and 2
    assert s.unacked() == [(3, "c")] and s.acked == 2
    assert s.ack(1) == 0  # late: changes nothing
    assert s.acked == 2 and len(s) == 1
    assert s.resend() == [(3, "c")] and s.resent == 1
    with pytest.raises(ValueError):
        s.ack(4)  # never sent


def test_receiver_applies_the_next_discards_duplicates_and_holds_gaps() -> None:
    r: LinkReceiver[str] = LinkReceiver()
    assert r.accept(1, "a") == ["a"]
    assert r.accept(1, "a") == [] and r.duplicates == 1  # duplicate
    assert r.accept(3, "c") == [] and r.held == 1  # gap: 2 missing
    assert r.accept(4, "d") == [] and r.waiting() == [3, 4]
    assert r.accept(3, "c") == [] and r.duplicates == 2  # a copy held already
    assert r.accept(2, "b") == ["b", "c", "d"]  # fills the gap, releases what follows
    assert r.applied == 4 and r.waiting() == []
    with pytest.raises(ValueError):
        r.accept(0, "x")


def test_a_full_hold_refuses_and_a_resend_brings_it_back() -> None:
    s: LinkSender[int] = LinkSender()
    r: LinkReceiver[int] = LinkReceiver(hold=1)
    copies = [(s.stamp(m), m) for m in range(4)]
    assert r.accept(*copies[2]) == []  # held
    assert r.accept(*copies[3]) == [] and r.refused == 1  # hold full: refused
    assert r.accept(*copies[0]) == [0]
    s.ack(r.applied)
    assert r.accept(*copies[1]) == [1, 2]
    s.ack(r.applied)
    assert s.unacked() == [(4, 3)]  # the refused one is still kept
    assert [m for seq, m in s.resend() for m in r.accept(seq, m)] == [3]
    s.ack(r.applied)
    assert len(s) == 0


def test_a_restored_receiver_continues_after_what_it_had_applied() -> None:
    r: LinkReceiver[str] = LinkReceiver.restored(5)
    assert r.accept(5, "old") == [] and r.accept(6, "new") == ["new"]
    assert LinkReceiver().hold == HOLD
    with pytest.raises(ValueError):
        LinkReceiver(hold=-1)


actions = st.lists(
    st.tuples(
        st.sampled_from(["send", "deliver", "drop", "dup", "ack", "lose_ack", "resend"]),
        st.integers(0, 1000),
    ),
    max_size=120,
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 15), hold=st.integers(0, 5), script=actions)
def test_any_interleaving_delivers_each_message_once_in_order(
    n: int, hold: int, script: list[tuple[str, int]]
) -> None:
    sender: LinkSender[int] = LinkSender()
    receiver: LinkReceiver[int] = LinkReceiver(hold)
    net: list[tuple[int, int]] = []  # copies on their way, any of them may arrive next
    acks: list[int] = []  # acknowledgements on their way back, in any order
    applied: list[int] = []
    sent = 0

    def arrive(i: int) -> None:
        seq, message = net.pop(i)
        applied.extend(receiver.accept(seq, message))
        acks.append(receiver.applied)

    for kind, k in script:
        if kind == "send" and sent < n:
            net.append((sender.stamp(sent), sent))
            sent += 1
        elif kind == "deliver" and net:
            arrive(k % len(net))
        elif kind == "drop" and net:
            net.pop(k % len(net))
        elif kind == "dup" and net:
            net.insert(k % (len(net) + 1), net[k % len(net)])
        elif kind == "ack" and acks:
            sender.ack(acks.pop(k % len(acks)))
        elif kind == "lose_ack" and acks:
            acks.pop(k % len(acks))
        elif kind == "resend":
            net.extend(sender.resend())
        # at every point: applied once each, in the order sent, never ahead of the sender
        assert applied == list(range(len(applied)))
        assert sender.acked <= receiver.applied == len(applied) <= sender.next_seq - 1
        assert [seq for seq, _ in sender.unacked()] == list(
            range(sender.acked + 1, sender.next_seq)
        )
    # the rest is sent, then the link settles: a timeout re-sends what is not
    # acknowledged, the copies arrive (in order now) and the acknowledgements come back
    while sent < n:
        net.append((sender.stamp(sent), sent))
        sent += 1
    for _ in range(n + 2):
        while net:
            arrive(0)
        for a in acks:
            sender.ack(a)
        acks.clear()
        if not len(sender):
            break
        net.extend(sender.resend())
    assert applied == list(range(n))
    assert len(sender) == 0 and sender.acked == receiver.applied == n
