"""Every example in the README runs, and the README's test command is what CI runs.

The examples of "Testing your code with tidal_actors" and "Message-by-message tests
with the harness" are run by tests/test_aio.py and tests/test_harness.py."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    return README.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_using_the_library_example_prints_what_its_comments_say(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = re.search(r"```python\n(.*?)```", _section("Using the library"), re.S).group(1)  # type: ignore[union-attr]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[:4] == ["2.0", "WindowCount(count=1, weight=2.0)", "1 0.0", "[(7, 2.0)]"]
    assert lines[4].startswith("[LeaveEpoch(left_at_ns=1700000000000000000, rejoined_at_ns=")
    assert (tmp_path / "data" / "tidal").is_dir()


def test_async_example_runs_under_trio_and_under_asyncio(tmp_path, monkeypatch):
    code = re.search(
        r"```python\n(.*?)```", _section("Async facades (trio and asyncio)"), re.S
    ).group(1)  # type: ignore[union-attr]
    trio_line = next(line for line in code.splitlines() if line.startswith("trio.run(main)"))
    asyncio_code = code.replace(trio_line, "import asyncio\nasyncio.run(main())")
    for loop, source in (("trio", code), ("asyncio", asyncio_code)):
        (tmp_path / loop).mkdir()
        monkeypatch.chdir(tmp_path / loop)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(source, "README.md", "exec"), {})
        [(entity, score)] = ast.literal_eval(out.getvalue())  # the system clock: decayed a little
        assert entity == 7 and 0.999 < score <= 1.0, loop


TESTED = {
    "Using the library",
    "Async facades (trio and asyncio)",
    "Testing your code with tidal_actors",
    "Message-by-message tests with the harness",
}


def test_every_python_example_is_in_a_section_a_test_runs():
    sections = re.split(r"\n## ", README)[1:]
    with_code = {s.split("\n", 1)[0] for s in sections if "```python" in s}
    assert with_code == TESTED
    for title in TESTED:
        assert _section(title).count("```python") == 1, title


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```\n(python3 -m venv .*?)\n```", _section("Set-up"))
    assert len(commands) == 2
    test_command = commands[1].split("&& ")[-1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci
    assert "tidal-actors simulate" in commands[0]
