"""The package's layers: every import (lazy ones included) points down, and no module
imports itself back through others.

Layers, lowest first (``tidal_actors/<layer>/``; the top-level private modules
``_errors``, ``_types``, ``_clock``, ``_config``, ``_config_names``, ``_durations``,
``_text`` are the
vocabulary every layer shares)::

    vocabulary < core < storage < actors < runtime < facades < eventlog < loadsim < cli
                                                                                   testing

A module may import from its own layer and from any layer below it; ``cli`` and
``testing`` sit side by side at the top. ``testing`` never imports ``cli``; ``cli``
may import ``testing``, for one reason: ``simulate`` checks the runtime against the
reference model, and passes it to ``loadsim`` (which imports no oracle). The
package's ``__init__`` (the public names) may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "tidal_actors"
ORDER = ["vocabulary", "core", "storage", "actors", "runtime", "facades", "eventlog", "loadsim"]
TOP = {"cli", "testing"}
TOP_ALLOWED = {("cli", "testing")}  # simulate injects the reference model into loadsim


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
        return b not in TOP or (a, b) in TOP_ALLOWED
    if b in TOP or b == "tidal_actors":
        return False
    return ORDER.index(b) < ORDER.index(a)


def test_imports_point_down() -> None:
    upward = {(m, d) for m, deps in _graph().items() for d in deps if not _allowed(m, d)}
    assert not upward, sorted(upward)


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
    assert not cycles, sorted(cycles)
