"""The run's timeline (intervals chosen from its length) and ``simulate --plot``.

Expected intervals, rates and percentiles are worked out by hand from the calls
recorded here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidal_actors._simulate import LATENCY_OPS, load_scenario, run_simulation
from tidal_actors._timeline import CallLog, resolution
from tidal_actors.testing import ReferenceModel


@pytest.mark.parametrize(("span_s", "calls", "width"), [
    (0.2, 3000, 0.005),      # 80 intervals of 2.5 ms -> the next 1-2-5 step, 5 ms
    (0.2, 48, 0.02),         # 48 calls: 12 intervals of 4 calls -> 16.7 ms -> 20 ms
    (1200.0, 2000, 20.0),    # 20 minutes, 80 intervals of 15 s -> 20 s
    (0.01, 10_000, 0.001),   # never below 1 ms
    (5.0, 1, 5.0),           # one call: one interval
])
def test_resolution_follows_the_runs_length(span_s: float, calls: int, width: float) -> None:
    assert resolution(span_s, calls) == pytest.approx(width)


def test_timeline_rates_and_weighted_percentiles() -> None:
    log = CallLog(LATENCY_OPS)
    # interval 0 (0-10 ms): a batch of 100 signals at 2 ms and one of 1 at 9 ms
    log.add(0.004, "signal", 0.002, 100)
    log.add(0.006, "signal", 0.009, 1)
    log.add(0.008, "leave", 0.003, 1)
    # interval 1 (10-20 ms): one batch of 50 signals at 4 ms
    log.add(0.015, "signal", 0.004, 50)
    # interval 2 (20-25 ms, the run ends at 25 ms): 10 signals
    log.add(0.022, "signal", 0.001, 10)
    rows = log.timeline(0.025, 0.01)
    assert [r["t_s"] for r in rows] == [0.01, 0.02, 0.03]
    assert rows[0]["signals_per_s"] == pytest.approx(101 / 0.01)
    assert rows[1]["signals_per_s"] == pytest.approx(50 / 0.01)
    assert rows[2]["signals_per_s"] == pytest.approx(10 / 0.005)  # over the 5 ms it covers
    # weighted by signals: 100 of the 101 took 2 ms, so p99 is 2 ms, not 9
    assert rows[0]["signal_p50_ms"] == pytest.approx(2.0) and rows[0]["signal_p99_ms"] == pytest.approx(2.0)
    assert rows[0]["leave_p50_ms"] == pytest.approx(3.0) and rows[1]["leave_p50_ms"] is None
    assert log.points("leave") == ([0.008], [pytest.approx(3.0)])


def _figure_of(result: Any, path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from tidal_actors._simulate_plot import plot_timeline

    saved: list[Any] = []
    real = Figure.savefig

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        saved.append(self)
        real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    plot_timeline(result, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return saved[0]


@pytest.mark.parametrize("name", ["small", "restart"])
def test_a_short_runs_plot_spans_the_run_and_labels_every_line(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = load_scenario(name)
    if name == "restart":
        scenario = scenario.scaled(0.02)  # 40 signal batches: enough for a curve
    result = run_simulation(scenario, lambda c, k: ReferenceModel(config=c, clock=k))
    assert result.runtime_s < 5
    rows = result.timeline
    assert len(rows) >= 5  # a curve, not a point (0.5 s intervals gave one or none)
    fig = _figure_of(result, tmp_path / "p.png", monkeypatch)
    top, bottom = fig.axes[:2]
    assert scenario.name in fig._suptitle.get_text()
    assert "reference model" in fig._suptitle.get_text()
    lo, hi = top.get_xlim()
    scale = 1000 if rows[-1]["t_s"] < 2 else 1
    assert lo == 0 and hi == pytest.approx(rows[-1]["t_s"] * scale)
    for ax in (top, bottom):
        drawn = ax.get_lines() + ax.collections + ax.patches
        handles, labels = ax.get_legend_handles_labels()
        assert drawn and all(not a.get_label().startswith("_") for a in drawn if a in handles)
        assert len(labels) == len(set(labels)) and labels
        unlabelled = [a for a in ax.get_lines() + ax.collections if a.get_label().startswith("_")]
        assert not unlabelled, unlabelled
    if name == "restart":
        assert any(lbl.startswith("restart pause") for lbl in top.get_legend_handles_labels()[1])
