"""`runtime.ray_control.ControlCommits` (a shard's own group commit under the Ray
host) answers every writer exactly once, whatever its commit raises, and after
`close`; no Ray needed."""

from __future__ import annotations

import threading
from typing import Any

from tidal_actors import StorageError
from tidal_actors.actors import messages as M
from tidal_actors.runtime.ray_control import ControlCommits

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
    cc = ControlCommits(commit_writes, answers.tell, "membership-0")
    cc.put(_write(1))
    cc.drain()
    cc.put(_write(2))
    cc.drain()  # returned: the thread lived on
    cc.close()
    assert answers.tokens() == [(1, KeyboardInterrupt), (2, None)]


def test_a_write_after_close_is_refused_at_once() -> None:
    answers = _Answers()
    cc = ControlCommits(lambda ws: [None] * len(ws), answers.tell, "membership-0")
    cc.put(_write(1))
    cc.close()
    cc.put(_write(2))
    assert answers.tokens() == [(1, None), (2, StorageError)]
