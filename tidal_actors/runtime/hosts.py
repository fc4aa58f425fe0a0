"""Which host a database runs on: `host_factory` reads ``Config.host``.

``"pykka"`` (the default): `runtime.pykka_host.PykkaHost`, threads in this process.
``"ray"``: `runtime.ray_host.RayHost`, one Ray actor per behaviour; Ray is an
optional dependency (the ``ray`` extra), imported only here and only then.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument
from tidal_actors.runtime.host import Host

__all__ = ["host_factory"]


def host_factory(config: Config) -> Callable[[Config, Clock, bool], Host]:
    """The host class for ``config.host`` (called as ``(config, clock, durable)``).

    With ``host="ray"`` it connects to Ray first (``config.ray_address``), so a
    database whose cluster cannot be reached is refused before its store is opened.

    Raises:
        InvalidArgument: ``host="ray"`` and Ray is not installed (naming the extra
            to install), or cannot be reached at ``ray_address``.
    """
    if config.host == "ray":
        if importlib.util.find_spec("ray") is None:
            raise InvalidArgument(
                "host",
                config.host,
                "needs Ray, which is not installed: pip install -e '.[ray]' in the "
                "project's checkout (the ray extra)",
            )
        from tidal_actors.runtime.ray_host import RayHost, ensure_ray

        ensure_ray(config.ray_address)
        return RayHost
    from tidal_actors.runtime.pykka_host import PykkaHost

    return PykkaHost
