"""The docs agree with the code: the storage format's tag table with `Tag`, the
configuration page with `Config`, and every relative link resolves."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from tidal_actors import Config
from tidal_actors.storage.format import Keyspace, Tag

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _tag_rows() -> list[list[str]]:
    text = (DOCS / "storage-format.md").read_text(encoding="utf-8")
    section = text.split("\n## The tag table\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in rows]


def test_every_row_of_the_tag_table_is_a_tag_of_the_code() -> None:
    rows = _tag_rows()
    assert rows, "no tag table found in docs/storage-format.md"
    keyspaces = {k.value for k in Keyspace}
    for name, value, keyspace, *_ in rows:
        member = Tag[name.strip("`")]
        assert int(value, 16) == member.value, (
            f"{name}: the docs say {value}, the code 0x{member.value:02X}"
        )
        assert keyspace in keyspaces, f"{name}: unknown keyspace {keyspace}"


def test_every_tag_of_the_code_is_in_the_table_once() -> None:
    names = [row[0].strip("`") for row in _tag_rows()]
    assert sorted(names) == sorted(t.name for t in Tag)


def test_every_config_field_is_on_the_configuration_page_with_its_default() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = {
        cells[0].strip("`"): cells
        for line in section.splitlines()
        if line.startswith("| `")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    fields = {f.name: f for f in dataclasses.fields(Config)}
    assert sorted(rows) == sorted(fields)
    default = Config()
    for name, cells in rows.items():
        shown = cells[-2]  # the default column, as Python would print it
        value = getattr(default, name)
        assert re.sub(r"[_`]", "", shown.split(" ")[0]) == repr(value).replace("_", ""), (
            f"{name}: the docs say {shown}, Config() has {value!r}"
        )


def test_every_relative_link_in_the_readme_and_the_docs_resolves() -> None:
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    assert len(pages) > 5
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_the_python_examples_in_the_docs_run(tmp_path, monkeypatch) -> None:
    """Each ```python block runs on its own; its argument-less ``test_*`` functions
    pass (those taking fixtures are pytest code, only compiled and defined here)."""
    monkeypatch.chdir(tmp_path)
    ran = 0
    for page in sorted(DOCS.glob("*.md")):
        for code in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            ns: dict[str, object] = {"__name__": f"docs_{page.stem}"}
            exec(compile(code, str(page), "exec"), ns)
            for name, fn in ns.items():
                fn_code = getattr(fn, "__code__", None)
                if name.startswith("test_") and fn_code is not None and fn_code.co_argcount == 0:
                    fn()  # type: ignore[operator]  # an object with __code__ is a function
            ran += 1
    assert ran >= 4
