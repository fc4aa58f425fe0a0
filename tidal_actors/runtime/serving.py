"""The serving reads: a score, a window and a top-k, answered from a ledger shard's
published view in the caller's thread or task, or by the shard.

Owns `Serving`, the engine's three serving reads (docs/semantics.md, "Read
consistency"). Each comes in two forms:

* ``<read>_now`` (``read_decay_score_now``, ``read_window_now``,
  ``top_entities_now``): the answer itself when the cohort's ledger shard's view
  gives it (no `Call`, no message, no reply: what the blocking and async facades
  call), else the `Call` to wait for;
* ``<read>``: always a `Call`, an `Answered` one for a view's answer (what the test
  harness hands its caller).

Both validate their arguments in argument order, before anything is read or sent,
with the checks of `tidal_actors.core.validate` (a bad one raises InvalidArgument
naming the field and the value). The common case costs no call to them: a cohort
name a read checked before (up to ``READ_COHORTS`` remembered) is one dict lookup,
ids that are ints in range one comparison each. A caller that wrote nothing the
shard may not have applied yet (`Caller.n` against its ``seen``: one comparison) is
answered from the view at ``read_your_writes`` as at ``latest``; otherwise, and when
the view cannot answer, the read goes to the shard (`_serve`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidal_actors._types import WindowCount
from tidal_actors.actors import messages as M
from tidal_actors.actors.reply import Reply
from tidal_actors.core.published import PublishedView
from tidal_actors.core.validate import (
    I63,
    U64,
    check_cohort,
    check_consistency,
    check_id,
    check_k,
    check_timestamp,
)
from tidal_actors.runtime.call import Call
from tidal_actors.runtime.callers import Answered
from tidal_actors.runtime.engine_ops import Operations
from tidal_actors.storage.format import ledger_shard_of

__all__ = ["READ_COHORTS", "Serving"]

READ_COHORTS = 65_536  # cohort names a database remembers as checked for reads


class Serving(Operations):
    """The serving reads (see the module doc); `Core` adds the lifetime."""

    _read_cohorts: dict[str, int]  # `_read_cohort`
    _clock_now: Callable[[], int]  # the clock's ``now_ns`` (`Core`)

    def _read_cohort(self, cohort: object) -> tuple[str, int]:
        """A read's cohort, checked (`check_cohort`, ``@community`` allowed), and its
        ledger shard; names checked before are remembered (up to ``READ_COHORTS``)."""
        known = self._read_cohorts
        if type(cohort) is str:
            hit = known.get(cohort)
            if hit is not None:
                return cohort, hit
        c = check_cohort(cohort, allow_community=True)
        li = 0 if self._nl == 1 else ledger_shard_of(c, self._nl)
        if type(cohort) is str and len(known) < READ_COHORTS:
            known[c] = li
        return c, li

    def _at(self, at_ns: int | None) -> int:
        """The read time: ``at_ns`` checked, or the database clock's now."""
        if at_ns is None:
            now = self._clock_now()
            if type(now) is int and 0 <= now < I63:
                return now
            return check_timestamp("clock.now_ns()", now)
        return check_timestamp("at_ns", at_ns)

    def _view(self, ledger: int, consistency: str | None) -> PublishedView | None:
        """The view of ``ledger`` a read at ``consistency`` may answer from (marking it
        wanted), or None: the shard has no view, or the caller has writes the shard
        may not have applied yet (`_serve` then waits for them).

        Raises:
            InvalidArgument: ``consistency`` is not a level (`check_consistency`).
        """
        mode = self.config.read_consistency if consistency is None else consistency
        if mode == "read_your_writes":
            caller = self._callers.get()
            if caller is not None and caller.n > caller.seen[ledger]:
                return None  # `Caller.lagging` is not empty
        elif mode != "latest":
            check_consistency("consistency", consistency)
        shard = self.ledgers[ledger]
        shard.reads += 1  # keeps (or starts) its publishing (`LedgerViews`)
        return shard.view

    def _serve(
        self,
        name: str,
        ledger: int,
        kind: str,
        args: tuple[Any, ...],
        consistency: str | None,
        finish: Callable[[Any], Any] | None = None,
    ) -> Call[Any]:
        """A serving read the view did not answer (`_view` was asked first): sent to
        ``ledger`` behind the membership shards the caller wrote to since its writes
        were last shown applied there (``read_your_writes``), or at once."""
        lag: list[int] = []
        caller = None
        mode = self.config.read_consistency if consistency is None else consistency
        if mode == "read_your_writes":
            caller = self._callers.get()
            if caller is not None:
                lag = caller.lagging(ledger)
        reply = Reply(kind)
        read = M.Read(kind, args, reply)
        if lag:
            assert caller is not None
            upto = caller.n
            barrier = M.Barrier((ledger,), len(lag), reply, read)
            for m in lag:
                self._send(m, barrier)

            def done(values: list[Any]) -> Any:
                caller.covered((ledger,), upto)
                return values[0] if finish is None else finish(values[0])

            return Call(name, [reply], done)
        # straight to the shard, behind only what it has queued
        self.host.tell((M.LEDGER, ledger), M.BarrierPart(M.Barrier((ledger,), 1, reply, read)))
        return Call(name, [reply], None if finish is None else (lambda v: finish(v[0])))

    # -- the reads, answered at once when a view can ------------------------------------

    def read_decay_score_now(
        self,
        cohort: str,
        entity_id: int,
        signal_type: int,
        at_ns: int | None = None,
        consistency: str | None = None,
    ) -> float | Call[float]:
        """`read_decay_score`: its value when the view answers, else its `Call`
        (`_key_args`'s checks inlined: the serving path's most frequent read)."""
        li = self._read_cohorts.get(cohort) if type(cohort) is str else None
        if li is None:
            cohort, li = self._read_cohort(cohort)
        if not (type(entity_id) is int and 0 <= entity_id < U64):
            entity_id = check_id("entity_id", entity_id)
        if not (type(signal_type) is int and 0 <= signal_type < U64):
            signal_type = check_id("signal_type", signal_type)
        if self.refusing:
            self.check_open()
        # `_at` and `_view` inlined: the serving path's most frequent read
        if at_ns is None:
            at = self._clock_now()
            if not (type(at) is int and 0 <= at < I63):
                at = check_timestamp("clock.now_ns()", at)
        else:
            at = check_timestamp("at_ns", at_ns)
        mode = self.config.read_consistency if consistency is None else consistency
        lagging = False
        if mode == "read_your_writes":
            caller = self._callers.get()
            lagging = caller is not None and caller.n > caller.seen[li]
        elif mode != "latest":
            check_consistency("consistency", consistency)
        if not lagging:
            shard = self.ledgers[li]
            shard.reads += 1  # keeps (or starts) its publishing (`LedgerViews`)
            view = shard.view
            if view is not None:
                value = view.score(cohort, entity_id, signal_type, at)
                if value is not None:
                    return value
        args = (cohort, entity_id, signal_type, at)
        return self._serve("read_decay_score", li, "score", args, consistency)

    def _key_args(self, cohort: str, entity_id: int, signal_type: int) -> tuple[str, int, int, int]:
        """A key read's checked ``(cohort, ledger shard, entity_id, signal_type)``,
        the database open (`read_decay_score_now` inlines the same checks).

        Raises:
            InvalidArgument: a bad cohort, entity_id or signal_type.
            DatabaseClosed: the database is closed.
        """
        li = self._read_cohorts.get(cohort) if type(cohort) is str else None
        if li is None:
            cohort, li = self._read_cohort(cohort)
        if not (type(entity_id) is int and 0 <= entity_id < U64):
            entity_id = check_id("entity_id", entity_id)
        if not (type(signal_type) is int and 0 <= signal_type < U64):
            signal_type = check_id("signal_type", signal_type)
        if self.refusing:
            self.check_open()
        return cohort, li, entity_id, signal_type

    def read_window_now(
        self,
        cohort: str,
        entity_id: int,
        signal_type: int,
        at_ns: int | None = None,
        consistency: str | None = None,
    ) -> WindowCount | Call[WindowCount]:
        """`read_window`: its value when the view answers, else its `Call`."""
        cohort, li, entity_id, signal_type = self._key_args(cohort, entity_id, signal_type)
        at = self._at(at_ns)
        args = (cohort, entity_id, signal_type, at)
        view = self._view(li, consistency)
        if view is not None:
            value = view.window(cohort, entity_id, signal_type, at)
            if value is not None:
                return WindowCount(*value)
        return self._serve("read_window", li, "window", args, consistency, _window_count)

    def top_entities_now(
        self,
        cohort: str,
        signal_type: int,
        k: int,
        at_ns: int | None = None,
        consistency: str | None = None,
    ) -> list[tuple[int, float]] | Call[list[tuple[int, float]]]:
        """`top_entities`: its value when the view answers, else its `Call`."""
        li = self._read_cohorts.get(cohort) if type(cohort) is str else None
        if li is None:
            cohort, li = self._read_cohort(cohort)
        if not (type(signal_type) is int and 0 <= signal_type < U64):
            signal_type = check_id("signal_type", signal_type)
        if not (type(k) is int and 1 <= k < 2**31):
            k = check_k(k)
        if self.refusing:
            self.check_open()
        at = self._at(at_ns)
        view = self._view(li, consistency)
        if view is not None:
            value = view.top(cohort, signal_type, k, at)
            if value is not None:
                return value
        return self._serve("top_entities", li, "top", (cohort, signal_type, k, at), consistency)

    # -- the same reads, always as a `Call` ---------------------------------------------

    def read_decay_score(
        self,
        cohort: str,
        entity_id: int,
        signal_type: int,
        at_ns: int | None = None,
        consistency: str | None = None,
    ) -> Call[float]:
        r = self.read_decay_score_now(cohort, entity_id, signal_type, at_ns, consistency)
        return r if isinstance(r, Call) else Answered("read_decay_score", r)

    def read_window(
        self,
        cohort: str,
        entity_id: int,
        signal_type: int,
        at_ns: int | None = None,
        consistency: str | None = None,
    ) -> Call[WindowCount]:
        r = self.read_window_now(cohort, entity_id, signal_type, at_ns, consistency)
        return r if isinstance(r, Call) else Answered("read_window", r)

    def top_entities(
        self,
        cohort: str,
        signal_type: int,
        k: int,
        at_ns: int | None = None,
        consistency: str | None = None,
    ) -> Call[list[tuple[int, float]]]:
        r = self.top_entities_now(cohort, signal_type, k, at_ns, consistency)
        return r if isinstance(r, Call) else Answered("top_entities", r)


def _window_count(value: tuple[int, float]) -> WindowCount:
    return WindowCount(*value)
