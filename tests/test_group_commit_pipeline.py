"""Group commit driven by hand, message by message, between one membership shard and
persistence (a context that records what each sends, a `MemoryStore`):

* while a control write commits, the shard takes control writes on other users at
  once and sends their writes on; a write on a user with one pending, and anything
  after it, waits until the writes ahead of it are applied;
* persistence commits the writes waiting together in one transaction; each caller
  is answered once the shard has applied its write, after that commit;
* a failed group commit fails every caller whose write was in it, with the error,
  and changes neither the store nor the shard;
* a group's writes on one user keep their order (each its own commit);
* a run of control writes handled one after another reaches persistence together,
  once the shard's mailbox is empty or anything else comes;
* one commit answers its shard in one message;
* persistence's wait for a group to gather (`Persistence.idle_wait_s`).

Expected states come from the reference model.
"""

from __future__ import annotations

import copy
from typing import Any

from tidal_actors import StorageError
from tidal_actors.actors import messages as M
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.reply import Reply
from tidal_actors.storage.format import cohorts_op
from tidal_actors.storage.stores import MemoryStore
from tidal_actors.testing import ReferenceModel

from ._setups import RecordingContext
from .conftest import T0


class _Ctx(RecordingContext):
    """`RecordingContext` whose messages to one address can be taken out."""

    def take(self, address: M.Address) -> list[Any]:
        """The messages told to ``address`` so far, removed."""
        out = [m for a, m in self.sent if a == address]
        self.sent = [(a, m) for a, m in self.sent if a != address]
        return out


class _Pair:
    """A membership shard and persistence on one `_Ctx` and a `MemoryStore`."""

    def __init__(self) -> None:
        self.ctx = _Ctx()
        self.store = MemoryStore()
        self.shard = MembershipShard(self.ctx, 0)
        self.persist = Persistence(self.ctx, self.store)
        self.model = ReferenceModel(self.ctx.config, self.ctx.clock)

    def send(self, make: Any, idle: bool = True) -> Reply:
        """Deliver ``make(reply)`` to the shard; ``idle``: its mailbox is empty after
        it (a host then calls ``on_idle``), else more messages wait behind it."""
        reply = Reply()
        self.shard.receive(make(reply))
        if idle:
            self.shard.on_idle()
        return reply

    def commit(self) -> int:
        """Deliver the writes sent to persistence and let it go idle: how many."""
        writes = self.ctx.take(M.PERSIST_ADDR)
        for w in writes:
            self.persist.receive(w)
        self.persist.on_idle()
        return len(writes)

    def acks(self) -> None:
        """Deliver persistence's answers (``Committed``) to the shard."""
        for msg in self.ctx.take(self.shard.address):
            self.shard.receive(msg)

    def settle(self) -> None:
        while self.ctx.sent:
            self.commit()
            self.acks()


def test_writes_on_other_users_go_on_while_one_commits_and_share_a_commit() -> None:
    p = _Pair()
    first = p.send(lambda r: M.Assign(0, "a", r))
    assert len(p.ctx.sent) == 1  # its write, on its way
    others = [p.send(lambda r, u=u: M.Assign(u, "a", r)) for u in range(1, 6)]
    leave = p.send(lambda r: M.Leave(7, T0, r))
    # not set aside: each write is on its way to persistence already
    assert len(p.ctx.sent) == 7 and not p.shard.held_messages()
    again = p.send(lambda r: M.Assign(3, "b", r))  # user 3 has a write pending
    query = p.send(lambda r: M.QueryUser(3, "cohorts", r))
    assert len(p.shard.held_messages()) == 2
    commits = p.persist.commits
    assert p.commit() == 7
    assert p.persist.commits == commits + 1  # the seven in one transaction
    # committed, not applied: nobody is answered before the shard applies its write
    assert not any(r.done for r in [first, *others, leave, again, query])
    assert p.shard.state.cohorts == {}
    p.acks()
    assert all(r.done and r.result() is None for r in [first, *others, leave])
    for u in range(6):
        p.model.assign_cohort(u, "a")
    p.model.leave_community_layer(7)
    assert {u: frozenset(c) for u, c in p.shard.state.cohorts.items()} == {
        u: p.model.cohorts_of(u) for u in range(6)
    }
    # user 3's second assign went on once the first was applied; the query waits for it
    assert not query.done and len(p.ctx.sent) == 1
    p.settle()
    p.model.assign_cohort(3, "b")
    assert again.done and query.result() == p.model.cohorts_of(3) == frozenset({"a", "b"})
    assert p.shard.state.status[7][0] == p.model.community_layer_status(7).status


