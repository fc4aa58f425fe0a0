"""``simulate --plot``: throughput and latency over a run, as a PNG (matplotlib).

Owns the drawing only; the figures come from a `_simulate.SimulationResult` (its
timeline, whose interval was chosen from the run's length, and each sparse
operation's calls). Every line and mark has a legend entry, the title says what was
run, and the time axis is in milliseconds for runs under two seconds. matplotlib is
the ``plot`` extra: imported here, when a plot is asked for, never by the library.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ._errors import InvalidArgument

__all__ = ["plot_timeline"]

_COLOURS = {"signal": "tab:blue", "assign": "tab:green", "leave": "tab:orange",
            "rejoin": "tab:purple", "purge": "tab:red"}


def _span(width_s: float) -> str:
    """An interval for people: 5 ms, 0.2 s, 2 s."""
    return f"{width_s * 1000:g} ms" if width_s < 0.1 else f"{width_s:g} s"


def _title(result: Any) -> str:
    sc, c = result.scenario, result.counts
    where = "on a store" if sc.durable else "in memory"
    check = "check OK" if result.ok else "check FAILED"
    return (f"tidal-actors simulate {sc.name} (seed {sc.seed}): {sc.users:,} users, "
            f"{c.signals:,} signals, {c.leaves:,} leaves, {c.purges:,} purges, {where}\n"
            f"runtime {result.signals_per_s:,.0f} signals/s over {result.runtime_s:.3g} s; "
            f"reference model {result.reference_signals_per_s:,.0f} signals/s; {check}")


def plot_timeline(result: Any, path: str | Path) -> None:
    """Draw throughput (signals/s per interval, beside the whole run's and the
    reference model's) and latency (signal acknowledgement p50/p99 per interval;
    leave, rejoin, purge and assign call by call when sparse, else per interval)
    over the run into a PNG at ``path``.

    Raises:
        InvalidArgument: matplotlib is not installed (the ``plot`` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidArgument("--plot", str(path),
                              "needs matplotlib: pip install -e '.[plot]' (from the repository's folder)") from None
    rows = result.timeline
    width = rows[0]["width_s"] if rows and "width_s" in rows[0] else None
    end = rows[-1]["t_s"] if rows else max(result.runtime_s, 1e-3)
    scale, unit = (1000.0, "ms") if end < 2 else (1.0, "s")
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(13, 7))

    # throughput: one step per interval, the interval's own rate
    if rows:
        xs = [0.0] + [r["t_s"] * scale for r in rows]
        ys = [r["signals_per_s"] for r in rows]
        top.stairs(ys, xs, color="tab:blue", lw=1.4, label=(
            f"runtime, per {_span(width)} interval" if width else "runtime, per interval"))
    top.axhline(result.signals_per_s, color="tab:blue", ls="--", lw=1,
                label=f"runtime, whole run: {result.signals_per_s:,.0f} signals/s")
    top.axhline(result.reference_signals_per_s, color="black", ls=":", lw=1.2,
                label=f"reference model (single-threaded): {result.reference_signals_per_s:,.0f} signals/s")
    top.set_ylim(bottom=0)
    top.set_ylabel("signals / s")
    top.grid(alpha=0.3)

    # latency
    points = getattr(result, "points", {}) or {}
    for op, colour in _COLOURS.items():
        label = "signal ack" if op == "signal" else op
        if op != "signal" and op in points:
            t, ms = points[op]
            bottom.scatter([x * scale for x in t], ms, s=14, color=colour, marker="o",
                           alpha=0.8, label=f"{label}, each call ({len(t):,})")
            continue
        for q, style in (("p50", ":"), ("p99", "-")):
            values = [r.get(f"{op}_{q}_ms") for r in rows]
            if any(v is not None for v in values):
                # an interval without a call breaks the line (nan), never bridges it
                xs_mid = [(r["t_s"] - r.get("width_s", 0) / 2) * scale for r in rows]
                ys_q = [math.nan if v is None else v for v in values]
                per = f" per {_span(width)}" if width else ""
                bottom.plot(xs_mid, ys_q, style, color=colour, lw=1.1, marker=".", ms=4,
                            label=f"{label} {q}{per}")
    bottom.set_yscale("log")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel(f"{unit} into the measured run" + (
        f" (after {result.setup_s:.3g} s of set-up: users joining their cohorts, not shown)"
        if getattr(result, "setup_s", 0) else ""))
    bottom.grid(alpha=0.3, which="both")

    restart = getattr(result, "restart", None)
    marks: dict[str, float] = {label: float(x) for x, label in result.marks}
    if "restart" in marks:
        a = marks["restart"]
        b = marks.get("resumed", a)
        reopen = f"; reopen {restart['restore_s']:.2g} s" if restart else ""
        text = f"restart pause, not counted ({b - a:.2g} s{reopen})"
        for ax in (top, bottom):
            ax.axvspan(a * scale, b * scale, color="grey", alpha=0.25, lw=0,
                       label=text if ax is top else None)
    top.set_xlim(0, end * scale)
    # legends beside the panels, where they hide no line
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.suptitle(_title(result), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
