"""A run's calls over time: kept one by one, binned once the run's length is known.

Owns `CallLog` (every timed call of a ``simulate`` run: when it returned, which
operation, how long it took, how many signals it carried) and the timeline made from
it: throughput and latency percentiles per interval, the interval chosen from the
run's length and its number of calls (`resolution`), so a run of 0.2 s and one of
20 minutes both get a readable curve. Signal-ack percentiles are weighted by the
signals a call carried, as the run's totals are. Pure: no clock is read here.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

import numpy as np

__all__ = ["CallLog", "resolution"]

_STEPS = (1, 2, 5)
TARGET_BINS = 80  # a curve's points across the plot, at most
MIN_CALLS_PER_BIN = 4  # fewer signal calls per interval make throughput a comb


def resolution(span_s: float, signal_calls: int) -> float:
    """The interval (seconds, a 1-2-5 step) for a run of ``span_s`` seconds with
    ``signal_calls`` signal calls: about `TARGET_BINS` intervals, fewer when that
    would leave under `MIN_CALLS_PER_BIN` calls in one; at least 1 ms."""
    bins = max(1, min(TARGET_BINS, signal_calls // MIN_CALLS_PER_BIN))
    raw = max(span_s / bins, 1e-3)
    exp = math.floor(math.log10(raw))
    for step in _STEPS + (10,):
        width = step * 10.0**exp
        if width >= raw * (1 - 1e-9):
            return round(width, 9)
    return round(10.0 ** (exp + 1), 9)  # pragma: no cover - the loop always returns


def _weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    i = int(np.searchsorted(cum, q / 100 * cum[-1], side="left"))
    return float(values[order][min(i, len(order) - 1)])


class CallLog:
    """Every call of a run, in order: ``t`` seconds into the run when it returned,
    its operation's index in ``ops``, its latency (s) and the signals it carried."""

    def __init__(self, ops: tuple[str, ...]) -> None:
        self.ops = ops
        self.t = array("d")
        self.op = array("B")
        self.seconds = array("d")
        self.count = array("I")

    def add(self, t: float, op: str, seconds: float, count: int) -> None:
        self.t.append(t)
        self.op.append(self.ops.index(op))
        self.seconds.append(seconds)
        self.count.append(count)

    def points(self, op: str) -> tuple[list[float], list[float]]:
        """``(t_s, latency_ms)`` of each call of ``op``."""
        mask = np.frombuffer(self.op, dtype=np.uint8) == self.ops.index(op)
        t = np.frombuffer(self.t, dtype=np.float64)[mask]
        ms = np.frombuffer(self.seconds, dtype=np.float64)[mask] * 1000
        return t.tolist(), ms.tolist()

    def calls(self, op: str) -> int:
        return int(np.count_nonzero(np.frombuffer(self.op, dtype=np.uint8) == self.ops.index(op)))

    def timeline(
        self,
        span_s: float,
        width_s: float | None = None,
        binned: tuple[str, ...] = ("signal", "leave", "purge"),
        pauses: tuple[tuple[float, float], ...] = (),
    ) -> list[dict[str, Any]]:
        """Per interval of ``width_s`` (default: `resolution`) from 0 to ``span_s``:
        ``start_s`` and ``t_s`` (its ends), ``width_s`` (the step), ``signals_per_s``
        and ``{op}_p50_ms`` / ``{op}_p99_ms`` for ``binned`` ops (None where the
        interval has no call). ``pauses`` (``(from_s, to_s)``, e.g. a restart) are
        not the run's: the intervals stop where a pause starts and start again where
        it ends, so none straddles one. The last interval of each stretch ends with
        the stretch (the run's end, a pause's start): its rate is over the time it
        covers, never over a full interval's width; one shorter than half an
        interval is joined to the interval before it."""
        if not len(self.t):
            return []
        t = np.frombuffer(self.t, dtype=np.float64)
        span_s = max(span_s, float(t.max()), 1e-9)
        stretches: list[tuple[float, float]] = []
        at = 0.0
        for a, b in sorted(pauses):
            if a > at:
                stretches.append((at, min(a, span_s)))
            at = max(at, b)
        if at < span_s:
            stretches.append((at, span_s))
        counted = sum(b - a for a, b in stretches)
        if width_s is None or width_s <= 0:
            width_s = resolution(counted, self.calls("signal"))
        edges: list[tuple[float, float]] = []
        for a, b in stretches:
            n = max(1, math.ceil((b - a) / width_s - 1e-9))
            part = [(a + i * width_s, min(a + (i + 1) * width_s, b)) for i in range(n)]
            if n > 1 and part[-1][1] - part[-1][0] < width_s * (0.5 - 1e-9):
                # a sliver (often the final flush, with no call in it) joins the interval
                # before it, rather than showing as a drop at the stretch's end
                part[-2:] = [(part[-2][0], b)]
            edges.extend(part)
        ends = np.array([hi for _, hi in edges])
        # a call belongs to the interval its return time falls in, (start, end]
        idx = np.minimum(np.searchsorted(ends, t, side="left"), len(edges) - 1)
        n = len(edges)
        ops = np.frombuffer(self.op, dtype=np.uint8)
        secs = np.frombuffer(self.seconds, dtype=np.float64)
        counts = np.frombuffer(self.count, dtype=np.uint32).astype(np.int64)
        sig = self.ops.index("signal")
        signals = np.bincount(idx[ops == sig], weights=counts[ops == sig], minlength=n)
        rows: list[dict[str, Any]] = [
            {
                "start_s": round(lo, 9),
                "t_s": round(hi, 9),
                "width_s": width_s,
                "signals_per_s": float(signals[i]) / max(hi - lo, 1e-9),
            }
            for i, (lo, hi) in enumerate(edges)
        ]
        for name in binned:
            k = self.ops.index(name)
            sel = ops == k
            b, v, w = idx[sel], secs[sel] * 1000, counts[sel]
            order = np.argsort(b, kind="stable")
            b, v, w = b[order], v[order], w[order]
            starts = np.searchsorted(b, np.arange(n), side="left")
            ends = np.searchsorted(b, np.arange(n), side="right")
            for i in range(n):
                lo, hi = starts[i], ends[i]
                has = hi > lo
                rows[i][f"{name}_p50_ms"] = (
                    _weighted_percentile(v[lo:hi], w[lo:hi], 50) if has else None
                )
                rows[i][f"{name}_p99_ms"] = (
                    _weighted_percentile(v[lo:hi], w[lo:hi], 99) if has else None
                )
        return rows
