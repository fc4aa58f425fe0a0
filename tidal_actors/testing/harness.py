"""The message-driven test harness: the real actor behaviours under a deterministic host.

Owns :class:`Harness`, the facade a test drives. It runs the behaviours on a
:class:`~tidal_actors.testing.sim_host.DeterministicHost` (seeded one-at-a-time
delivery; its fault injection in ``testing.faults``) with a
:class:`~tidal_actors.testing.schedule.Schedule` (the delivery order, the trace and
the injected write failures, shared across a reopen).
"""

from __future__ import annotations

from typing import Any, TypeVar

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.recovery import FaultReport
from tidal_actors.runtime.call import Call
from tidal_actors.runtime.engine import Core, check_meta
from tidal_actors.storage.sharded import ShardedStore, open_store
from tidal_actors.storage.stores import LmdbStore, MemoryStore, NullStore
from tidal_actors.testing._generated_harness import HarnessOperations
from tidal_actors.testing.link_faults import LinkFaultCalls, LinkFaults
from tidal_actors.testing.schedule import FACADE, HarnessStuck, Ordering, Schedule
from tidal_actors.testing.sim_host import DeterministicHost

__all__ = [
    "FACADE",
    "START_NS",
    "DeterministicHost",
    "FaultReport",
    "Harness",
    "HarnessStuck",
    "LinkFaults",
    "Schedule",
]

START_NS = 10**18
"""Where a harness's clock starts: 1e18 ns (2001-09-09), as the pytest plugin's."""


def _open_store(store: Any, config: Config) -> tuple[Any, str | None]:
    if store is None:
        return MemoryStore(), None
    if isinstance(store, str):
        if store.startswith("lmdb:"):
            path = store[len("lmdb:") :]
            return open_store(path, config), path
        if store == "memory":
            return MemoryStore(), None
        if store == "null":
            return NullStore(), None
        raise InvalidArgument("store", store, 'must be a store, "memory", "null" or "lmdb:<path>"')
    if not callable(getattr(store, "commit", None)) or not callable(getattr(store, "load", None)):
        raise InvalidArgument("store", store, "must be a store (MemoryStore, LmdbStore, NullStore)")
    if isinstance(store, (LmdbStore, ShardedStore)):
        return store, str(store.path)
    return store, None


T = TypeVar("T")


