"""What a simulation run did and found (:class:`SimulationResult`), and its report
as JSON-ready values (``simulate --report-out``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tidal_actors.eventlog.log import ApplyCounts
from tidal_actors.loadsim.check import CheckResult
from tidal_actors.loadsim.scenario import Scenario

__all__ = ["SimulationResult"]


@dataclass
class SimulationResult:
    """What :func:`run_simulation` did and found.

    Attributes:
        scenario: the scenario run.
        events: rows generated.
        counts: what was applied (the runtime's run).
        runtime_s, reference_s: seconds to apply the rows and flush, runtime and
            reference model (a restart's close and reopen are not counted).
        stats: the runtime's counters after the run (summed over a restart).
        at_ns: the time the aggregates were compared at (the last event's, int ns).
        check: the comparison with the reference model.
        latency: :meth:`Latency.summary` of the run.
        timeline: :attr:`Latency.timeline` (throughput and latency over the run).
        marks: ``(seconds into the run, label)``: ``"restart"`` where a restart's
            pause (not counted in ``runtime_s``) began, ``"resumed"`` where it ended.
        memory: ``baseline_rss``, ``peak_rss``, ``end_rss`` (bytes), ``peak_bytes`` and
            ``end_bytes`` (RSS above the baseline taken before the open),
            ``retained_records`` (contribution records in the logs at the end),
            ``bytes_per_retained_record`` (end RSS above baseline / retained) and, for
            the runtime, ``structures`` (bytes by part) and
            ``structure_bytes_per_retained_record``.
        restore_s: seconds to reopen the store at the end (None when ephemeral).
        restart: for a mid-run restart: ``after_rows``, ``restore_s`` and
            ``differences`` (figures that changed across it; empty when all equal).
        reopen_differences: figures that changed across the final reopen.
        setup_s: seconds of the ``assign_upfront`` set-up (not in ``runtime_s``).
        points: per sparse operation (at most 5,000 calls), each call's
            ``(seconds into the run, latency ms)`` (:meth:`Latency.points`).
    """

    scenario: Scenario
    events: int
    counts: ApplyCounts
    runtime_s: float
    reference_s: float
    stats: dict[str, int]
    at_ns: int
    check: CheckResult
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    marks: list[tuple[float, str]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    restore_s: float | None = None
    restart: dict[str, Any] | None = None
    reopen_differences: list[str] = field(default_factory=list)
    setup_s: float = 0.0
    points: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)

    @property
    def signals_per_s(self) -> float:
        """Runtime throughput in signals per second."""
        return self.counts.signals / self.runtime_s if self.runtime_s > 0 else float("inf")

    @property
    def reference_signals_per_s(self) -> float:
        """Reference-model throughput in signals per second."""
        return self.counts.signals / self.reference_s if self.reference_s > 0 else float("inf")

    @property
    def ok(self) -> bool:
        """The check passed and every reopen kept every figure."""
        return (
            self.check.ok
            and not self.reopen_differences
            and not (self.restart and self.restart["differences"])
        )

    def report(self) -> dict[str, Any]:
        """Everything above as JSON-ready values."""
        c, check = self.counts, self.check
        return {
            "scenario": self.scenario.name,
            "seed": self.scenario.seed,
            "events": self.events,
            "users": self.scenario.users,
            "cohorts": self.scenario.cohorts,
            "entities": self.scenario.entities,
            "signals": c.signals,
            "assigns": c.assigns,
            "leaves": c.leaves,
            "rejoins": c.rejoins,
            "purges": c.purges,
            "manifests": c.manifests,
            "manifest_entries": c.manifest_entries,
            "manifest_evicted": c.manifest_evicted,
            "stats": self.stats,
            "runtime_s": self.runtime_s,
            "signals_per_s": self.signals_per_s,
            "reference_s": self.reference_s,
            "reference_signals_per_s": self.reference_signals_per_s,
            "latency_ms": self.latency,
            "memory": self.memory,
            "restore_s": self.restore_s,
            "restart": self.restart,
            "reopen_differences": self.reopen_differences,
            "setup_s": self.setup_s,
            "check_ok": check.ok,
            "ok": self.ok,
            "aggregate_rows": check.aggregate_rows,
            "users_compared": check.users,
            "manifests_compared": check.manifests,
            "at_ns": self.at_ns,
            "mismatches": check.mismatches,
            "details": check.details,
            "timeline": self.timeline,
            "marks": self.marks,
        }
