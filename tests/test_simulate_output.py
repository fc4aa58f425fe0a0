"""What ``simulate`` shows: the short summary, ``--verbose``, and a progress bar for
every phase (set-up, the run, the reference model, the check, closing the store).

Expected counts come from the generated events, not from the code under test.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

from click.testing import CliRunner

from tidal_actors.cli import commands as cli_module
from tidal_actors.eventlog.log import AssignRow
from tidal_actors.loadsim.simulate import generate_events, load_scenario, run_simulation
from tidal_actors.testing import ReferenceModel

from .test_cli import ROOT

INTERNALS = (
    "older_buckets",
    "pair_index",
    "B per retained record",
    "  counters ",
    "  memory ",
    "  timings ",
)


def test_the_summary_is_short_and_the_internals_are_behind_verbose(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    res = CliRunner().invoke(
        cli_module.cli, ["simulate", "--scenario", "small", "--quiet", "--report-out", str(report)]
    )
    assert res.exit_code == 0, res.output
    got = json.loads(report.read_text())
    out = res.stdout
    assert not [word for word in INTERNALS if word in out], out
    lines = out.splitlines()
    ops = len(got["latency_ms"])
    # what, ran, host, purges, 2 x throughput and the model's note when the runtime was
    # the slower, table, note, check, hint
    slower = got["signals_per_s"] < got["reference_signals_per_s"]
    assert len(lines) == 1 + 1 + 1 + 1 + 2 + slower + 1 + ops + 1 + 1 + 1, out
    assert ("single-threaded in-memory fold" in out) == slower
    assert lines[2] == "  host       pykka", out  # the default host
    assert f"{got['signals_per_s']:,.0f} signals/s through the runtime" in out
    assert f"{got['reference_signals_per_s']:,.0f} signals/s through the reference model" in out
    assert f"ran        {got['events']:,} rows in memory (no store)" in out
    assert "check      OK" in out
    # the check's read time in UTC (event time), its ns in the report
    stamp = datetime.datetime.fromtimestamp(got["at_ns"] // 10**9, tz=datetime.UTC)
    assert lines[-2].endswith(
        f"read at {stamp:%Y-%m-%d %H:%M:%S}.{got['at_ns'] // 10**6 % 1000:03d} UTC (event time)"
    ), lines[-2]
    # the report holds the internals either way
    assert got["memory"]["structures"]["older_buckets"] > 0 and got["stats"]["records"] > 0

    res = CliRunner().invoke(cli_module.cli, ["simulate", "--scenario", "small", "--quiet", "-v"])
    assert res.exit_code == 0, res.output
    assert all(word in res.stdout for word in INTERNALS), res.stdout


def _recording() -> tuple[list[tuple[str, int | None, int]], object]:
    seen: list[tuple[str, int | None, int]] = []

    @contextlib.contextmanager
    def phase(label: str, total: int | None, unit: str) -> Iterator[object]:
        done = [0]

        def tick(n: int) -> None:
            done[0] += n

        yield tick
        seen.append((label, total, done[0]))

    return seen, phase


def test_every_phase_is_announced_with_its_size() -> None:
    scenario = load_scenario("steady").scaled(0.003)
    events = generate_events(scenario)
    upfront = next(i for i, r in enumerate(events) if not isinstance(r, AssignRow))
    users = len({r.user_id for r in events})
    seen, phase = _recording()
    result = run_simulation(
        scenario,
        lambda c, k: ReferenceModel(config=c, clock=k),
        reference=ReferenceModel,
        events=events,
        phase=phase,
    )  # type: ignore[arg-type]
    assert result.check.ok
    counted = {label: (total, done) for label, total, done in seen}
    assert counted["set-up: users join their cohorts"] == (upfront, upfront)
    assert counted["run (measured)"] == (len(events) - upfront, len(events) - upfront)
    assert counted["reference model (single-threaded)"] == (len(events), len(events))
    assert counted["check: compare with the reference model"] == (users, users)
    assert [label for label, _, _ in seen] == [
        "open the store",
        "set-up: users join their cohorts",
        "run (measured)",
        "measure memory",
        "reference model (single-threaded)",
        "check: rebuild purged cohorts",
        "check: compare with the reference model",
        "close and reopen the store (restore time)",
        "close",
    ]


def _stderr_on_a_terminal(*args: str) -> str:
    """Run the command line with standard error on a 120-column pseudo-terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidal_actors", *args],
        stderr=slave,
        stdout=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(300) == 0
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))


def test_a_terminal_sees_a_bar_for_each_phase(tmp_path: Path) -> None:
    err = _stderr_on_a_terminal(
        "simulate", "--scenario", "steady", "--scale", "0.003", "--data-dir", str(tmp_path / "d")
    )
    for label in (
        "generate the events",
        "open the store",
        "set-up: users join their cohorts",
        "run (measured)",
        "reference model (single-threaded)",
        "check: compare with the reference model",
        "close and reopen the store (restore time)",
        "close",
    ):
        assert f"simulate steady@0.003: {label}" in err, (label, err[-2000:])


def test_the_eviction_scenario_reports_the_evicted_records(tmp_path: Path) -> None:
    scenario = load_scenario("eviction")
    report = tmp_path / "r.json"
    res = CliRunner().invoke(
        cli_module.cli,
        ["simulate", "--scenario", "eviction", "--quiet", "--report-out", str(report)],
    )
    assert res.exit_code == 0, res.output
    got = json.loads(report.read_text())
    # the same events through the reference model alone (no store: no history)
    from tidal_actors._clock import ManualClock
    from tidal_actors.eventlog.log import apply_events

    clock = ManualClock(scenario.start_ns)
    model = ReferenceModel(config=scenario.build_config(), clock=clock, history=False)
    manifests: list = []
    apply_events(
        model, generate_events(scenario), clock, batch_size=scenario.batch_size, manifests=manifests
    )
    evicted = sum(m.evicted for m in manifests)
    entries = sum(len(m.entries) for m in manifests)
    assert evicted > 0  # the scenario's point: the log evicted part of what was purged
    assert got["manifest_evicted"] == evicted and got["manifest_entries"] == entries
    n = len(manifests)
    assert (
        f"  purges     {entries:,} records retracted in {n:,} manifest{'s' if n != 1 else ''}; "
        f"{evicted:,} records the log had evicted"
    ) in res.stdout, res.stdout
