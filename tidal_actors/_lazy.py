"""Public names imported from their modules when first read (PEP 562 module
``__getattr__``), for a package whose ``__init__`` lists them: `tidal_actors` and
`tidal_actors.testing`. Importing such a package loads none of its heavy modules
(numpy, LMDB, pykka, the runtime), so that ``tidal-actors --help`` and pytest's
start-up (the plugin, `testing.plugin`, imports `tidal_actors.testing`) stay quick.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, homes: Mapping[str, tuple[str, ...]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: the package's name, for the error.
        homes: module name -> the public names it defines.
        namespace: the package's ``globals()``: a name is cached there once imported.

    ``__getattr__(name)`` imports ``name`` from its module and caches it; an unknown
    name raises ``AttributeError`` (so ``from package import unknown`` raises
    ``ImportError``), as for any module.
    """
    module_of = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return __getattr__, __dir__
