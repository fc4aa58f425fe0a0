"""Set-ups shared by several test files.

For the fault-injection tests (``tests/test_shard_recovery*.py`` and others):
- `fail_next`, `fail_handler`, `fail_tell`: a fault injected at the next call of a
  method, at an actor's next message of one kind, or at the next tell of one kind;
  every later one runs as it would have.
- `slow_next_commit`: a commit held back, so that messages sent meanwhile are stashed
  behind it; `refuse_history_writes`: a store fault hook failing history writes;
  `in_thread`: a blocking call on its own thread, its outcome kept.
- `one_red_signal`, `red_score`: the small start most of those tests share (user 1
  in cohort "red" sends one signal), and the reference model's score of it.

For the tests of eviction, settling and rebuilds (``test_bounded_memory``,
``test_rematerialization``, ``test_store_adversarial``): `EVICTING`, a configuration
whose log holds 6 records, and `rounded_rows`, aggregate rows to compare across
runs. The fixture ``settle_at_once`` is in ``conftest.py``.

For the store tests: `every_read`, what a database answers about some users.

For the differential tests on the deterministic harness (``test_harness``,
``test_seed_sweep``, ``test_published_reads``, the purge tests): `HOUR_WINDOWS`,
whose shard counts and log cap each file sets with ``replace``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from tidal_actors import Config, ManualClock, StorageError
from tidal_actors.testing import ReferenceModel

from .conftest import HOUR, MIN, SEC, T0

CFG1 = Config(membership_shards=1, ledger_shards=1, rematerialize_after_ms=None)
"""One membership shard and one ledger shard: every message of a test meets one actor."""

HOUR_WINDOWS = Config(
    half_life_ns=HOUR,
    window_width_ns=10 * MIN,
    window_buckets=6,
    rematerialize_after_ms=None,
)
"""A half-life of an hour, windows of 6 buckets of 10 minutes; rebuilds only when asked
(the reference model rebuilds only when asked too)."""

EVICTING = Config(
    half_life_ns=50 * SEC,
    window_width_ns=10 * SEC,
    window_buckets=3,
    max_contribution_log_entries=6,
    rematerialize_after_ms=None,
)
"""A log of 6 records (a 7th record evicts the oldest), windows of 3 buckets of 10 s, a
half-life of 50 s; rebuilds run only when asked."""


def rounded_rows(x: Any, at: int | None) -> list[tuple[Any, ...]]:
    """``x.aggregate_rows(at)`` (a TidalDb or the reference model) with the score and
    the window weight rounded to 9 decimals, so runs whose sums differ in their
    order of addition compare equal."""
    return [(r[0], r[1], r[2], round(r[3], 9), r[4], round(r[5], 9)) for r in x.aggregate_rows(at)]


def fail_next(
    target: Any,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    times: int = 1,
    message: str | None = None,
) -> list[int]:
    """Make ``target.name`` raise RuntimeError on its next ``times`` calls only.

    ``target`` is a class (its method fails for every instance), an object or a
    module. The error's text is ``message``, or ``injected fault in TARGET.NAME``.
    Returns a list that gets one item each time the fault is raised.
    """
    real = getattr(target, name)
    label = getattr(target, "__name__", type(target).__name__)
    text = message if message is not None else f"injected fault in {label}.{name}"
    raised: list[int] = []

    def fn(*args: Any, **kwargs: Any) -> Any:
        if len(raised) < times:
            raised.append(1)
            raise RuntimeError(text)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, fn)
    return raised


def fail_tell(ctx: Any, kind: type, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make ``ctx.tell`` (a host's actor context) raise RuntimeError instead of
    sending the next message of type ``kind``; every other message, and every later
    one, is sent. Returns a list that gets one item when the fault is raised."""
    real = ctx.tell
    raised: list[int] = []

    def tell(address: Any, message: object) -> None:
        if isinstance(message, kind) and not raised:
            raised.append(1)
            raise RuntimeError(f"injected fault telling {kind.__name__}")
        real(address, message)

    monkeypatch.setattr(ctx, "tell", tell)
    return raised


