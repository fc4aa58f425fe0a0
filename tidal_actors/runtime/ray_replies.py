"""Replies across processes under the Ray host (`runtime.ray_host`).

A `Reply` is a one-shot slot with a lock: it cannot leave its process. Under the Ray
host a reply crosses as ``(sink, reply_id, label)``:

* In the facade's process a `ReplyPath` keeps the replies it sent away by id and
  runs one thread that long-polls its `ReplySink` (an async Ray actor, one per
  facade) and settles the local replies it hears about: a blocked thread wakes, or an
  event loop's callback runs, as under the pykka host. No thread waits per call.
* In an actor's process the reply arrives as a `RemoteReply` (a `Reply`, so the
  behaviours handle it unchanged): settling it settles the copy and tells the sink
  ``(reply_id, value, error)``. A reply may reach several processes (a barrier's parts
  carry copies); the first settlement wins at the facade, as with one slot.

Errors cross as their class, ``args`` and attributes (`portable`), so a `TidalError`
whose ``__init__`` takes other arguments than its message (`InvalidArgument`) arrives
as the same class with the same message. The cause chain is not carried.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable
from typing import Any

import ray

from tidal_actors._errors import DatabaseClosed, TidalError
from tidal_actors.actors.reply import Reply

__all__ = [
    "NAMESPACE",
    "RemoteReply",
    "ReplyPath",
    "ReplySink",
    "portable",
    "register_serializers",
]

NAMESPACE = "tidal_actors"
"""The Ray namespace every actor of the library is named in."""

POLL_S = 0.05  # how long one long-poll of the sink waits when nothing is settled (seconds)

_tls = threading.local()  # ``path``: the `ReplyPath` a thread's sends register into


def _rebuild_exc(cls: type[BaseException], args: tuple[Any, ...], attrs: dict[str, Any]) -> Any:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(attrs)
    return exc


class _Portable:
    """An exception wrapped to pickle as its class, ``args`` and ``__dict__``."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> tuple[Any, ...]:
        e = self.exc
        return (_rebuild_exc, (type(e), e.args, dict(getattr(e, "__dict__", {}))))


def portable(exc: BaseException | None) -> Any:
    """``exc`` in a form that unpickles to the same class and message (None as is)."""
    return None if exc is None else _Portable(exc)


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class ReplySink:
    """The settlements for one facade, taken by its `ReplyPath`'s thread (async actor:
    ``take`` waits without holding ``settle`` up)."""

    def __init__(self) -> None:
        self._items: list[tuple[str, int, Any, Any]] = []
        self._event = asyncio.Event()

    async def settle(self, items: list[tuple[str, int, Any, Any]]) -> None:
        """``items``: ``(kind, reply_id, value, error)``; kind "reply" or "fault"."""
        self._items.extend(items)
        self._event.set()

    async def take(self, timeout_s: float) -> list[tuple[str, int, Any, Any]]:
        """What was settled since the last take; waits up to ``timeout_s`` seconds for it."""
        if not self._items:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout_s)
        self._event.clear()
        items, self._items = self._items, []
        return items


_sinks: dict[str, Any] = {}  # sink name -> handle, in an actor's process


def _sink(name: str) -> Any:
    handle = _sinks.get(name)
    if handle is None:
        handle = _sinks[name] = ray.get_actor(name, namespace=NAMESPACE)
    return handle


def send_fault(sink: str, report: Any) -> Any:
    """Tell the facade behind ``sink`` of a handler failure (a `FaultReport`); the
    call's Ray reference (a caller about to end its process waits for it)."""
    return _sink(sink).settle.remote([("fault", 0, report, None)])


class RemoteReply(Reply):
    """A facade's reply in an actor's process: settling it tells the facade's sink."""

    __slots__ = ("reply_id", "sink")

    def __init__(self, sink: str, reply_id: int, label: str) -> None:
        super().__init__(label)
        self.sink = sink
        self.reply_id = reply_id

    def _settle(self, value: Any, exc: BaseException | None) -> bool:
        if not super()._settle(value, exc):
            return False
        _sink(self.sink).settle.remote([("reply", self.reply_id, value, portable(exc))])
        return True


