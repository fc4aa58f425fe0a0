"""What the Ray host does when an actor's process dies or restarts
(`runtime.ray_host.RayHost`'s base class; docs/cluster.md, "What survives what").

* A process that died and is not restarted in place: `_watch` probes every actor
  every ``PROBE_S`` and fails every call waiting and every later call with
  `ActorFailure` saying each may have been applied; `_lost` fences this process's
  stale copy of its state.
* A restart in place: `_fault` takes the new incarnation's notice, re-sends what
  did not survive (`Links.restarted`) and fails the calls that were in flight to a
  restarted membership shard or coordinator, saying they may have been applied.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

import ray

from tidal_actors._errors import ActorFailure
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.recovery import FaultReport
from tidal_actors.runtime.pykka_host import HostContext
from tidal_actors.runtime.ray_links import Links
from tidal_actors.runtime.ray_replies import ReplyPath
from tidal_actors.runtime.ray_restart import CoordinatorRestart, LedgerRestart, MembershipRestart
from tidal_actors.runtime.supervision import Fenced

__all__ = ["PROBE_S", "RayFaults"]

PROBE_S = 1.0  # how often the reply path looks whether an actor's process died (seconds)


class RayFaults:
    """Deaths and restarts of the actors' processes (`RayHost` sets the attributes)."""

    ctx: HostContext
    behaviours: dict[M.Address, Behaviour]
    on_replace: Callable[[M.Address, Behaviour], None] | None
    reports: collections.deque[FaultReport]
    on_fault: Callable[[FaultReport], None] | None
    path: ReplyPath
    links: Links
    _actors: dict[M.Address, Any]
    _stopped: bool
    _dead: ActorFailure | None
    _probes: dict[M.Address, Any]
    _next_probe: float

    def _lost(self, address: M.Address, exc: BaseException) -> None:
        """``address``'s state is gone with its process: this process's copy of it is
        stale, so it is fenced here (`Core._replaced`: no snapshot is written from
        it, close() says so, and the next open restores from the store)."""
        err = ActorFailure(f"{address[0]}[{address[1]}]'s process died: {exc}")
        fence = Fenced(self.ctx, address, err)
        self.behaviours[address] = fence
        if self.on_replace is not None:
            self.on_replace(address, fence)

    def _watch(self) -> None:
        """Every ``PROBE_S``: an actor whose process died fails every call waiting and
        every call after (the database must be reopened)."""
        now = time.monotonic()
        if self._dead is not None or self._stopped or now < self._next_probe:
            return
        self._next_probe = now + PROBE_S
        refs = list(self._probes.values())
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        for address, ref in list(self._probes.items()):
            if ref not in done:
                continue
            del self._probes[address]
            try:
                ray.get(ref, timeout=0)
            except ray.exceptions.ActorUnavailableError:
                continue  # a ledger restarting in place (`runtime.ray_restart`)
            except Exception as exc:  # noqa: BLE001 - the actor died (RayActorError)
                kind, index = address
                self._dead = ActorFailure(
                    f"{kind}[{index}]'s process died ({type(exc).__name__}): calls in flight "
                    "failed, and each may have been applied; close the database and open it "
                    "again (the store holds what was committed)"
                )
                self.path.fail_all(self._dead)
                return
        for address, h in list(self._actors.items()):
            if address not in self._probes:
                self._probes[address] = h.ready.remote()

    def _fault(
        self, report: FaultReport | LedgerRestart | MembershipRestart | CoordinatorRestart
    ) -> None:
        if isinstance(report, LedgerRestart):  # restore by handshake (`Links.restarted`)
            self.links.restarted(report)
            return
        if isinstance(report, CoordinatorRestart):  # `ray_coordinator_restart`
            err = ActorFailure(
                "the purge coordinator's process died while this call was in flight to "
                "it, and it restarted from the store: the call may have been applied (a "
                "purge if its manifest committed: list_purge_manifests says; nothing of "
                "an uncommitted one is applied, and it may be requested again)"
            )
            for reply in self.links.restarted_coordinator(report):
                reply.set_exception(err)
            return
        if isinstance(report, MembershipRestart):  # `ray_membership_restart`
            kind, index = report.address
            err = ActorFailure(
                f"{kind}[{index}]'s process died while this call was in flight to it, and "
                "it restarted from the store: the call may have been applied (a control "
                "operation if its commit happened: read the state to know; a flush: the "
                "signals since the last completed flush may be partly applied)"
            )
            for reply in self.links.restarted_membership(report):
                reply.set_exception(err)
            return
        self.reports.append(report)
        if self.on_fault is not None:
            self.on_fault(report)
