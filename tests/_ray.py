"""What the Ray host's tests share: the skip mark and the settings (the session's
Ray instance is the ``ray_session`` fixture of conftest.py)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from tidal_actors import Config

from .conftest import SEC

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(
    not HAS_RAY, reason="Ray is not installed: pip install -e '.[ray]' (the ray extra)"
)


def ray_config(**changes: Any) -> Config:
    base = Config(
        half_life_ns=30 * SEC,
        window_width_ns=10 * SEC,
        window_buckets=4,
        rematerialize_after_ms=None,
        host="ray",
    )
    return base.replace(**changes)
