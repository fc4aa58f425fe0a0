"""Differential stateful tests: the runtime against the reference model, rule by rule.

One hypothesis ``RuleBasedStateMachine`` drives assign, unassign, signal, leave,
rejoin, purge, re-materialization, clock moves and close/reopen; after every rule the runtime must answer
every read as the :class:`ReferenceModel` does (statuses, histories, cohorts,
manifests, and every key's score and window through ``aggregate_rows``, floats to a
relative 1e-9). It runs twice:

* on the message-driven ``Harness`` under a hypothesis-drawn seed, with an extra rule
  that submits a burst of operations before delivering any of them;
* on the real pykka ``TidalDb`` over LMDB in a temporary directory.

Examples: ``TIDAL_HYPOTHESIS_PROFILE=ci`` (default: 100 on the harness, 40 on pykka, 30
rules each) or ``large`` (1,500 and 400, 60 rules each).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tidal_actors import COMMUNITY, Config, ManualClock, Signal, TidalDb, TidalError
from tidal_actors.testing import START_NS, Harness, ReferenceModel

from ._differential import Blocking, assert_matches

# examples per machine: (harness, pykka); the harness costs a few ms an example
PROFILES = {"ci": (100, 40, 30), "large": (1500, 400, 60)}
_HARNESS_N, _PYKKA_N, _STEPS = PROFILES[os.environ.get("TIDAL_HYPOTHESIS_PROFILE", "ci")]


def _settings(n: int) -> settings:
    return settings(
        max_examples=n,
        stateful_step_count=_STEPS,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


S = 1_000_000_000
MIN = 60 * S
HOUR = 60 * MIN
USERS = [1, 2, 3, 2**64 - 1]
COHORTS = ["red", "blue", "green"]
users = st.sampled_from(USERS)
cohorts = st.sampled_from(COHORTS)
purge_cohorts = st.sampled_from([*COHORTS, COMMUNITY])
entities = st.integers(0, 3)
types = st.integers(0, 1)
weights = st.sampled_from([0.0, 0.1, 1.0, 1.5, 2.0, 3.3, 1e-3])
offsets = st.one_of(st.none(), st.integers(-30 * HOUR // MIN, 60).map(lambda m: m * MIN))
advances = st.one_of(st.integers(0, 3 * HOUR), st.integers(-2 * HOUR, 0))


def make_config(cap: int, mshards: int, lshards: int) -> Config:
    return Config(
        half_life_ns=2 * HOUR,
        half_life_ns_by_type={1: 30 * MIN},
        window_width_ns=15 * MIN,
        window_buckets=8,
        max_contribution_log_entries=cap,
        membership_shards=mshards,
        ledger_shards=lshards,
        rematerialize_after_ms=None,  # only the rule below re-materializes, as in the model
    )


class Differential(RuleBasedStateMachine):
    """The rules; subclasses say which runtime they drive."""

    def __init__(self) -> None:
        super().__init__()
        self.db: Any = None
        self.model: ReferenceModel | None = None
        self.exact_ids = True

    # -- to provide ------------------------------------------------------------
    def open_runtime(self, config: Config, seed: int) -> None:
        raise NotImplementedError

    def reopen_runtime(self) -> None:
        raise NotImplementedError

    def close_runtime(self) -> None:
        raise NotImplementedError

    # -- rules -------------------------------------------------------------------
    @initialize(
        seed=st.integers(0, 2**32 - 1),
        cap=st.sampled_from([4, 9, 5_000_000]),
        mshards=st.sampled_from([1, 2]),
        lshards=st.sampled_from([1, 2, 3]),
    )
    def open(self, seed: int, cap: int, mshards: int, lshards: int) -> None:
        self.config = make_config(cap, mshards, lshards)
        self.clock = ManualClock(START_NS)
        self.open_runtime(self.config, seed)
        self.model = ReferenceModel(self.config, self.clock)

    def both(self, name: str, *args: Any) -> None:
        """Apply one operation to the model and the runtime; they must agree on the result."""
        want = getattr(self.model, name)(*args)
        got = getattr(self.db, name)(*args)
        if name == "request_community_purge":
            if self.exact_ids:
                assert got == want
            else:
                assert got[1].entries == want[1].entries and got[1].evicted == want[1].evicted
        else:
            assert got == want

    @rule(user=users, cohort=cohorts)
    def assign(self, user: int, cohort: str) -> None:
        self.both("assign_cohort", user, cohort)

    @rule(user=users, cohort=cohorts)
    def unassign(self, user: int, cohort: str) -> None:
        self.both("unassign_cohort", user, cohort)

    @rule(user=users, entity=entities, stype=types, weight=weights, offset=offsets)
    def signal(self, user: int, entity: int, stype: int, weight: float, offset: int | None) -> None:
        ts = None if offset is None else self.clock.now_ns() + offset
        self.both("signal_with_context", user, entity, stype, weight, ts)

    @rule(
        batch=st.lists(st.tuples(users, entities, types, weights, offsets), min_size=1, max_size=6)
    )
    def signal_batch(self, batch: list[tuple[int, int, int, float, int | None]]) -> None:
        now = self.clock.now_ns()
        signals = [Signal(u, e, t, w, None if o is None else now + o) for u, e, t, w, o in batch]
        self.both("signal_batch", signals)

    @rule(user=users)
    def leave(self, user: int) -> None:
        self.both("leave_community_layer", user)

    @rule(user=users)
    def rejoin(self, user: int) -> None:
        self.both("rejoin_community_layer", user)

    @rule(user=users, cohort=purge_cohorts)
    def purge(self, user: int, cohort: str) -> None:
        self.both("request_community_purge", user, cohort)

    @rule(cohort=purge_cohorts)
    def rematerialize(self, cohort: str) -> None:
        """Rebuild a cohort from its durable history without the purged records."""
        outcomes = []
        for target in (self.model, self.db):
            try:
                target.rematerialize(cohort)
                outcomes.append(None)
            except TidalError as exc:
                outcomes.append(type(exc))
        assert outcomes[0] == outcomes[1], outcomes

    @rule(delta=advances)
    def advance(self, delta: int) -> None:
        self.clock.advance(delta)

    @rule()
    def close_and_reopen(self) -> None:
        self.reopen_runtime()

    @invariant()
    def agrees_with_model(self) -> None:
        if self.model is None:
            return
        now = self.clock.now_ns()
        assert_matches(
            self.db,
            self.model,
            USERS,
            ats=(None, now - HOUR, now + 6 * HOUR),
            exact_ids=self.exact_ids,
        )

    def teardown(self) -> None:
        if self.db is not None:
            self.close_runtime()


class HarnessDifferential(Differential):
    """On the message-driven harness, under a drawn seed; bursts run concurrently."""

    def open_runtime(self, config: Config, seed: int) -> None:
        self.h = Harness(seed=seed, config=config, start_ns=START_NS)
        self.clock = self.h.clock
        self.db = Blocking(self.h)

    def reopen_runtime(self) -> None:
        self.h.close_and_reopen()

    def close_runtime(self) -> None:
        self.h.close()

    @precondition(lambda self: self.model is not None)
    @rule(
        ops=st.lists(
            st.one_of(
                st.tuples(st.just("signal_with_context"), users, entities, types, weights),
                st.tuples(st.just("leave_community_layer"), users),
                st.tuples(st.just("rejoin_community_layer"), users),
                st.tuples(st.just("request_community_purge"), users, purge_cohorts),
                st.tuples(st.just("assign_cohort"), users, cohorts),
                st.tuples(st.just("advance"), st.integers(0, 10 * MIN)),
            ),
            min_size=2,
            max_size=12,
        )
    )
    def burst(self, ops: list[tuple[Any, ...]]) -> None:
        """Submit every operation before delivering any; the model applies them in
        submission order (each user's operations keep their order at its shard)."""
        self.submit_concurrently(ops)

    @precondition(lambda self: self.model is not None)
    @rule(
        user=users,
        ops=st.lists(
            st.one_of(
                st.tuples(st.just("signal_with_context"), entities, types, weights),
                st.tuples(st.just("leave_community_layer")),
                st.tuples(st.just("rejoin_community_layer")),
                st.tuples(st.just("request_community_purge"), purge_cohorts),
                st.tuples(st.just("assign_cohort"), cohorts),
                st.tuples(st.just("unassign_cohort"), cohorts),
            ),
            min_size=2,
            max_size=10,
        ),
    )
    def burst_one_user(self, user: int, ops: list[tuple[Any, ...]]) -> None:
        """One user's operations, all in flight at once: they race each other's
        messages to the ledgers, the coordinator and persistence."""
        self.submit_concurrently([(name, user, *args) for name, *args in ops])

    def submit_concurrently(self, ops: list[tuple[Any, ...]]) -> None:
        handles = []
        purges = 0
        for name, *args in ops:
            if name == "advance":
                self.h.advance(args[0])
                continue
            want = getattr(self.model, name)(*args)
            handles.append((name, getattr(self.h, name)(*args), want))
            purges += name == "request_community_purge"
        if purges > 1 and self.config.membership_shards > 1:
            self.exact_ids = False  # purge ids follow arrival order at the coordinator
        self.h.run_until_idle()
        for name, handle, want in handles:
            assert handle.done, f"{name} not done after run_until_idle:\n{self.h.trace()[-3000:]}"
            got = handle.result()
            if name == "request_community_purge":
                assert got[1].entries == want[1].entries and got[1].evicted == want[1].evicted
            else:
                assert got == want


class PykkaDifferential(Differential):
    """On the real pykka TidalDb over LMDB (a temporary directory, for reopen)."""

    def open_runtime(self, config: Config, seed: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="tidal-stateful-")
        self.db = TidalDb.open(self.dir, config=config, clock=self.clock)

    def reopen_runtime(self) -> None:
        self.db.close()
        self.db = TidalDb.open(self.dir, config=self.config, clock=self.clock)

    def close_runtime(self) -> None:
        try:
            self.db.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


TestHarnessDifferential = HarnessDifferential.TestCase
TestHarnessDifferential.settings = _settings(_HARNESS_N)
TestPykkaDifferential = PykkaDifferential.TestCase
TestPykkaDifferential.settings = _settings(_PYKKA_N)
