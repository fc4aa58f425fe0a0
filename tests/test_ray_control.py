"""`runtime.ray_control.ControlCommits` (a shard's own group commit under the Ray
host) answers every writer exactly once, whatever its commit raises, and after
`close`, naming the shard when its commit failed with an error not of tidal_actors;
it and `runtime.ray_history.HistoryCommits` count their commits and failed writes
for `stats()`. No Ray needed."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tidal_actors import ActorFailure, StorageError, StorageFull
from tidal_actors.actors import messages as M
from tidal_actors.runtime.ray_control import ControlCommits
from tidal_actors.runtime.ray_history import HistoryCommits

ME = (M.MEMBERSHIP, 0)


class _Answers:
    def __init__(self) -> None:
        self.got: list[M.Committed] = []
        self.done = threading.Event()

    def tell(self, address: Any, message: object) -> None:
        assert address == ME and type(message) is M.Committed
        self.got.append(message)
        self.done.set()

    def tokens(self) -> list[tuple[int, type | None]]:
        out = []
        for c in self.got:
            for t in (c.token, *c.more):
                out.append((t, None if c.error is None else type(c.error)))
        return out


def _write(token: int) -> M.Write:
    return M.Write([("users", token.to_bytes(8, "big"), b"x")], (ME, token), ahead=True)


def test_a_commit_raising_a_base_exception_answers_its_writers_and_the_thread_goes_on() -> None:
    calls: list[int] = []

    def commit_writes(writes: list[Any]) -> list[Exception | None]:
        calls.append(len(writes))
        if len(calls) == 1:
            raise KeyboardInterrupt  # not an Exception: it used to end the thread
        return [None] * len(writes)

    answers = _Answers()
    cc = ControlCommits(commit_writes, answers.tell, "membership-0", "membership[0]")
    cc.put(_write(1))
    cc.drain()
    cc.put(_write(2))
    cc.drain()  # returned: the thread lived on
    cc.close()
    assert answers.tokens() == [(1, KeyboardInterrupt), (2, None)]


def test_a_write_after_close_is_refused_at_once() -> None:
    answers = _Answers()
    cc = ControlCommits(lambda ws: [None] * len(ws), answers.tell, "membership-0", "membership[0]")
    cc.put(_write(1))
    cc.close()
    cc.put(_write(2))
    assert answers.tokens() == [(1, None), (2, StorageError)]


def test_an_own_commits_foreign_error_names_the_shard_not_persistence() -> None:
    """A commit failing with an error that is no TidalError (a bug, an OSError of the
    binding) used to reach the writer as "persistence failed to commit", though
    persistence had no part in it; a StorageError goes through as it is."""
    outcomes: list[list[Exception | None]] = [
        [RuntimeError("disk on fire")],
        [StorageFull("the map is full")],
        [None],
    ]
    answers = _Answers()
    cc = ControlCommits(lambda ws: outcomes.pop(0), answers.tell, "membership-0", "membership[0]")
    for token in (1, 2, 3):
        cc.put(_write(token))
        cc.drain()
    cc.close()
    errors = [c.error for c in answers.got]
    assert isinstance(errors[0], ActorFailure)
    assert str(errors[0]) == "membership[0] failed to commit: RuntimeError('disk on fire')"
    assert isinstance(errors[0].__cause__, RuntimeError)
    assert type(errors[1]) is StorageFull and str(errors[1]) == "the map is full"
    assert errors[2] is None
    assert cc.commits == 3  # one per group, whatever its writes' outcomes (as persistence)


def test_history_commits_count_commits_and_failed_writes() -> None:
    """Groups of one write each (drained one at a time): the 1st and 2nd commit, the
    3rd fails, and so do the 4th and 5th, unwritten (nothing commits after a failure),
    and a 6th handed over after close: 2 commits, 4 failed writes."""
    committed: list[list[Any]] = []

    def commit(ops: list[Any]) -> None:
        if len(committed) == 2:
            raise OSError("EIO")
        committed.append(ops)

    hc = HistoryCommits(commit, 0)
    failures = []
    for i in range(5):
        hc.put([("history", i.to_bytes(8, "big"), b"x")])
        failures += hc.drain()
    failures += hc.close()
    hc.put([("history", b"late", b"x")])
    failures += hc.drain()
    assert len(committed) == 2 and hc.commits == 2
    assert hc.failed_writes == 4 == len(failures)
    assert all(isinstance(f, OSError) for f in failures[:3])
    with pytest.raises(StorageError, match="closed"):
        raise failures[3]
