"""History writes no caller waits for gather before they commit
(`Persistence.HISTORY_WAIT_S`): a host may wait for more, up to that long from the
first; anything a caller waits for, and a stop, commits them at once; under the
pykka host a lone batch still commits without any other message coming."""

from __future__ import annotations

import time
from pathlib import Path

from tidal_actors import ManualClock, TidalDb
from tidal_actors.actors import messages as M
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.reply import Reply
from tidal_actors.storage.stores import MemoryStore

from ._setups import RecordingContext
from .conftest import T0


def _history_write(n: int) -> M.Write:
    return M.Write([("history", n.to_bytes(8, "big"), b"batch")])


def test_history_writes_alone_may_wait_and_anything_awaited_commits_them() -> None:
    store = MemoryStore()
    p = Persistence(RecordingContext(), store)  # type: ignore[arg-type]
    assert p.idle_wait_s() == 0.0  # nothing waits
    p.receive(_history_write(1))
    p.receive(_history_write(2))
    wait = p.idle_wait_s()
    assert 0.0 < wait <= Persistence.HISTORY_WAIT_S
    assert p.commits == 0
    reply = Reply()
    p.receive(M.Write([("meta", b"k", b"v")], reply))  # a writer waits for this one
    assert p.idle_wait_s() == 0.0
    p.on_idle()
    assert p.commits == 1 and reply.result() is None
    assert [w for w in p.uncommitted()] == []


def test_a_control_write_commits_the_history_waiting_with_it() -> None:
    store = MemoryStore()
    ctx = RecordingContext()
    p = Persistence(ctx, store)  # type: ignore[arg-type]
    p.receive(_history_write(1))
    assert p.idle_wait_s() > 0.0
    p.receive(M.Write([("users", b"u", b"x")], ((M.MEMBERSHIP, 0), 5), ahead=True))
    assert p.idle_wait_s() == 0.0  # the last commit of control writes carried one
    p.on_idle()
    assert p.uncommitted() == []
    assert [m for _, m in ctx.sent] == [M.Committed(5, None, ())]


def test_a_stop_commits_the_history_waiting() -> None:
    store = MemoryStore()
    p = Persistence(RecordingContext(), store)  # type: ignore[arg-type]
    p.receive(_history_write(1))
    assert len(p.uncommitted()) == 1
    p.on_stop()
    assert p.uncommitted() == [] and p.commits == 1


def test_under_the_pykka_host_a_lone_history_batch_commits_by_itself(tmp_path: Path) -> None:
    db = TidalDb.open(str(tmp_path / "s"), clock=ManualClock(T0 + 10**12))
    try:
        db.assign_cohort(1, "a")
        persistence = db._core.persistence
        before = persistence.commits
        db.signal_with_context(1, 7, 1, 1.0, timestamp_ns=T0)
        deadline = time.monotonic() + 30.0  # liveness only: no other message comes
        while persistence.commits == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert persistence.commits > before
        assert persistence.uncommitted() == []
    finally:
        db.close()