def fail_handler(
    behaviour: Any, kind: type, monkeypatch: pytest.MonkeyPatch, *, times: int = 1
) -> list[int]:
    """Make ``behaviour``'s handler of ``kind`` messages (an actor of a host, or of a
    Harness) raise RuntimeError on its next ``times`` messages; later ones are handled.
    Returns a list that gets one item at each message of that kind, handled or not."""
    real = behaviour._handlers[kind]
    calls: list[int] = []

    def handler(msg: Any) -> None:
        calls.append(1)
        if len(calls) <= times:
            raise RuntimeError(f"injected fault handling {kind.__name__}")
        real(msg)

    monkeypatch.setitem(behaviour._handlers, kind, handler)
    return calls


def slow_next_commit(
    db: Any, monkeypatch: pytest.MonkeyPatch, seconds: float = 0.4
) -> threading.Event:
    """Hold back the store's first commit after the returned event is set: it sleeps
    ``seconds`` (s) before committing, so that what is sent to its shard meanwhile is
    stashed behind it. ``db``: a pykka-hosted TidalDb."""
    store = db._core.store
    real_commit = store.commit
    slow = threading.Event()

    def commit(ops: Any) -> Any:
        if slow.is_set():
            slow.clear()
            time.sleep(seconds)
        return real_commit(ops)

    monkeypatch.setattr(store, "commit", commit)
    return slow


def refuse_history_writes(ops: Any) -> None:
    """A store's ``fault`` hook (``store.fault = refuse_history_writes``): a commit
    that writes the history raises StorageError; every other commit goes through."""
    if any(keyspace == "history" for keyspace, _, _ in ops):
        raise StorageError("history write refused")


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` on a daemon thread; its result or the exception it raised is put
    at ``out["r"]`` of the returned ``(thread, out)``."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["r"] = fn()
        except Exception as exc:  # noqa: BLE001 - checked by the test
            out["r"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def one_red_signal(db: Any, t0: int) -> None:
    """User 1 joins cohort "red" and sends one signal (entity 7, type 1, weight 2.0)
    at ``t0 - SEC`` (ns); then a flush. ``db``: a TidalDb, or `Blocking` on a Harness."""
    db.assign_cohort(1, "red")
    db.signal_with_context(1, 7, 1, 2.0, t0 - SEC)
    db.flush()


def red_score(config: Config, t0: int, *later: tuple[float, int]) -> float:
    """The reference model's decay score of ("red", entity 7, type 1) at ``t0`` (ns)
    after `one_red_signal` and then user 1's ``later`` signals to that entity and
    type, each ``(weight, ts_ns)``."""
    model = ReferenceModel(config, ManualClock(t0))
    model.assign_cohort(1, "red")
    model.signal_with_context(1, 7, 1, 2.0, t0 - SEC)
    for weight, ts in later:
        model.signal_with_context(1, 7, 1, weight, ts)
    return model.read_decay_score("red", 7, 1, t0)


def every_read(db: Any, users: Iterable[int]) -> tuple[Any, list[tuple[Any, ...]]]:
    """What ``db`` (a TidalDb or the reference model) answers: its aggregate rows at
    T0 + 1 h, and each of ``users``' status, leave history, cohorts and purge
    manifests, in that order."""
    return (
        db.aggregate_rows(T0 + HOUR),
        [
            (
                db.community_layer_status(u),
                db.community_leave_history(u),
                db.cohorts_of(u),
                db.list_purge_manifests(u),
            )
            for u in users
        ],
    )


class RecordingContext:
    """A host context for a behaviour driven by hand: one membership and one ledger
    shard, a durable store, and every message told kept in order in ``sent``."""

    def __init__(self) -> None:
        self.config = Config(ledger_shards=1, membership_shards=1)
        self.clock = ManualClock(T0)
        self.durable = True
        self.sent: list[tuple[Any, object]] = []

    def tell(self, address: Any, message: object) -> None:
        self.sent.append((address, message))
