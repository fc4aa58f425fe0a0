"""The run's timeline (intervals chosen from its length) and ``simulate --plot``.

Expected intervals, rates and percentiles are worked out by hand from the calls
recorded here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidal_actors.loadsim.simulate import LATENCY_OPS, load_scenario, run_simulation
from tidal_actors.loadsim.timeline import CallLog, resolution
from tidal_actors.testing import ReferenceModel


@pytest.mark.parametrize(
    ("span_s", "calls", "width"),
    [
        (0.2, 3000, 0.005),  # 80 intervals of 2.5 ms -> the next 1-2-5 step, 5 ms
        (0.2, 48, 0.02),  # 48 calls: 12 intervals of 4 calls -> 16.7 ms -> 20 ms
        (1200.0, 2000, 20.0),  # 20 minutes, 80 intervals of 15 s -> 20 s
        (0.01, 10_000, 0.001),  # never below 1 ms
        (5.0, 1, 5.0),  # one call: one interval
    ],
)
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
    assert [r["t_s"] for r in rows] == [0.01, 0.02, 0.025]  # the last ends with the run
    assert rows[0]["signals_per_s"] == pytest.approx(101 / 0.01)
    assert rows[1]["signals_per_s"] == pytest.approx(50 / 0.01)
    assert rows[2]["signals_per_s"] == pytest.approx(10 / 0.005)  # over the 5 ms it covers
    # weighted by signals: 100 of the 101 took 2 ms, so p99 is 2 ms, not 9
    assert rows[0]["signal_p50_ms"] == pytest.approx(2.0) and rows[0][
        "signal_p99_ms"
    ] == pytest.approx(2.0)
    assert rows[0]["leave_p50_ms"] == pytest.approx(3.0) and rows[1]["leave_p50_ms"] is None
    assert log.points("leave") == ([0.008], [pytest.approx(3.0)])


def _figure_of(result: Any, path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from tidal_actors.loadsim.plot import plot_timeline

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
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = load_scenario(name)
    if name == "restart":
        scenario = scenario.scaled(0.02)  # 40 signal batches: enough for a curve
    result = run_simulation(
        scenario, lambda c, k: ReferenceModel(config=c, clock=k), reference=ReferenceModel
    )
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


def test_a_sliver_at_the_end_joins_the_interval_before_it() -> None:
    log = CallLog(LATENCY_OPS)
    log.add(0.005, "signal", 0.001, 10)
    log.add(0.015, "signal", 0.001, 30)  # the run ends at 22 ms, after a 2 ms flush
    rows = log.timeline(0.022, 0.01)
    assert [(r["start_s"], r["t_s"]) for r in rows] == [(0.0, 0.01), (0.01, 0.022)]
    assert [r["signals_per_s"] for r in rows] == pytest.approx([10 / 0.01, 30 / 0.012])


def test_a_pause_is_left_out_and_each_stretch_ends_where_it_ends() -> None:
    log = CallLog(LATENCY_OPS)
    log.add(0.004, "signal", 0.001, 10)
    log.add(0.012, "signal", 0.002, 20)
    # a restart's pause from 15 ms to 31 ms; the run goes on to 40 ms
    log.add(0.035, "signal", 0.003, 30)
    rows = log.timeline(0.040, 0.01, pauses=((0.015, 0.031),))
    assert [(r["start_s"], r["t_s"]) for r in rows] == [(0.0, 0.01), (0.01, 0.015), (0.031, 0.04)]
    # each interval's rate is over the time it covers, the pause's never counted
    assert [r["signals_per_s"] for r in rows] == pytest.approx([10 / 0.01, 20 / 0.005, 30 / 0.009])
    assert [r["signal_p50_ms"] for r in rows] == pytest.approx([1.0, 2.0, 3.0])


def _fake_result(reference_per_s: float, assigns: int, pause: bool = False) -> Any:
    from types import SimpleNamespace

    log = CallLog(LATENCY_OPS)
    pauses = ((0.3, 0.5),) if pause else ()
    for i in range(
        60
    ):  # 100 signals every 10 ms, to 0.6 s (none in a pause); the run ends at 0.813 s
        if not (pause and 30 <= i < 50):
            log.add(0.01 * (i + 0.5), "signal", 0.001, 100)
    rows = log.timeline(0.813, 0.1, pauses=pauses)
    scenario = SimpleNamespace(name="fake", seed=1, users=10, durable=True)
    counts = SimpleNamespace(signals=4000 if pause else 6000, leaves=1, purges=1)
    times = [0.813 * i / max(assigns, 1) for i in range(assigns)]
    return SimpleNamespace(
        scenario=scenario,
        counts=counts,
        ok=True,
        runtime_s=0.813 - (0.2 if pause else 0),
        signals_per_s=6000 / 0.813,
        reference_signals_per_s=reference_per_s,
        timeline=rows,
        points={"assign": (times, [1.0] * assigns)} if assigns else {},
        marks=[(0.3, "restart"), (0.5, "resumed")] if pause else [],
        restart={"restore_s": 0.05} if pause else None,
        setup_s=0.0,
    )


def test_the_plot_ends_with_the_run_without_a_drop_to_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fig = _figure_of(_fake_result(9000.0, 0, pause=True), tmp_path / "p.png", monkeypatch)
    top = fig.axes[0]
    assert top.get_xlim() == pytest.approx((0, 813))  # ms: the run's end, not 900 or 1000
    steps = [p for p in top.patches if type(p).__name__ == "StepPatch"]
    edges = [list(p.get_data().edges) for p in steps]
    # two stretches, split by the pause (300-500 ms); none drawn down to 0 at its ends
    # (the 13 ms sliver at the end joins the interval before it: 700-813 ms)
    assert edges == [pytest.approx([0, 100, 200, 300]), pytest.approx([500, 600, 700, 813])]
    assert all(p.get_data().baseline is None for p in steps)
    # 500-600 ms holds the 10 calls of 100 signals returning at 505-595 ms, in 0.1 s
    assert list(steps[1].get_data().values) == pytest.approx([10_000, 0, 0])
    pause = next(t for t in top.get_legend_handles_labels()[1] if t.startswith("restart pause"))
    assert "0.2 s" in pause and "reopening the store 0.05 s" in pause and "the rest:" in pause


def test_a_reference_model_far_above_the_runtime_is_written_not_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fig = _figure_of(_fake_result(100_000.0, 0), tmp_path / "p.png", monkeypatch)
    top = fig.axes[0]
    assert not [ln for ln in top.get_lines() if ln.get_ydata()[0] == 100_000.0]
    assert top.get_ylim()[1] < 20_000  # the runtime's curve fills the panel
    text = " ".join(t.get_text() for t in top.texts)
    assert "100,000 signals/s" in text and "in memory" in text
    assert any("writing to a store" in lbl for lbl in top.get_legend_handles_labels()[1])
    # near the runtime's rate it is a line
    fig = _figure_of(_fake_result(9000.0, 0), tmp_path / "q.png", monkeypatch)
    assert [ln for ln in fig.axes[0].get_lines() if ln.get_ydata()[0] == 9000.0]


def test_dense_control_calls_are_drawn_behind_the_signal_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fig = _figure_of(_fake_result(9000.0, 4000), tmp_path / "p.png", monkeypatch)
    bottom = fig.axes[1]
    dots = next(c for c in bottom.collections if c.get_label().startswith("assign"))
    lines = [ln for ln in bottom.get_lines() if ln.get_label().startswith("signal ack")]
    assert lines and all(ln.get_zorder() > dots.get_zorder() for ln in lines)
    assert max(dots.get_sizes()) < 14 and dots.get_alpha() < 0.5
    sparse = next(
        c
        for c in _figure_of(_fake_result(9000.0, 20), tmp_path / "q.png", monkeypatch)
        .axes[1]
        .collections
        if c.get_label().startswith("assign")
    )
    assert max(sparse.get_sizes()) == 14
