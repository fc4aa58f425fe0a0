"""The package's layers: every import (lazy ones included) points down, and no module
imports itself back through others.

Layers, lowest first (``tidal_actors/<layer>/``; the top-level private modules
``_errors``, ``_types``, ``_clock``, ``_config``, ``_durations`` are the vocabulary
every layer shares)::

    vocabulary < core < storage < actors < runtime < facades < eventlog < loadsim < cli
                                                                                   testing

A module may import from its own layer and from any layer below it; ``cli`` and
``testing`` sit side by side at the top and do not import each other. The package's
``__init__`` (the public names) may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "tidal_actors"
ORDER = ["vocabulary", "core", "storage", "actors", "runtime", "facades", "eventlog", "loadsim"]
TOP = {"cli", "testing"}

# Import cycles not yet broken, each as its sorted members; the list only shrinks.
KNOWN_CYCLES: set[tuple[str, ...]] = {
    (
        "tidal_actors.core.remat",
        "tidal_actors.storage.history",
        "tidal_actors.storage.lmdb_env",
        "tidal_actors.storage.stores",
    ),
    ("tidal_actors.cli.commands", "tidal_actors.cli.inspect"),
    (
        "tidal_actors.facades.aio",
        "tidal_actors.facades.aio_asyncio",
        "tidal_actors.facades.aio_trio",
    ),
    ("tidal_actors.facades.blocking", "tidal_actors.facades.readonly"),
}

# Cross-layer imports the restructure has not yet turned around. Each entry is
# (importer, imported); the list only shrinks.
KNOWN_UPWARD: set[tuple[str, str]] = {
    ("tidal_actors.core.remat", "tidal_actors.storage.format"),
    ("tidal_actors.core.remat", "tidal_actors.storage.stores"),
    ("tidal_actors.loadsim.plot", "tidal_actors.cli.text"),
    ("tidal_actors.loadsim.simulate", "tidal_actors.testing.reference"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        name = ".".join(("tidal_actors", *path.relative_to(PKG).with_suffix("").parts))
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every package module `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; the package imports absolutely")
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found |= {n for n in names if n in modules}
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 2 and not (PKG / parts[1]).is_dir():
        return "vocabulary"
    return parts[1]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(p, modules) - {m} for m, p in modules.items()}


def _allowed(importer: str, imported: str) -> bool:
    if importer in ("tidal_actors", "tidal_actors.__main__"):
        return True
    a, b = _layer(importer), _layer(imported)
    if a == b:
        return True
    if a in TOP:
        return b not in TOP
    if b in TOP or b == "tidal_actors":
        return False
    return ORDER.index(b) < ORDER.index(a)


def test_imports_point_down() -> None:
    upward = {(m, d) for m, deps in _graph().items() for d in deps if not _allowed(m, d)}
    assert upward <= KNOWN_UPWARD, sorted(upward - KNOWN_UPWARD)
    assert upward == KNOWN_UPWARD, f"fixed, drop from KNOWN_UPWARD: {sorted(KNOWN_UPWARD - upward)}"


def test_no_import_cycles() -> None:
    graph = _graph()
    graph.pop("tidal_actors", None)
    # a package's __init__ re-exporting its own modules is not a cycle through them
    graph = {
        m: {d for d in deps if d != "tidal_actors" and not d.startswith(m + ".")}
        for m, deps in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: set[tuple[str, ...]] = set()

    def strongconnect(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if d not in index:
                strongconnect(d)
                low[m] = min(low[m], low[d])
            elif d in stack:
                low[m] = min(low[m], index[d])
        if low[m] == index[m]:
            component = []
            while True:
                d = stack.pop()
                component.append(d)
                if d == m:
                    break
            if len(component) > 1:
                cycles.add(tuple(sorted(component)))

    for m in sorted(graph):
        if m not in index:
            strongconnect(m)
    assert cycles <= KNOWN_CYCLES, sorted(cycles - KNOWN_CYCLES)
    assert cycles == KNOWN_CYCLES, (
        f"broken, drop from KNOWN_CYCLES: {sorted(KNOWN_CYCLES - cycles)}"
    )