def test_a_failed_group_commit_fails_each_of_its_callers_and_changes_nothing() -> None:
    p = _Pair()
    p.send(lambda r: M.Assign(9, "z", r))
    p.settle()
    before = copy.deepcopy(p.store.data)
    state = copy.deepcopy(p.shard.state.cohorts)
    boom = StorageError("disk on fire")

    def fail(ops: object) -> None:
        raise boom

    p.store.fault = fail
    calls = [p.send(lambda r, u=u: M.Assign(u, "a", r)) for u in range(4)]
    calls.append(p.send(lambda r: M.Leave(5, T0, r)))
    assert p.commit() == 5
    p.acks()
    for call in calls:  # each with the error (the group, then each write alone, failed)
        assert call.done and call.error is boom
    assert p.store.data == before and p.shard.state.cohorts == state
    assert 5 not in p.shard.left and not p.shard.in_doubt()
    p.store.fault = None  # the next writes commit: the shard is not stuck
    ok = p.send(lambda r: M.Assign(1, "a", r))
    p.settle()
    p.model.assign_cohort(9, "z")
    p.model.assign_cohort(1, "a")
    assert ok.result() is None
    assert {u: frozenset(c) for u, c in p.shard.state.cohorts.items()} == {
        u: p.model.cohorts_of(u) for u in (1, 9)
    }


def test_one_failing_write_in_a_group_fails_only_its_caller() -> None:
    p = _Pair()
    bad = cohorts_op(2, ("a",))  # user 2's write: the one that fails
    seen: list[int] = []

    def fail_user_2(ops: list[tuple[str, bytes, bytes | None]]) -> None:
        seen.append(len(ops))
        if bad in ops:
            raise StorageError("user 2's record")

    p.store.fault = fail_user_2
    calls = {u: p.send(lambda r, u=u: M.Assign(u, "a", r)) for u in range(4)}
    p.commit()
    p.acks()
    assert seen[0] == 4  # tried as one transaction first
    for u, call in calls.items():
        assert call.done
        if u == 2:
            assert isinstance(call.error, StorageError)
        else:
            assert call.result() is None
            p.model.assign_cohort(u, "a")
    assert {u: frozenset(c) for u, c in p.shard.state.cohorts.items()} == {
        u: p.model.cohorts_of(u) for u in (0, 1, 3)
    }


def test_a_groups_writes_on_one_user_keep_their_order() -> None:
    p = _Pair()
    ops = [
        ("assign", 4, "a"),
        ("assign", 4, "b"),
        ("assign", 6, "a"),
        ("unassign", 4, "a"),
        ("assign", 4, "c"),
        ("assign", 6, "b"),
    ]
    calls = []
    for kind, u, c in ops:
        make = M.Assign if kind == "assign" else M.Unassign
        calls.append(p.send(lambda r, make=make, u=u, c=c: make(u, c, r)))
        getattr(p.model, f"{kind}_cohort")(u, c)
    sizes = []
    while p.ctx.sent:
        sizes.append(p.commit())
        p.acks()
    # user 4's four writes each wait for the one before; user 6's second waits too
    assert len(sizes) == 4 and sum(sizes) == len(ops)
    assert all(c.done and c.result() is None for c in calls)
    for u in (4, 6):
        assert frozenset(p.shard.state.cohorts[u]) == p.model.cohorts_of(u)
    assert p.shard.state.cohorts[4] == ("b", "c")  # assignment order, as the model keeps