class Harness(LinkFaultCalls, HarnessOperations):
    """Drive the real actor behaviours message by message, in a seeded order.

    The operations have ``TidalDb``'s names and arguments; each validates at once
    (raising ``InvalidArgument`` as ``TidalDb`` does), sends its message, and returns
    a handle (``.done``; ``.result()`` returns the value, raises the operation's
    error, or raises ``RuntimeError`` if the reply has not arrived). Signals have no
    reply: their handle is done at once. Nothing is delivered until :meth:`step`,
    :meth:`run`, :meth:`run_until_idle` (or a close) delivers it.

    Args:
        seed: chooses the delivery order among non-empty mailboxes.
        config: settings (default ``Config()``); shard counts matter here.
        store: a ``MemoryStore`` (default), ``NullStore``, ``LmdbStore``, or the
            strings ``"memory"``, ``"null"``, ``"lmdb:<path>"``. Crashes restart
            shards from it, :meth:`close_and_reopen` restores from it.
        start_ns: where the harness's :class:`ManualClock` starts.
        ordering: ``"mailbox"`` (default: one FIFO mailbox per receiver, as in
            production) or ``"pair"`` (FIFO per sender/receiver pair only).
        link_faults: a :class:`LinkFaults` (lose, duplicate, reorder messages on
            every link or on chosen ones, seeded); None (default) for none. The link
            protocol between every sender and receiver (`runtime.links`) makes each
            message applied once and in order regardless; what is lost is re-sent
            once nothing else can be delivered. ``drop_next``, ``duplicate_next``
            and ``reorder_next`` fault chosen messages; ``link_stats`` counts.

    Example::

        h = Harness(seed=3)
        h.signal_with_context(1, 10, 0)
        leave = h.leave_community_layer(1)
        h.run(leave)
        print(h.trace())
    """

    schedule: Schedule
    host: DeterministicHost

    def __init__(
        self,
        seed: Any = 0,
        config: Config | None = None,
        store: Any = None,
        *,
        start_ns: int = START_NS,
        ordering: Ordering = "mailbox",
        link_faults: LinkFaults | None = None,
    ) -> None:
        self.config = config if config is not None else Config()
        if not isinstance(self.config, Config):
            raise InvalidArgument("config", config, "must be a Config")
        if link_faults is not None and not isinstance(link_faults, LinkFaults):
            raise InvalidArgument("link_faults", link_faults, "must be a LinkFaults or None")
        self.schedule = Schedule(seed, ordering)
        self.schedule.links.faults = link_faults
        self.clock = ManualClock(start_ns)
        self.store, self._lmdb_path = _open_store(store, self.config)
        self._calls = 0
        self._open()

    def _open(self) -> None:
        store = self.store
        prior = getattr(store, "fault", None)
        if prior is not None and getattr(prior, "__self__", None) is not self.schedule:
            self.schedule.prior_fault = prior
        if hasattr(store, "fault"):
            store.fault = self.schedule.store_fault
        restored = store.load()
        check_meta(store, self.config, restored)
        self.host = DeterministicHost(self.config, self.clock, store.durable, self.schedule, store)
        self.core = Core(self.config, self.clock, store, restored, self.host, buffered=False)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Harness(seed={self.schedule.seed!r}, steps={self.schedule.steps})"

    # -- driving ------------------------------------------------------------------------

    @property
    def seed(self) -> Any:
        return self.schedule.seed

    @property
    def steps(self) -> int:
        """Deliveries so far."""
        return self.schedule.steps

    @property
    def closed(self) -> bool:
        return self.core.closed

    def step(self) -> bool:
        """Deliver one message (the seed picks the mailbox); False if nothing is pending.

        When only crashed shards have messages waiting, the step restarts one of them.
        """
        return self.host.step()

    def run_until_idle(self, max_steps: int = 10_000_000) -> int:
        """Deliver until nothing is pending; returns the number of steps taken.

        Raises:
            HarnessStuck: still busy after ``max_steps`` (a message loop).
        """
        n = 0
        while self.host.step():
            n += 1
            if n >= max_steps:
                raise HarnessStuck(f"still delivering after {max_steps} steps")
        return n

    def run(self, call: Call[T]) -> T:
        """Deliver until ``call`` is done, then return its result (or raise its error).

        Raises:
            HarnessStuck: nothing is left to deliver and the call is not done.
        """
        while not call.done:
            if not self.host.step():
                raise HarnessStuck(
                    f"{call.name} cannot complete: nothing is left to deliver "
                    f"(after step {self.schedule.steps}; see trace())"
                )
        return call.result()

    def pending(self) -> dict[M.Address, list[str]]:
        """What waits in which mailbox: receiver address -> message descriptions, oldest first."""
        return {
            a: [self.schedule.describe(m) for m in msgs] for a, msgs in self.host.pending().items()
        }

    def pending_messages(self) -> dict[M.Address, list[object]]:
        """As :meth:`pending`, with the message objects themselves."""
        return self.host.pending()

    def trace(self) -> str:
        """Every delivery so far, one line each (``step receiver <- sender: message``),
        plus ``**`` lines for faults, clock moves and reopens. Deterministic."""
        return "".join(line + "\n" for line in self.schedule.lines)

    def trace_lines(self) -> list[str]:
        """:meth:`trace` as a list of lines."""
        return list(self.schedule.lines)

    def behaviour(self, address: M.Address) -> Behaviour:
        """The behaviour currently at ``address`` (to inspect its state in a test)."""
        return self.host.behaviours[address]

    # -- clock --------------------------------------------------------------------------

    def advance(self, delta_ns: int) -> int:
        """Move the manual clock by ``delta_ns`` (may be negative); returns the new now."""
        now = self.clock.advance(delta_ns)
        self.schedule.event(f"clock {'+' if delta_ns >= 0 else ''}{int(delta_ns)} -> {now}")
        return now

    def set_time(self, now_ns: int) -> None:
        """Set the manual clock to ``now_ns`` (may go backwards)."""
        self.clock.set(now_ns)
        self.schedule.event(f"clock = {int(now_ns)}")

    def tick(self) -> None:
        """Send the purge coordinator the ``Tick`` that the pykka facade sends every
        50 ms while a re-materialization is due (``Config.rematerialize_after_ms``
        after a purge, measured here on the harness's manual clock, so ``advance``
        makes it due). The harness has no timers: without ticks, scheduled
        re-materializations wait (a reopen resumes them); ``rematerialize`` runs one
        at once."""
        tick = getattr(M, "Tick", None)
        if tick is not None:
            self.host.tell(M.COORD_ADDR, tick())

    def close(self) -> None:
        """Close as ``TidalDb.close`` does (flush, stop kind by kind, close the store),
        delivering what that needs. Handles still waiting get ``DatabaseClosed``."""
        if not self.core.closed:
            self.core.close()
            self.schedule.event("closed")

    # -- faults -------------------------------------------------------------------------

    def fail_next_write(self, n: int = 1, *, only: str | None = None) -> None:
        """Make the next ``n`` writes that reach persistence fail with ``StorageError``.

        Args:
            n: how many writes.
            only: ``"control"`` (writes a caller waits for: assign, unassign,
                leave, rejoin, purge manifest) or ``"history"`` (contribution
                batches); None for whichever comes first.

        A failed write fails only its own caller (persistence retries the rest of its
        group one by one): a control operation raises ``StorageError`` and changes
        nothing, in memory or in storage; a failed history write is counted and the
        next ``flush`` raises ``StorageError`` (its signals stay in the live
        aggregates but are not durable, so a reopen does not have them). The trace
        marks the chosen write with ``[injected: this write fails]``.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgument("n", n, "must be an int >= 0")
        if only not in (None, "control", "history"):
            raise InvalidArgument("only", only, 'must be None, "control" or "history"')
        self.schedule.fail_next_write(n, only)
        self.schedule.event(f"fail next {n} {only or 'any'} write(s)")

    def crash_persistence(self) -> FaultReport:
        """Crash the persistence actor and restart it at once.

        The crashed incarnation loses everything it had not committed: the writes in
        its group and in its mailbox. The restarted one answers each lost write as a
        failed commit: a caller waiting for one (assign, unassign, leave, rejoin,
        purge) gets ``StorageError`` and nothing is applied; a lost history write is
        counted and the next ``flush`` raises ``StorageError`` (those signals stay
        live but are not durable). A flush whose barrier had reached the crashed
        incarnation fails with ``StorageError``. Everything already committed stays.

        Returns:
            A :class:`FaultReport` (``lost_writes``, ``failed``, ``dropped``).
        """
        return self.host.crash_persistence()

    def crash_shard(self, address: M.Address) -> FaultReport:
        """Crash a membership or ledger shard; it is restarted from storage.

        What happens to the messages in flight (the supervisor's contract):

        * A membership shard's mailbox (and the messages it had stashed behind a
          pending commit) is dropped. A dropped signal is lost (it had no
          acknowledgement; listed in ``lost_signals``). A dropped operation with a
          reply (control operation, query, flush barrier) fails with
          ``ActorFailure``.
        * A ledger shard loses nothing but its memory: it is restored by handshake
          with its links (`actors.recovery`). Every message sent to it is kept by
          its sender until durable there, and after the restart what the store
          does not show is re-sent, in order (`testing.sim_links`): its
          attributions, purge markers, retractions, reads and barriers are handled
          by the next incarnation, so ``lost_records`` is empty. A purge
          preparation waiting there for its marker dies with it: the coordinator
          fails that purge whole (nothing committed, nothing retracted).
        * A control operation whose write was already on its way to persistence is
          *in doubt*: its outcome is decided there. Its caller is answered on
          restart with that outcome (success if committed, else the error).
        * Messages sent to the shard while it is down wait. The shard restarts, from
          what the store holds, at the first step at which nothing else can be
          delivered: by then every write the crashed incarnation caused is
          committed (or failed), so the restored state holds every acknowledged
          operation and record numbering never repeats. A restarting ledger shard
          asks the coordinator for the purges in flight (`actors.recovery`); a purge
          waiting for its preparation there, or a re-materialization running there,
          fails with ``ActorFailure``. A retraction prepared by the crashed
          incarnation and handled after the restart is a no-op (the restored state
          already leaves those records out: tombstones).
        * Counters (``stats()``) carry over.

        After recovery the state equals the reference model's over every operation
        acknowledged (or in doubt and committed), without the lost signals/records.
        Lost records still count against the contribution log's capacity.

        Args:
            address: ``("membership", i)`` or ``("ledger", i)``.

        Returns:
            A :class:`FaultReport`.

        Raises:
            InvalidArgument: not such a shard, already down, or a non-durable store.
        """
        return self.host.crash(address)

    def clock_jump(self, delta_ns: int) -> int:
        """Make the clock jump by ``delta_ns`` (backwards if negative), as a fault.

        Nothing else happens: signals stamped "now" and reads "now" use the new time.
        A contribution stamped after a read's time does not count in it, and none
        weighs more than its weight. Returns the new now.
        """
        now = self.clock.advance(delta_ns)
        self.schedule.event(f"clock jump {'+' if delta_ns >= 0 else ''}{int(delta_ns)} -> {now}")
        return now

    def close_and_reopen(self) -> None:
        """Close (flush, stop, close the store) and open again from the store.

        Everything is restored from storage, as ``TidalDb.open`` restores it; the
        clock, the seed's random sequence and the trace continue.
        """
        self.close()
        if self._lmdb_path is not None:
            self.store = open_store(self._lmdb_path, self.config)
        self._open()
        self.schedule.event("reopened from storage")
