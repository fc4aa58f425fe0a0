"""``simulate --plot``: throughput and latency over a run, as a PNG (matplotlib).

Owns the drawing only; the figures come from a `report.SimulationResult` (its
timeline, whose interval was chosen from the run's length, and each sparse
operation's calls). Every line and mark has a legend entry, the title says what was
run, and the time axis is in milliseconds for runs under two seconds. matplotlib is
the ``plot`` extra: imported here, when a plot is asked for, never by the library.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tidal_actors._errors import InvalidArgument
from tidal_actors._text import plural

__all__ = ["plot_timeline"]

_COLOURS = {
    "signal": "tab:blue",
    "assign": "tab:green",
    "leave": "tab:orange",
    "rejoin": "tab:purple",
    "purge": "tab:red",
}


def _span(width_s: float) -> str:
    """An interval for people: 5 ms, 0.2 s, 2 s."""
    return f"{width_s * 1000:g} ms" if width_s < 0.1 else f"{width_s:g} s"


_OFF_SCALE = 3.0
"""A reference-model rate above this many times the runtime's highest is written
beside the throughput panel, not drawn across it."""
_DENSE = 500
"""Control calls above this many are drawn as small, light dots."""


def _stretches(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``rows`` (`timeline.CallLog.timeline`) in runs of adjoining intervals: a
    restart's pause separates two."""
    parts: list[list[dict[str, Any]]] = []
    for r in rows:
        r = dict(r)
        r.setdefault("start_s", r["t_s"] - r.get("width_s", 0))
        if parts and abs(parts[-1][-1]["t_s"] - r["start_s"]) < 1e-9:
            parts[-1].append(r)
        else:
            parts.append([r])
    return parts


def _title(result: Any) -> str:
    sc, c = result.scenario, result.counts
    where = "on a store" if sc.durable else "in memory"
    check = "check OK" if result.ok else "check FAILED"
    return (
        f"tidal-actors simulate {sc.name} (seed {sc.seed}): {plural(sc.users, 'user')}, "
        f"{plural(c.signals, 'signal')}, {plural(c.leaves, 'leave')}, "
        f"{plural(c.purges, 'purge')}, {where}\n"
        f"runtime {result.signals_per_s:,.0f} signals/s over {result.runtime_s:.3g} s; "
        f"reference model {result.reference_signals_per_s:,.0f} signals/s; {check}"
    )


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
        raise InvalidArgument(
            "--plot",
            str(path),
            "needs matplotlib: pip install -e '.[plot]' (from the repository's folder)",
        ) from None
    rows = result.timeline
    width = rows[0]["width_s"] if rows and "width_s" in rows[0] else None
    end = rows[-1]["t_s"] if rows else max(result.runtime_s, 1e-3)
    scale, unit = (1000.0, "ms") if end < 2 else (1.0, "s")
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(13, 7))
    stretches = _stretches(rows)
    durable = result.scenario.durable

    # throughput: one step per interval, the interval's own rate over the time it
    # covers; no edge down to 0 at a stretch's ends (baseline None)
    per = f"per {_span(width)} interval" if width else "per interval"
    for i, part in enumerate(stretches):
        edges = [part[0]["start_s"] * scale] + [r["t_s"] * scale for r in part]
        top.stairs(
            [r["signals_per_s"] for r in part],
            edges,
            baseline=None,
            color="tab:blue",
            lw=1.4,
            label=None if i else f"runtime{', writing to a store' if durable else ''}, {per}",
        )
    run_rate, ref_rate = result.signals_per_s, result.reference_signals_per_s
    top.axhline(
        run_rate,
        color="tab:blue",
        ls="--",
        lw=1,
        label=f"runtime, whole run: {run_rate:,.0f} signals/s",
    )
    highest = max([run_rate] + [r["signals_per_s"] for r in rows])
    ref_text = f"reference model (single-threaded, in memory): {ref_rate:,.0f} signals/s"
    if ref_rate > _OFF_SCALE * highest:
        # drawn, it would squash the runtime's curve to the bottom of the panel
        top.text(
            1.01,
            0.02,
            ref_text.replace(": ", ":\n") + f"\n({ref_rate / run_rate:,.0f}x the "
            "runtime's whole run; not drawn,\nit would flatten the curve)",
            fontsize=8,
            transform=top.transAxes,
            va="bottom",
            ha="left",
        )
    else:
        top.axhline(ref_rate, color="black", ls=":", lw=1.2, label=ref_text)
    top.set_ylim(bottom=0)
    top.set_ylabel("signals / s")
    top.grid(alpha=0.3)

    # latency: the signal-ack lines in front, control calls behind them
    points = getattr(result, "points", {}) or {}
    for op, colour in _COLOURS.items():
        label = "signal ack" if op == "signal" else op
        if op != "signal" and op in points:
            t, ms = points[op]
            dense = len(t) > _DENSE
            bottom.scatter(
                [x * scale for x in t],
                ms,
                s=4 if dense else 14,
                color=colour,
                marker="o",
                alpha=0.3 if dense else 0.8,
                lw=0,
                zorder=1,
                label=f"{label}, each call ({len(t):,})",
            )
            continue
        for q, style in (("p50", ":"), ("p99", "-")):
            if not any(r.get(f"{op}_{q}_ms") is not None for r in rows):
                continue
            xs_mid: list[float] = []
            ys_q: list[float] = []
            for part in stretches:
                # an interval without a call, and a pause, break the line (nan)
                xs_mid += [(r["start_s"] + r["t_s"]) / 2 * scale for r in part] + [math.nan]
                ys_q += [
                    math.nan if r.get(f"{op}_{q}_ms") is None else r[f"{op}_{q}_ms"] for r in part
                ] + [math.nan]
            bottom.plot(
                xs_mid,
                ys_q,
                style,
                color=colour,
                lw=1.3,
                marker=".",
                ms=4,
                zorder=3,
                label=f"{label} {q} per {_span(width)}" if width else f"{label} {q}",
            )
    bottom.set_yscale("log")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel(
        f"{unit} into the measured run"
        + (
            f" (after {result.setup_s:.3g} s of set-up: users joining their cohorts, not shown)"
            if getattr(result, "setup_s", 0)
            else ""
        )
    )
    bottom.grid(alpha=0.3, which="both")

    restart = getattr(result, "restart", None)
    marks: dict[str, float] = {label: float(x) for x, label in result.marks}
    if "restart" in marks:
        a = marks["restart"]
        b = marks.get("resumed", a)
        reopen = (
            (
                f"\n(reopening the store {restart['restore_s']:.2g} s; the rest: flushing, "
                "settling\nre-materializations, closing, and reading every\nfigure before "
                "and after to compare them)"
            )
            if restart
            else ""
        )
        text = f"restart pause, not counted: {b - a:.2g} s{reopen}"
        for ax in (top, bottom):
            ax.axvspan(
                a * scale,
                b * scale,
                color="grey",
                alpha=0.25,
                lw=0,
                label=text if ax is top else None,
            )
    top.set_xlim(0, end * scale)
    # legends beside the panels, where they hide no line
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    if bottom.get_legend_handles_labels()[0]:
        legend = bottom.legend(
            fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0
        )
        for handle in legend.legend_handles:  # a light dot's key is drawn full strength
            if handle is not None:
                handle.set_alpha(1)
                if hasattr(handle, "set_sizes"):
                    handle.set_sizes([14])
    fig.suptitle(_title(result), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