class ReplyPath:
    """The facade's end: replies sent away, the sink, and the one thread settling them.

    Args:
        name: the sink's Ray actor name (unique per facade).
        on_fault: called with each `FaultReport` an actor sends (from the thread).
        poll: called after each take (from the thread): the host checks its room
            waiters there.
    """

    def __init__(
        self,
        name: str,
        on_fault: Callable[[Any], None],
        poll: Callable[[], None],
    ) -> None:
        self.name = name
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # on this process's node: a sink elsewhere would take the replies with its node
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.sink = ReplySink.options(  # type: ignore[attr-defined]
            name=name, namespace=NAMESPACE, scheduling_strategy=here
        ).remote()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._waiting: dict[int, Reply] = {}
        self._on_fault = on_fault
        self._poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tidal-{name}", daemon=True)
        self._thread.start()

    def register(self, reply: Reply) -> tuple[str, int, str]:
        """``reply`` kept until settled; what crosses in its place."""
        with self._lock:
            rid = next(self._ids)
            self._waiting[rid] = reply
        return (self.name, rid, reply.label)

    def local(self, rid: int) -> Reply | None:
        with self._lock:
            return self._waiting.get(rid)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                items = ray.get(self.sink.take.remote(POLL_S))
            except Exception:  # noqa: BLE001 - the sink is gone: Ray is shutting down
                if self._stop.wait(POLL_S):
                    return
                continue
            for kind, rid, value, exc in items:
                if kind == "fault":
                    with contextlib.suppress(Exception):  # a callback must not stop the path
                        self._on_fault(value)
                    continue
                with self._lock:
                    reply = self._waiting.pop(rid, None)
                if reply is not None:
                    if exc is not None:
                        reply.set_exception(exc)
                    else:
                        reply.set_result(value)
            self._poll()

    def fail_all(self, exc: BaseException) -> None:
        """Settle every reply still waiting with ``exc``."""
        with self._lock:
            pending, self._waiting = list(self._waiting.values()), {}
        for reply in pending:
            reply.set_exception(exc)

    def close(self) -> None:
        """Stop the thread and the sink; replies still waiting get `DatabaseClosed`."""
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            pending, self._waiting = list(self._waiting.values()), {}
        for reply in pending:
            reply.set_exception(
                DatabaseClosed("the database was closed before this call completed")
            )
        with contextlib.suppress(Exception):  # already gone
            ray.kill(self.sink)


class sending:
    """Context manager: Replies pickled in this thread register into ``path``."""

    def __init__(self, path: ReplyPath) -> None:
        self.path = path

    def __enter__(self) -> None:
        _tls.path = self.path

    def __exit__(self, *exc: object) -> None:
        _tls.path = None


_paths: dict[str, ReplyPath] = {}  # the facade's paths in this process, by sink name


def _serialize(reply: Reply) -> tuple[str, int, str]:
    if isinstance(reply, RemoteReply):
        return (reply.sink, reply.reply_id, reply.label)
    path: ReplyPath | None = getattr(_tls, "path", None)
    if path is None:
        raise TypeError(
            f"reply {reply.label!r} was made in a process without a reply path: under the "
            "Ray host only the facade's process makes replies"
        )
    return path.register(reply)


def _deserialize(wire: tuple[str, int, str]) -> Reply:
    sink, rid, label = wire
    path = _paths.get(sink)
    if path is not None:  # back in the facade's process: the reply itself
        local = path.local(rid)
        if local is not None:
            return local
    return RemoteReply(sink, rid, label)


def register_serializers(path: ReplyPath | None = None) -> None:
    """Make `Reply` and `RemoteReply` cross as ``(sink, reply_id, label)`` in this
    process (``path``: the facade's, whose replies come back as themselves)."""
    if path is not None:
        _paths[path.name] = path
    for cls in (Reply, RemoteReply):
        ray.util.register_serializer(cls, serializer=_serialize, deserializer=_deserialize)
    # errors travel inside messages too (``PurgePrepared.error``, a barrier part's losses)
    todo: list[type[BaseException]] = [TidalError]
    while todo:
        err_cls = todo.pop()
        todo.extend(err_cls.__subclasses__())
        ray.util.register_serializer(err_cls, serializer=_exc_wire, deserializer=_exc_back)


def _exc_wire(exc: BaseException) -> tuple[Any, ...]:
    return (type(exc), exc.args, dict(getattr(exc, "__dict__", {})))


def _exc_back(wire: tuple[Any, ...]) -> Any:
    return _rebuild_exc(*wire)


def forget(path: ReplyPath) -> None:
    _paths.pop(path.name, None)
