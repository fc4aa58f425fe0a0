"""The docs agree with the code: the storage format's tag table with `Tag`, the
configuration page with `Config`, and every relative link resolves."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
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


# ---------------------------------------------------------------- code references

LAYERS = (
    "core",
    "storage",
    "actors",
    "runtime",
    "facades",
    "eventlog",
    "loadsim",
    "cli",
    "testing",
)
POINTING = [
    ("tidal_actors/core/__init__.py (rules index)", "tidal_actors/core/__init__.py"),
    ("docs/semantics.md", "docs/semantics.md"),
    ("docs/architecture.md", "docs/architecture.md"),
]


def _package_classes() -> dict[str, list[type]]:
    """Every class defined in a package module, by name (generated modules included)."""
    classes: dict[str, list[type]] = {}
    for path in sorted((ROOT / "tidal_actors").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if isinstance(obj, type) and obj.__module__ == name:
                classes.setdefault(obj.__name__, []).append(obj)
    return classes


def _own(cls: type, attr: str) -> bool:
    """Whether the body of ``cls`` itself defines ``attr``: a class attribute or
    method, an annotated field, or an attribute its methods assign (``self.attr =``)."""
    if attr in vars(cls) or attr in vars(cls).get("__annotations__", {}):
        return True
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return False
    return any(
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and node.attr == attr
        for node in ast.walk(tree)
    )


def _member(cls: type, attr: str) -> str | None:
    """None if ``cls`` defines ``attr`` in its own body, else why not (a pointer names
    the class whose source holds the thing, not a subclass that inherits it)."""
    if _own(cls, attr):
        return None
    where = cls.__module__ + "." + cls.__qualname__
    for base in cls.__mro__[1:]:
        if _own(base, attr):
            return f"{where} inherits {attr} from {base.__module__}.{base.__qualname__}"
    return f"{where} has no {attr}"


def _resolve(ref: str, classes: dict[str, list[type]]) -> str | None:
    """None if ``ref`` names something that exists where it says, else why not.

    ``layer.module.Name.attr`` (or ``tidal_actors.``...): import the longest module
    prefix, then look the rest up; a class or function must be defined in that
    module, not imported into it (unless it is in the module's ``__all__``: a package's
    public name). ``Class.attr``: a class of that name defined in the package,
    unique, whose own body defines ``attr``."""
    parts = ref.split(".")
    if parts[0] == "tidal_actors":
        parts = parts[1:]
    if (parts and parts[0] in LAYERS) or ref.startswith("tidal_actors."):
        mods = ["tidal_actors", *parts]
        for cut in range(len(mods), 0, -1):
            name = ".".join(mods[:cut])
            try:
                obj: object = importlib.import_module(name)
            except ModuleNotFoundError:
                continue
            rest = mods[cut:]
            if rest:
                if not hasattr(obj, rest[0]):
                    return f"{name} has no {rest[0]}"
                obj = getattr(obj, rest[0])
                home = getattr(obj, "__module__", name)
                module = importlib.import_module(name)
                exported = rest[0] in getattr(module, "__all__", ())  # a package's public name
                defined = inspect.isclass(obj) or inspect.isfunction(obj)
                if defined and home != name and not exported:
                    return f"{rest[0]} is defined in {home}, only imported into {name}"
            for i, attr in enumerate(rest[1:], start=1):
                if isinstance(obj, type) and i == len(rest) - 1:
                    return _member(obj, attr)
                if not hasattr(obj, attr):
                    return f"{name}: no {'.'.join(rest)}"
                obj = getattr(obj, attr)
            return None
        return f"no module {mods[1] if len(mods) > 1 else ref}"
    owners = classes.get(parts[0], [])
    if not owners:
        return f"no class {parts[0]} in the package"
    if len(owners) > 1:
        return f"{parts[0]} is ambiguous: {sorted(c.__module__ for c in owners)}"
    obj = owners[0]
    for i, attr in enumerate(parts[1:], start=1):
        if isinstance(obj, type) and i == len(parts) - 1:
            return _member(obj, attr)
        if not hasattr(obj, attr):
            return f"{obj.__module__}.{parts[0]}: no {'.'.join(parts[1:])}"
        obj = getattr(obj, attr)
    return None


def _references(text: str) -> list[str]:
    """Single-backtick dotted references to package code: ``layer.module.Name[.attr]``,
    ``tidal_actors.X``, or ``Class.attr`` (a capitalized first part)."""
    found = []
    for ref in re.findall(r"(?<!`)`([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+)`(?!`)", text):
        first = ref.split(".")[0]
        if first in LAYERS or first == "tidal_actors" or first[0].isupper():
            found.append(ref)
    return sorted(set(found))


def test_every_code_reference_in_the_rules_index_and_the_design_docs_resolves() -> None:
    """Each dotted reference in the rules index (the docstring of ``core/__init__.py``),
    docs/semantics.md and docs/architecture.md names a module, class, function or
    attribute that exists; the failure lists every one that does not, with why."""
    classes = _package_classes()
    broken = []
    checked = 0
    for label, rel in POINTING:
        path = ROOT / rel
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".py":
            text = ast.get_docstring(ast.parse(text)) or ""
        for ref in _references(text):
            checked += 1
            why = _resolve(ref, classes)
            if why is not None:
                broken.append(f"{label}: `{ref}`: {why}")
    assert checked >= 30, f"only {checked} references found; is the pattern still right?"
    assert not broken, "references that do not resolve:\n" + "\n".join(broken)


def test_operation_signatures_in_the_docs_use_the_parameter_names() -> None:
    """A backticked ``op(a, b, c=None)`` whose arguments are all names (a signature,
    not a call with values) names the operation's parameters, in their order."""
    from tidal_actors.runtime.operations import OPERATIONS

    params = {op.name: [p.name for p in op.params] for op in OPERATIONS}
    pattern = re.compile(r"`(?:[\w.]+\.)?(\w+)\(([^`()]*)\)`")
    ident = re.compile(r"[a-z_]\w*(=None)?$")
    checked = 0
    for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for name, args in pattern.findall(path.read_text(encoding="utf-8")):
            parts = [a.strip() for a in args.split(",") if a.strip()]
            if name not in params or not parts or not all(ident.match(a) for a in parts):
                continue
            names = [a.split("=")[0] for a in parts]
            want = params[name]
            assert all(n in want for n in names), f"{path.name}: {name}({args}): params {want}"
            assert names == [n for n in want if n in names], f"{path.name}: {name}({args}) order"
            checked += 1
    assert checked >= 5  # the semantics page's reads and purge, at least


def test_the_ranges_on_the_configuration_page_are_the_codes() -> None:
    """A setting whose row says ``in (lo, hi]`` or ``in [lo, hi]`` takes ``hi`` and
    refuses just past it (and ``lo`` when the interval is open there)."""
    from tidal_actors import InvalidArgument

    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    ranges = re.findall(r"^\| `(\w+)` .*?\bin ([(\[])([\d,.]+), ([\d,.]+)\]", section, re.M)
    assert {name for name, *_ in ranges} >= {
        "signal_flush_interval_ms",
        "inflight_budget_ms",
        "rematerialize_after_ms",
    }
    for name, opening, lo_text, hi_text in ranges:
        lo, hi = float(lo_text.replace(",", "")), float(hi_text.replace(",", ""))
        assert getattr(Config(**{name: hi}), name) == hi
        for bad in [hi * 1.001] + ([lo] if opening == "(" else [lo - 1]):
            try:
                Config(**{name: bad})
            except InvalidArgument as exc:
                assert exc.field == name
            else:
                raise AssertionError(f"{name}={bad} accepted; the docs say {opening}{lo}, {hi}]")
