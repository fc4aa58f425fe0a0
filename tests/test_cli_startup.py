"""The command line's start-up: ``--help`` (of the group, of each command, of each
``inspect`` subcommand) and ``--version`` load neither the runtime nor its heavy
dependencies (numpy, LMDB, pykka, msgpack, tqdm); a command imports them when it
runs. So does ``import tidal_actors``, and the pytest plugin (loaded by every pytest
run where tidal_actors is installed). And the lazy public surfaces of
``tidal_actors`` and ``tidal_actors.testing``: every name of ``__all__`` is
importable and is the object of the module it lives in.

Each check runs in a fresh interpreter (a subprocess), where ``sys.modules`` holds
only what that command imported.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tidal_actors
from tidal_actors.cli import commands as cli_module

ROOT = Path(__file__).resolve().parents[1]

HEAVY = (
    "numpy",
    "lmdb",
    "pykka",
    "msgpack",
    "tqdm",
    "tidal_actors.runtime",
    "tidal_actors.facades",
    "tidal_actors.storage",
    "tidal_actors.actors",
    "tidal_actors.core",
    "tidal_actors.loadsim.simulate",
    "tidal_actors.eventlog.log",
)
"""Modules (and packages: any submodule counts) that ``--help`` must not import."""

# Runs `python -m tidal_actors ARGS...` in this interpreter, then prints (on stderr,
# after the command's own output) the HEAVY modules it imported, as JSON.
_WRAPPER = """
import json, runpy, sys
heavy = json.loads(sys.argv[1])
sys.argv = ["tidal-actors", *sys.argv[2:]]
try:
    runpy.run_module("tidal_actors", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
else:
    code = 0
loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
sys.stderr.write("\\nLOADED " + json.dumps(loaded) + "\\n")
sys.exit(code)
"""


def _run(*args: str) -> tuple[int, str, list[str]]:
    """``tidal-actors ARGS`` in a fresh interpreter: exit status, standard output, and
    the HEAVY modules it imported."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _WRAPPER, json.dumps(HEAVY), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )
    marker = proc.stderr.rfind("LOADED ")
    assert marker >= 0, proc.stderr
    return proc.returncode, proc.stdout, json.loads(proc.stderr[marker + len("LOADED ") :])


def test_the_group_help_loads_no_runtime_and_lists_every_command() -> None:
    code, out, loaded = _run("--help")
    assert code == 0, out
    assert loaded == []
    listed = dict(
        line.split(None, 1) for line in out.split("Commands:", 1)[1].splitlines() if line.strip()
    )
    assert sorted(listed) == ["inspect", "replay", "simulate"]
    for name, shown in listed.items():  # each with the start of its own docstring
        help_text = " ".join((cli_module.cli.commands[name].help or "").split())
        assert len(shown) > 20 and help_text.startswith(shown.removesuffix("...")), shown


@pytest.mark.parametrize(
    "args",
    [
        ("replay", "--help"),
        ("simulate", "--help"),
        ("inspect", "--help"),
        ("inspect", "user", "--help"),
        ("inspect", "top", "--help"),
        ("inspect", "purge", "--help"),
        ("--version",),
    ],
)
def test_a_command_help_loads_no_runtime(args: tuple[str, ...]) -> None:
    code, out, loaded = _run(*args)
    assert code == 0, out
    assert loaded == []
    if args == ("--version",):
        assert out == f"tidal-actors, version {tidal_actors.__version__}\n"
    else:  # the help of that very command: its usage line names it
        assert out.startswith(f"Usage: tidal-actors {' '.join(args[:-1])} [OPTIONS]"), out


def test_a_command_that_runs_loads_the_runtime(tmp_path: Path) -> None:
    """The other side: the imports moved into the commands still happen when they run."""
    log = tmp_path / "events.csv"
    log.write_text(
        "ts_ns,op,user_id,cohort,entity_id,signal_type,weight\n"
        "1000,assign,1,a,,,\n1000,signal,1,,7,1,2.0\n",
        encoding="utf-8",
    )
    code, out, loaded = _run("replay", str(log), "--quiet")
    assert code == 0, out
    assert out.startswith(f"replayed 2 rows of {log} in ")
    for module in ("numpy", "lmdb", "pykka", "tidal_actors.facades.blocking"):
        assert module in loaded


@pytest.mark.parametrize(
    "module", ["tidal_actors", "tidal_actors.testing", "tidal_actors.testing.plugin"]
)
def test_import_loads_no_runtime(module: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    code = (
        f"import json, sys, {module}; "
        f"heavy = {HEAVY!r}; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if any(m == h or m.startswith(h + '.') for h in heavy))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


@pytest.mark.parametrize("package", ["tidal_actors", "tidal_actors.testing"])
def test_every_public_name_is_its_module_object(package: str) -> None:
    """``from PACKAGE import X`` for each name of ``__all__`` gives the object of the
    module that defines it; the modules the lazy loader takes the names from are
    those of the ``TYPE_CHECKING`` imports type checkers read (the two lists, read
    from the source, agree, so a name added to one and not the other fails here)."""
    pkg = importlib.import_module(package)
    assert pkg.__file__ is not None
    source = Path(pkg.__file__).read_text(encoding="utf-8")
    guarded = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    typed = {
        alias.name: node.module
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert sorted(typed) == sorted(pkg.__all__)
    for name, module in typed.items():
        namespace: dict[str, object] = {}
        exec(f"from {package} import {name}", namespace)
        assert namespace[name] is getattr(importlib.import_module(str(module)), name), name
        assert name in dir(pkg)
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'Nope'"):
        _ = pkg.Nope
    with pytest.raises(ImportError):
        exec(f"from {package} import NoSuchName", {})


def test_the_lazy_names_are_the_real_ones() -> None:
    """A few by hand: the value and the defining module of names of both packages."""
    from tidal_actors.testing import Harness, ReferenceModel

    assert tidal_actors.COMMUNITY == "@community"
    assert tidal_actors.TidalDb.__module__ == "tidal_actors.facades.blocking"
    assert Harness.__module__ == "tidal_actors.testing.harness"
    assert ReferenceModel.__module__ == "tidal_actors.testing.reference"
    with pytest.raises(AttributeError, match="no attribute 'TidalDB'"):
        _ = tidal_actors.TidalDB  # type: ignore[attr-defined]
