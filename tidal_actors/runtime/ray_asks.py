"""The blocking Ray calls a restarting actor makes into the others (`ray_restart`,
`ray_membership_restart`, `ray_coordinator_restart`): each survives the other actor
restarting at the same time (`ray_restoring`). Ray fails a call to an actor while
it restarts (`RayActorError`, with ``max_task_retries=0``): `call` submits it again,
`fence` fences again, `ask` asks the next incarnation again."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError

from tidal_actors._errors import ActorFailure
from tidal_actors.actors import messages as M

__all__ = ["ASK_POLL_S", "ASK_WAIT_S", "RESTART_POLL_S", "ask", "call", "fence"]

ASK_POLL_S = 0.01  # how often a restarting ledger looks for an answer (seconds)
ASK_WAIT_S = 120.0  # how long it waits for one (seconds)
RESTART_POLL_S = 0.2  # how often it calls again an actor that is restarting (seconds)


def call(submit: Callable[[], Any]) -> Any:
    """``ray.get(submit())``, submitted again while the actor called restarts (Ray
    fails its calls meanwhile with `RayActorError`: it may be restarting at the
    same time as the caller), for ``ASK_WAIT_S`` at most.

    Raises:
        RayActorError: still failing after ``ASK_WAIT_S``; the call's error as it is.
    """
    deadline = time.monotonic() + ASK_WAIT_S
    while True:
        try:
            return ray.get(submit())
        except RayActorError:
            if time.monotonic() > deadline:
                raise
            time.sleep(RESTART_POLL_S)


def ask(handle: Any, make: Callable[[Any], object], label: str) -> Any:
    """Put ``make(reply)`` into the mailbox of the actor behind ``handle`` (a
    `ShardActor`) and poll for the reply's value (no Ray call waits there, so the
    actor keeps taking the calls its answer depends on). An actor restoring holds
    the question until its behaviour is up (`ray_restoring`); one that restarts
    meanwhile (its calls fail, then it does not know the question) is asked again.

    Raises:
        ActorFailure: no answer within ``ASK_WAIT_S``; the reply's error as it is.
    """
    deadline = time.monotonic() + ASK_WAIT_S
    rid = None
    while time.monotonic() < deadline:
        try:
            if rid is None:
                rid = ray.get(handle.ask.remote(make, label))
            got = ray.get(handle.answer.remote(rid))
        except RayActorError:  # restarting: asked again once it is back
            time.sleep(RESTART_POLL_S)
            continue
        if got is None:  # an incarnation that was not asked: it restarted
            rid = None
            continue
        done, value, error = got
        if done:
            if error is not None:
                raise error
            return value
        time.sleep(ASK_POLL_S)
    raise ActorFailure(f"no answer to {label} within {ASK_WAIT_S} s")


def fence(actor: Any, addresses: list[M.Address], name: str) -> None:
    """Have each actor of ``addresses`` discard from now on the calls of ``name``'s
    incarnations before ``actor``'s (`ShardActor.fence`)."""
    refs = {a: actor.links.handle(a).fence.remote(name, actor.epoch) for a in addresses}
    for a, ref in refs.items():
        try:
            ray.get(ref)
        except RayActorError:  # restarting: fenced once it is back
            call(functools.partial(actor.links.handle(a).fence.remote, name, actor.epoch))
