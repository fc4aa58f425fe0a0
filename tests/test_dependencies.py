"""`import tidal_actors` loads no command-line-only library, and the package's own
metadata pins no build tool into a user's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI_ONLY = ("click", "tqdm", "hdrhistogram", "hdrh")  # hdrhistogram's module is `hdrh`


def _loaded_after(statement: str) -> list[str]:
    code = (
        f"{statement}; import json, sys; "
        f"print(json.dumps(sorted(m for m in {CLI_ONLY!r} if m in sys.modules)))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


def test_import_tidal_actors_loads_no_cli_library():
    assert _loaded_after("import tidal_actors") == []


def test_testing_plugin_and_simulation_load_no_cli_library():
    assert _loaded_after("import tidal_actors.testing.plugin, tidal_actors.testing") == []


def test_the_cli_still_loads_them():
    # click with the command line; tqdm with its first progress bar, not for `--help`
    assert _loaded_after("import tidal_actors.cli") == ["click"]
    drawn = "from tidal_actors.cli.progress import bar; bar(None, 's', True, 'x').close()"
    assert _loaded_after(drawn) == ["click", "tqdm"]


def test_no_runtime_dependency_on_build_tools():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = [d.split(";")[0].strip().lower() for d in meta["project"]["dependencies"]]
    names = {
        d.split("<")[0].split(">")[0].split("=")[0].split("!")[0].split("~")[0].strip()
        for d in deps
    }
    assert not names & {"setuptools", "wheel", "pip", "pbr"}
    # the CLI's libraries stay installed by a plain `pip install`
    assert {"click", "tqdm", "hdrhistogram"} <= names
    assert meta["build-system"]["requires"] == ["setuptools>=68"]  # an isolated build env only


def test_the_test_extra_installs_what_the_plot_tests_need():
    """`.ci/run` installs `.[test]`: without the plot extra's packages in it, the plot
    tests would always skip there."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(extras["plot"]) <= set(extras["test"])
