"""A membership shard crashes while one `Committed` answering a run of its control
writes (``token`` and ``more``) waits in its mailbox: the next incarnation answers
every write of the run once, with its committed outcome, and holds the state the
reference model computes."""

from __future__ import annotations

from tidal_actors import Config
from tidal_actors.actors import messages as M
from tidal_actors.testing import Harness, ReferenceModel

CFG = Config(membership_shards=1, ledger_shards=1, rematerialize_after_ms=None)
SHARD = (M.MEMBERSHIP, 0)


def _run_pending(h: Harness) -> M.Committed | None:
    """The `Committed` carrying more than one token waiting at the shard, if any."""
    for m in h.pending_messages().get(SHARD, []):
        if isinstance(m, M.Committed) and m.more:
            return m
    return None


def test_a_crash_with_a_run_answered_but_not_applied_answers_each_write_once() -> None:
    h = Harness(seed=0, config=CFG)
    calls = [h.assign_cohort(u, "red") for u in range(3)]
    while _run_pending(h) is None:
        assert h.step(), "no Committed with more tokens reached the shard"
    ack = _run_pending(h)
    assert ack is not None
    tokens = (ack.token, *ack.more)
    assert not any(c.done for c in calls)
    report = h.crash_shard(SHARD)
    assert len(report.in_doubt) == len(tokens)
    h.run_until_idle()
    assert all(c.done for c in calls)
    assert [c.result() for c in calls] == [None, None, None]
    model = ReferenceModel(CFG, h.clock)
    for u in range(3):
        model.assign_cohort(u, "red")
    shard = h.behaviour(SHARD)
    assert {u: frozenset(c) for u, c in shard.state.cohorts.items()} == {  # type: ignore[attr-defined]
        u: model.cohorts_of(u) for u in range(3)
    }
    assert not shard.in_doubt()  # type: ignore[attr-defined]


def test_a_run_split_by_a_failing_write_is_answered_once_across_the_restart() -> None:
    """The second write of a run fails to apply: the shard restarts from the store,
    the first caller has its result, the second the failure, and the third its
    outcome from the next incarnation (the `Committed` the failing one handed on);
    the store holds all three (one commit), and so does the restarted shard."""
    h = Harness(seed=0, config=CFG)
    calls = [h.assign_cohort(u, "red") for u in range(3)]
    while _run_pending(h) is None:
        assert h.step(), "no Committed with more tokens reached the shard"
    ack = _run_pending(h)
    assert ack is not None and len(ack.more) == 2
    old = h.behaviour(SHARD)
    _, reply, user = old._pending[ack.more[0]]  # type: ignore[attr-defined]

    def broken() -> None:
        raise ValueError("apply failed")

    old._pending[ack.more[0]] = (broken, reply, user)  # type: ignore[attr-defined]
    h.run_until_idle()
    assert h.behaviour(SHARD) is not old  # restarted from the store
    assert calls[0].result() is None and calls[2].result() is None
    assert calls[1].done and calls[1].error is not None
    model = ReferenceModel(CFG, h.clock)
    for u in range(3):
        model.assign_cohort(u, "red")
    shard = h.behaviour(SHARD)
    assert {u: frozenset(c) for u, c in shard.state.cohorts.items()} == {  # type: ignore[attr-defined]
        u: model.cohorts_of(u) for u in range(3)
    }
    assert not shard.in_doubt()  # type: ignore[attr-defined]
