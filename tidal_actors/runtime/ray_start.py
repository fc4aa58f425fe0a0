"""Connecting this process to Ray (`ensure_ray`), for `runtime.ray_host`."""

from __future__ import annotations

import queue
import threading

import ray

from tidal_actors._errors import InvalidArgument
from tidal_actors.runtime.ray_replies import NAMESPACE

__all__ = ["ensure_ray"]

_INIT_LOCK = threading.Lock()


def ensure_ray(address: str | None) -> None:
    """Connect to Ray (``address``: None starts a local instance) unless connected.

    Called from a thread other than the main one (an async facade opens in a worker
    thread), ``ray.init`` runs in a thread that lives as long as the process
    (``tidal-ray-keeper``): Ray starts a local instance's processes with
    ``PR_SET_PDEATHSIG``, which kills them when the *thread* that started them ends
    (prctl(2)), so an instance started from a worker thread would die with it.

    Raises:
        InvalidArgument: Ray cannot be reached at ``address`` (naming ``ray_address``).
    """
    with _INIT_LOCK:
        if ray.is_initialized():
            return
        if threading.current_thread() is threading.main_thread():
            _init_ray(address)
            return
        outcome: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()

        def keep() -> None:
            try:
                _init_ray(address)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome.put(exc)
                return
            outcome.put(None)
            threading.Event().wait()  # parked for the life of the process

        threading.Thread(target=keep, name="tidal-ray-keeper", daemon=True).start()
        exc = outcome.get()
        if exc is not None:
            raise exc


def _init_ray(address: str | None) -> None:
    try:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise InvalidArgument(
            "ray_address", address, f"cannot connect to Ray: {type(exc).__name__}: {exc}"
        ) from exc
