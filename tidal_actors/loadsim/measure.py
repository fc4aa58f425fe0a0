"""Measuring a run: the latency of every call (HdrHistograms), throughput and
latency over time (`timeline.CallLog`), the process's resident memory (baseline,
sampled peak, settled end) and the bytes the ledgers' structures hold."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
import time
from typing import Any

from tidal_actors.loadsim.timeline import CallLog

__all__ = ["LATENCY_OPS", "Latency", "PeakRss", "settled_rss", "structure_bytes"]

LATENCY_OPS = ("signal", "assign", "leave", "rejoin", "purge")
"""Operations whose latency is recorded; ``signal`` is a ``signal_batch`` call
returning (the acknowledgement: every signal of the batch is validated and queued in
order), counted once per signal it carried."""
_HIGHEST_US = 3_600_000_000  # an hour, in microseconds


def _histogram() -> Any:
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(1, _HIGHEST_US, 3)


class Latency:
    """Latency of every call of a run, per operation (HdrHistograms of microseconds, 3
    significant figures), and every call kept (`timeline.CallLog`) for the
    timeline: per interval, the signals per second and the p50/p99 of ``signal``,
    ``leave`` and ``purge``. The interval is ``interval_s`` or, when that is None or
    0, chosen from the run's length once it is known (`timeline.resolution`)."""

    def __init__(self, interval_s: float | None = None) -> None:
        self.total = {op: _histogram() for op in LATENCY_OPS}
        self.calls = CallLog(LATENCY_OPS)
        self.marks: list[tuple[float, str]] = []
        self.interval_s = interval_s
        self.t0 = time.perf_counter()
        self.end_s: float | None = None

    def record(self, op: str, seconds: float, count: int = 1) -> None:
        """One call of ``op`` that took ``seconds`` (on behalf of ``count`` signals)."""
        us = min(max(1, round(seconds * 1e6)), _HIGHEST_US)
        self.total[op].record_value(us, count)
        self.calls.add(time.perf_counter() - self.t0, op, seconds, count)

    def start(self) -> None:
        """The measured run starts now: the timeline's 0."""
        self.t0 = time.perf_counter()

    def mark(self, label: str) -> None:
        """Note an event (a restart) at the current time of the timeline."""
        self.marks.append((time.perf_counter() - self.t0, label))

    def close_window(self, now: float | None = None) -> None:
        """End the run's timeline (at ``now``, a ``perf_counter`` time; default now)."""
        self.end_s = (time.perf_counter() if now is None else now) - self.t0

    @property
    def timeline(self) -> list[dict[str, Any]]:
        """Throughput and latency per interval, from the start to the end of the run
        (or its last call), a restart's pause left out; see
        `timeline.CallLog.timeline`."""
        end = self.end_s if self.end_s is not None else time.perf_counter() - self.t0
        starts = [t for t, label in self.marks if label == "restart"]
        ends = [t for t, label in self.marks if label == "resumed"]
        return self.calls.timeline(
            end, self.interval_s, LATENCY_OPS, tuple(zip(starts, ends, strict=False))
        )

    def points(self, most: int = 5_000) -> dict[str, tuple[list[float], list[float]]]:
        """Each call's ``(t_s, latency_ms)`` per operation with at most ``most`` calls
        (sparse ones, shown call by call in a plot)."""
        return {op: self.calls.points(op) for op in LATENCY_OPS if 0 < self.calls.calls(op) <= most}

    def summary(self) -> dict[str, dict[str, float]]:
        """Per operation: ``count`` and ``p50_ms``, ``p99_ms``, ``p99_9_ms``, ``max_ms``,
        ``mean_ms`` (operations never called are left out)."""
        out: dict[str, dict[str, float]] = {}
        for op, h in self.total.items():
            n = h.get_total_count()
            if n:
                out[op] = {
                    "count": n,
                    "p50_ms": h.get_value_at_percentile(50) / 1000,
                    "p99_ms": h.get_value_at_percentile(99) / 1000,
                    "p99_9_ms": h.get_value_at_percentile(99.9) / 1000,
                    "max_ms": h.get_max_value() / 1000,
                    "mean_ms": h.get_mean_value() / 1000,
                }
        return out


def _rss() -> int:
    """Resident set size of this process in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def settled_rss() -> int:
    """RSS after a full collection and, with glibc, giving freed heap back to the OS."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return _rss()


class PeakRss(threading.Thread):
    """Samples the RSS every ``every_s`` seconds and keeps the highest."""

    def __init__(self, every_s: float = 0.05) -> None:
        super().__init__(name="tidal-simulate-rss", daemon=True)
        self.peak = _rss()
        self._every = every_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self._every):
            self.peak = max(self.peak, _rss())

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, _rss())


def structure_bytes(db: Any) -> dict[str, int] | None:
    """Bytes held by the ledgers' structures, by part (None for a non-runtime ``db``)."""
    core = getattr(db, "_core", None)
    ledgers = getattr(core, "ledgers", None)
    if not ledgers:
        return None
    for _attempt in range(3):  # a background re-materialization may resize a dict
        try:
            out: dict[str, int] = {}
            for ledger in ledgers:
                for part, n in {
                    **ledger.state.aggregates.memory(),
                    **ledger.state.log.memory(),
                }.items():
                    out[part] = out.get(part, 0) + n
            return out
        except RuntimeError:
            time.sleep(0.05)
    return None