def test_persistence_gathers_as_many_control_writes_as_its_last_commit_carried() -> None:
    p = _Pair()
    persist = p.persist
    assert persist.idle_wait_s() == 0.0  # nothing waits
    for u in range(3):
        p.send(lambda r, u=u: M.Assign(u, "a", r))
    assert p.commit() == 3
    p.acks()
    p.send(lambda r: M.Assign(10, "a", r))
    persist.receive(p.ctx.take(M.PERSIST_ADDR)[0])
    wait = persist.idle_wait_s()  # one waits, the last commit carried three
    assert 0.0 <= wait <= Persistence.GATHER_MAX_S
    for u in (11, 12):
        p.send(lambda r, u=u: M.Assign(u, "a", r))
    for w in p.ctx.take(M.PERSIST_ADDR):
        persist.receive(w)
    assert persist.idle_wait_s() == 0.0  # three wait: commit now
    persist.on_idle()
    assert not persist.uncommitted()
    p.acks()
    # a lone caller never waits: after a commit of one, one waiting commits at once
    lone = _Pair()
    lone.send(lambda r: M.Assign(1, "a", r))
    lone.commit()
    lone.acks()
    lone.send(lambda r: M.Assign(2, "a", r))
    lone.persist.receive(lone.ctx.take(M.PERSIST_ADDR)[0])
    assert lone.persist.idle_wait_s() == 0.0


def test_a_commit_answers_its_shard_in_one_message() -> None:
    p = _Pair()
    calls = [p.send(lambda r, u=u: M.Assign(u, "a", r)) for u in range(5)]
    assert p.commit() == 5
    acks = p.ctx.take(p.shard.address)
    assert len(acks) == 1  # one `Committed` for the five writes, not five
    (ack,) = acks
    assert ack.error is None and len((ack.token, *ack.more)) == 5
    p.shard.receive(ack)
    for u in range(5):
        p.model.assign_cohort(u, "a")
    assert all(c.done and c.result() is None for c in calls)
    assert {u: frozenset(c) for u, c in p.shard.state.cohorts.items()} == {
        u: p.model.cohorts_of(u) for u in range(5)
    }


def test_a_write_that_fails_to_apply_hands_the_rest_of_its_commit_on() -> None:
    p = _Pair()
    calls = [p.send(lambda r, u=u: M.Assign(u, "a", r)) for u in range(3)]
    p.commit()
    (ack,) = p.ctx.take(p.shard.address)
    second = ack.more[0]
    _, reply, user = p.shard._pending[second]

    def broken() -> None:
        raise ValueError("apply failed")

    p.shard._pending[second] = (broken, reply, user)
    p.shard.receive(ack)
    assert p.shard.fault is not None and isinstance(p.shard.fault[1], ValueError)
    assert calls[0].result() is None and calls[1].error is not None
    # the third write's outcome goes back to the shard's address, still pending
    (rest,) = p.ctx.take(p.shard.address)
    assert (rest.token, *rest.more) == (ack.more[1],) and rest.error is None
    assert not calls[2].done and list(p.shard.in_doubt()) == [ack.more[1]]
    p.shard.fault = None  # as a supervisor that resumes it
    p.shard.receive(rest)
    p.model.assign_cohort(0, "a")
    p.model.assign_cohort(2, "a")
    assert calls[2].result() is None
    assert {u: frozenset(c) for u, c in p.shard.state.cohorts.items()} == {
        u: p.model.cohorts_of(u) for u in (0, 2)
    }


def test_a_run_of_control_writes_goes_on_when_the_mailbox_is_empty_or_else_comes() -> None:
    p = _Pair()
    calls = [p.send(lambda r, u=u: M.Assign(u, "a", r), idle=False) for u in range(3)]
    assert not p.ctx.sent  # more wait in the mailbox: the writes gather
    p.shard.on_idle()  # the mailbox is empty: the run goes on, in order
    writes = p.ctx.take(M.PERSIST_ADDR)
    assert [w.reply[1] for w in writes] == sorted(p.shard.in_doubt())
    for w in writes:
        p.persist.receive(w)
    p.persist.on_idle()
    p.acks()
    assert all(c.done and c.result() is None for c in calls)
    # anything but a control write handled at once sends the run made before it
    p.send(lambda r: M.Assign(5, "a", r), idle=False)
    query = p.send(lambda r: M.QueryUser(5, "cohorts", r), idle=False)  # waits for user 5
    assert len(p.ctx.take(M.PERSIST_ADDR)) == 1 and not query.done
    p.send(lambda r: M.Assign(6, "a", r), idle=False)  # set aside behind the query
    assert not p.ctx.sent and len(p.shard.held_messages()) == 2
