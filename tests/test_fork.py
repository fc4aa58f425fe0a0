"""A forked child never touches a database its parent opened.

A parent process opens a store, makes 200 signals durable, forks a child that tries
to use the inherited database and then exits normally (so its ``atexit`` hooks run),
and is then killed with SIGKILL. Before the fix the child's exit hook flushed and
closed the inherited database: it released the parent's directory lock and wrote a
snapshot of the state at fork time, which the next open preferred (10 of 200 signals
were left). Now the child's calls raise ``DatabaseClosed``, the lock stays the
parent's, and a reopen after the parent's crash holds all 200 signals.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap

import pytest

from tidal_actors import Config, DatabaseLocked, ManualClock, TidalDb

T0 = 10**18

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from tidal_actors import Config, DatabaseClosed, DatabaseLocked, ManualClock, TidalDb

    path, out = sys.argv[1], sys.argv[2]
    db = TidalDb.open(path, config=Config(rematerialize_after_ms=None), clock=ManualClock({t0}))
    db.assign_cohort(1, "c")
    for i in range(10):
        db.signal_with_context(1, 7, 1, 1.0)
    db.flush()
    pid = os.fork()
    if pid == 0:
        report = {{}}
        t = time.perf_counter()
        try:
            db.signal_with_context(1, 7, 1, 1.0)
        except DatabaseClosed as exc:
            report["signal"] = str(exc)
        try:
            db.flush()
        except DatabaseClosed as exc:
            report["flush"] = str(exc)
        report["seconds"] = time.perf_counter() - t
        try:
            TidalDb.open(path)
        except DatabaseLocked as exc:
            report["open"] = str(exc)
        if sys.argv[3] == "exit":
            with open(out, "w") as f:
                json.dump(report, f)
            sys.exit(0)  # a normal exit: the interpreter's atexit hooks run in the child
        with open(out + ".tmp", "w") as f:
            json.dump(report, f)
        os.rename(out + ".tmp", out)
        time.sleep(60)  # outlives its parent, killed by the test
        os._exit(0)
    if sys.argv[3] == "exit":
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
    else:
        while not os.path.exists(out):
            time.sleep(0.01)
        code = pid
    for i in range(190):
        db.signal_with_context(1, 7, 1, 1.0)
    db.flush()
    print("ready", code, flush=True)
    time.sleep(60)  # killed by the test
    """
)


@pytest.mark.parametrize("ledger_shards,child", [(1, "exit"), (2, "exit"), (1, "outlive")])
def test_forked_child_leaves_the_parents_database_alone(tmp_path, ledger_shards, child):
    path = tmp_path / "store"
    out = tmp_path / "child.json"
    script = _SCRIPT.format(t0=T0)
    if ledger_shards != 1:
        script = script.replace("Config(", f"Config(ledger_shards={ledger_shards}, ")
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(path), str(out), child],
        stdout=subprocess.PIPE,
        text=True,
    )
    child_pid = None
    try:
        # before the fix the child's exit took minutes (it waited for actor threads
        # that a fork does not copy): give it 30 s
        ready, _, _ = select.select([proc.stdout], [], [], 30.0)
        assert ready, "the forked child did not exit within 30 s"
        line = proc.stdout.readline().split()
        assert line[0] == "ready", line
        if child == "exit":
            assert line[1] == "0", line
        else:
            child_pid = int(line[1])
        report = json.loads(out.read_text())
        for call in ("signal", "flush"):  # the advice given is one that works
            assert "forked child can neither use it nor open its store" in report[call]
            assert "'spawn' or 'forkserver'" in report[call]
        assert "'spawn' or 'forkserver'" in report["open"]  # not a py-lmdb error
        assert report["seconds"] < 5.0
        # the parent still holds the directory lock: a second opener is refused
        with pytest.raises(DatabaseLocked):
            TidalDb.open(str(path))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    try:
        # the parent crashed: every flushed signal is there (no stale snapshot from the
        # child), and a child that outlives its parent does not keep the store locked
        with TidalDb.open(
            str(path), config=Config(ledger_shards=ledger_shards), clock=ManualClock(T0)
        ) as db:
            assert db.read_window("c", 7, 1).count == 200
            assert db.read_decay_score("c", 7, 1) == pytest.approx(200.0)
    finally:
        if child_pid is not None:
            os.kill(child_pid, signal.SIGKILL)


_FORK_FIRST = textwrap.dedent(
    """
    import os, sys
    from tidal_actors import Config, ManualClock, TidalDb

    path = sys.argv[1]
    cfg = Config(rematerialize_after_ms=None)
    pid = os.fork()  # before this process opened the store: the child may open it
    if pid == 0:
        with TidalDb.open(path, config=cfg, clock=ManualClock({t0})) as db:
            db.assign_cohort(1, "c")
            db.signal_with_context(1, 7, 1, 3.0)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with TidalDb.open(path, config=cfg, clock=ManualClock({t0})) as db:
        print(db.read_window("c", 7, 1).count, db.read_decay_score("c", 7, 1))
    """
)


def test_a_child_forked_before_the_open_uses_the_store(tmp_path):
    """The advice the errors above give: fork first, then open."""
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_FIRST.format(t0=T0), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    count, score = proc.stdout.split()
    assert (int(count), float(score)) == (1, 3.0)  # one signal of weight 3.0, read at its time
