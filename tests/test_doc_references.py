"""Every cross-reference in the docstrings and the docs points at something that
exists, so a rename or a removal that leaves a stale one fails here (issue 41,
"each rule told once").

What is checked:

- in every string statement of ``ucstage/**/*.py`` (module, class and function
  docstrings, and the docstring under an attribute) and in its comments, each
  Sphinx role ``:mod:``, ``:func:``, ``:class:``, ``:meth:``, ``:data:``,
  ``:attr:`` and ``:exc:``, each ``ucstage.<dotted.name>`` literal, and each
  file named (``data/holding.py``, ``docs/design.md``), as a literal or not;
- in ``docs/*.md`` and ``README.md``, the same roles, each backticked Python
  file (``cache/fetch.py``, relative to ``ucstage/`` or to the checkout), each
  backticked file under a top-level folder of the checkout
  (``scripts/setup.sh``), each backticked ``ucstage.<dotted.name>``, each
  ``some/where.py`` in prose and each link to a file of the checkout;
  fenced code blocks and the cells of a table's "was" column (names a thing
  had before it moved) are left out.

A role's target resolves as Sphinx's Python domain looks it up: absolute
(``ucstage.cache.local.LocalCache``), in the enclosing class, in the module
(including names imported there, also under ``TYPE_CHECKING``), or with a
leading dot in the enclosing classes, the module, or its packages
(``.readahead`` from ``ucstage.data.dataset``). ``~``, ``!``, ``title <target>``
and a trailing ``()`` are the usual role syntax. Outside code (``torch...``,
``pyarrow...``) resolves by importing it. A ``:mod:`` must name a module and
the other roles must not (``:func:`.fetch``` resolving to the module
``cache/fetch.py`` would hide a removed function).

Resolution imports the modules it looks in (in all, every ucstage module: about
2 s; pyspark is not among them) and looks names up on the live objects; an
attribute that only instances have is found through the class's annotations
(dataclass fields too), ``__slots__``, a named tuple's fields, or a
``self.<name> =`` in the class's source.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import io
import os
import re
import sys
import tokenize
import types
from functools import cache
from itertools import zip_longest
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ucstage"
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

ROLE = re.compile(r":(mod|func|class|meth|data|attr|exc):`([^`]+)`")
"""A Sphinx role; its target may wrap onto the next docstring line."""
LITERAL = re.compile(r"``([^`\n]+)``")
"""A docstring's inline literal: checked when it names a file or ``ucstage.x``."""
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
"""A single-backticked span of a Markdown page."""
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CELL = re.compile(r"(?<!\\)\|")
"""A table's cell border (``\\|`` is a pipe inside a cell)."""
LINK = re.compile(r"\]\(([^)\s]+)\)")
"""A Markdown link's target: a file or folder relative to the page, or a URL."""
PROSE_PATH = re.compile(r"(?<![\w/.:`-])((?:[a-z_][\w.-]*/)+[\w-]+\.(?:py|md|sh|txt|toml))\b")
"""``cache/fetch.py`` or ``docs/design.md`` written without backticks (a
capitalised first folder is a placeholder: ``DEST/x.py``)."""
PY_FILE = re.compile(r"(?:[\w.-]+/)*[\w-]+\.py")
ROOT_FILE = re.compile(r"(?:benchmarks|docs|scripts|tests|ucstage)/(?:[\w.-]+/)*[\w.-]+\.\w+")
DOTTED = re.compile(r"ucstage(?:\.\w+)+")
"""``ucstage.x.y``, also at the head of ``ucstage.x.f(arg)``."""
PATH_NAME = re.compile(r"((?:\w+/)+\w+)\.([A-Z]\w*)")
"""``tables/logpaths.TableFolder``: a module of ucstage/ and a name in it."""
SEARCHED = ("ucstage", "benchmarks", "scripts", "tests", "docs")
"""Where a bare ``name.py`` of a page may live."""


@dataclasses.dataclass(frozen=True)
class Ref:
    where: str
    """``path:line`` of the reference."""
    role: str
    target: str
    module: str | None
    """The dotted module the reference is written in (None for a page)."""
    classes: tuple[str, ...] = ()
    """The enclosing classes, innermost first, as absolute dotted names."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package_of(module: str) -> str:
    path = ROOT / module.replace(".", "/")
    return module if path.is_dir() else module.rpartition(".")[0]


def docstring_refs(source: str, module: str, filename: str) -> list[Ref]:
    """The roles, the literals naming a ``ucstage.`` name, and the files named,
    in every string statement and every comment of ``source``, which is ``module``."""
    lines = source.splitlines(keepends=True)
    refs: list[Ref] = []
    class_lines: list[tuple[int, int, tuple[str, ...]]] = []

    def collect(text: str, first_line: int, classes: tuple[str, ...]) -> None:
        for found in ROLE.finditer(text):
            line = first_line + text.count("\n", 0, found.start())
            refs.append(Ref(f"{filename}:{line}", found.group(1), found.group(2), module,
                            classes))
        for found in LITERAL.finditer(text):
            line = first_line + text.count("\n", 0, found.start())
            refs.extend(_literal_ref(f"{filename}:{line}", found.group(1)))
        for found in PROSE_PATH.finditer(text):
            line = first_line + text.count("\n", 0, found.start())
            refs.append(Ref(f"{filename}:{line}", "file", found.group(1), None))

    def visit(node: ast.AST, classes: tuple[str, ...], qual: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f"{qual}.{child.name}"
                class_lines.append((child.lineno, child.end_lineno or child.lineno,
                                    (name, *classes)))
                visit(child, (name, *classes), name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                # A method's docstring reads in its class; a nested function's
                # names are not reachable, so its scope stays the class's.
                visit(child, classes, f"{qual}.{child.name}")
            elif (isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant)
                  and isinstance(child.value.value, str)):
                end = child.end_lineno or child.lineno
                collect("".join(lines[child.lineno - 1:end]), child.lineno, classes)
            else:
                visit(child, classes, qual)

    visit(ast.parse(source, filename), (), module)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            line = token.start[0]
            # Classes are recorded outer first: the last that holds the line is innermost.
            inside = [c for start, end, c in class_lines if start <= line <= end]
            collect(token.string, line, inside[-1] if inside else ())
    return refs


def page_refs(text: str, filename: str) -> list[Ref]:
    """Roles, backticked files and ``ucstage.`` names, link targets and
``some/where.py`` in prose, of a Markdown page.

    Fenced code blocks are left out: they are commands and examples, and the
    tests of the examples run them."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    refs = []
    header: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{filename}:{number}"
        if line.startswith("|"):
            cells = CELL.split(line.strip().strip("|"))
            header = header or [c.strip() for c in cells]
            # A "was" column names what a thing used to be: gone by design.
            line = "|".join(c for c, h in zip_longest(cells, header, fillvalue="") if h != "was")
        else:
            header = []
        for found in ROLE.finditer(line):
            refs.append(Ref(where, found.group(1), found.group(2), None))
        line = ROLE.sub("", line)
        for found in INLINE.finditer(line):
            refs += _literal_ref(where, found.group(1))
        line = INLINE.sub("", line)
        for found in LINK.finditer(line):
            target = found.group(1).partition("#")[0]
            if target and not re.match(r"\w+:", target):  # not https:, mailto:
                linked = os.path.normpath(Path(filename).parent / target)
                refs.append(Ref(where, "link", linked, None))
        for found in PROSE_PATH.finditer(LINK.sub("", line)):
            refs.append(Ref(where, "file", found.group(1), None))
    return refs


def _literal_ref(where: str, span: str) -> list[Ref]:
    """A literal that names a file, or a ucstage object by its dotted name."""
    span = span.strip()
    if PY_FILE.fullmatch(span) or ROOT_FILE.fullmatch(span):
        return [Ref(where, "file", span, None)]
    if head := DOTTED.match(span):
        return [Ref(where, "name", head.group(0), None)]
    if path_name := PATH_NAME.fullmatch(span):
        module = "ucstage." + path_name.group(1).replace("/", ".")
        return [Ref(where, "name", f"{module}.{path_name.group(2)}", None)]
    return []


@cache
def _imported_names(module: str) -> dict[str, str]:
    """Name -> absolute dotted name, for every import at the top of ``module``
    (in ``if``/``try`` blocks too, so ``TYPE_CHECKING`` imports count)."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    if not path.is_file():
        path = path.with_suffix("") / "__init__.py"
    if not path.is_file():
        return {}
    names: dict[str, str] = {}
    package = _package_of(module)
    nodes: list[ast.stmt] = list(ast.parse(path.read_text()).body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, (ast.If, ast.Try)):
            nodes.extend(node.body + node.orelse + getattr(node, "finalbody", []))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.partition(".")[0]] = (
                    alias.name if alias.asname else alias.name.partition(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def _instance_attribute(cls: type, name: str) -> bool:
    """Whether instances of ``cls`` have ``name`` though the class does not."""
    for klass in cls.__mro__:
        if name in getattr(klass, "__annotations__", {}) or name in getattr(
                klass, "__slots__", ()) or name in getattr(klass, "_fields", ()):
            return True
        if name in _self_attributes(getattr(klass, "__module__", "")).get(
                klass.__qualname__, ()):
            return True
    return False


@cache
def _self_attributes(module: str) -> dict[str, set[str]]:
    """Class qualname -> the ``self.<name>`` its methods assign, for a ucstage
    module (one parse per module: ``inspect.getsource`` per class is slow)."""
    if not module.startswith("ucstage"):
        return {}
    found: dict[str, set[str]] = {}
    file = getattr(sys.modules.get(module), "__file__", None)
    if not file:
        return found

    def visit(node: ast.AST, qual: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f"{qual}.{child.name}" if qual else child.name
                found[name] = {n.attr for n in ast.walk(child)
                               if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                               and isinstance(n.value, ast.Name) and n.value.id == "self"}
                visit(child, name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, f"{qual}.{child.name}.<locals>" if qual else
                      f"{child.name}.<locals>")

    visit(ast.parse(Path(file).read_text()), "")
    return found


_MISSING = object()


@cache
def _import(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except (ImportError, ValueError):
        return None


@cache
def lookup(dotted: str) -> Any:
    """The object ``dotted`` names, or ``_MISSING``.

    First as Python's attribute access finds it from the top package (so
    ``ucstage.bench.plot`` is the function the package re-exports, not its
    module), then from the longest module prefix (so ``ucstage.sharding.forecast.forecast``
    is found though the package's ``forecast`` is that function)."""
    parts = dotted.split(".")
    if not all(part.isidentifier() for part in parts):
        return _MISSING
    for cut in range(1, len(parts) + 1):
        module = _import(".".join(parts[:cut])) if cut == 1 or len(parts) > cut else None
        if module is None:
            continue
        found = _walk(module, parts[:cut], parts[cut:])
        if found is not _MISSING:
            return found
    return _MISSING


def _walk(found: Any, done: list[str], rest: list[str]) -> Any:
    """The attribute ``rest`` of ``found`` (which ``done`` names), or ``_MISSING``."""
    for depth, part in enumerate(rest):
        attribute = getattr(found, part, _MISSING)
        if attribute is _MISSING and isinstance(found, types.ModuleType):
            # A submodule not imported yet, or a name imported for type checking only.
            attribute = _import(f"{found.__name__}.{part}") or _MISSING
            imported = _imported_names(found.__name__).get(part) if (
                attribute is _MISSING and found.__name__.startswith("ucstage.")) else None
            if imported and imported != ".".join([*done, *rest[:depth + 1]]):
                return lookup(".".join([imported, *rest[depth + 1:]]))
        if attribute is _MISSING and isinstance(found, type):
            return f"{found.__qualname__}.{part}" if (
                depth == len(rest) - 1 and _instance_attribute(found, part)) else _MISSING
        if attribute is _MISSING:
            return _MISSING
        found = attribute
    return found


def _target(text: str) -> str:
    """The dotted name of a role's text: ``title <target>``, ``~``, ``!`` and
    ``()`` dropped, whitespace from a wrapped line removed."""
    text = "".join(text.split())
    if titled := re.fullmatch(r".*<([^<>]+)>", text):
        text = titled.group(1)
    text = text.lstrip("!~")
    return text.removesuffix("()")


def resolve(ref: Ref) -> str | None:
    """Why ``ref`` is stale, or None when it resolves."""
    if ref.role == "link":
        return None if (ROOT / ref.target).exists() else "the link's target does not exist"
    if ref.role == "file":
        return None if _file_exists(ref.target) else "no such file"
    if ref.role == "name":
        return None if lookup(ref.target) is not _MISSING else "no such name"
    target = _target(ref.target)
    if target.startswith("."):
        target = target[1:]
        scopes = list(ref.classes)
        if ref.module:
            scopes.append(ref.module)
            package = _package_of(ref.module)
            while package:
                scopes.append(package)
                package = package.rpartition(".")[0]
    else:
        scopes = [*ref.classes, *([ref.module] if ref.module else []), "", "builtins"]
    wrong_kind = None
    for scope in scopes:
        name = f"{scope}.{target}" if scope else target
        # A :mod: is a module even where its package re-exports a function of its name.
        found = (ref.role == "mod" and _import(name)) or lookup(name)
        if found is _MISSING:
            continue
        if (ref.role == "mod") == isinstance(found, types.ModuleType):
            return None
        wrong_kind = wrong_kind or (f"{found.__name__} is a module" if ref.role != "mod"
                                    else f"{name} is not a module")
    return wrong_kind or "resolves to nothing"


@cache
def _bare_files() -> frozenset[str]:
    names = set()
    for top in SEARCHED:
        for _, _, files in os.walk(ROOT / top):
            names.update(files)
    return frozenset(names)


def _file_exists(path: str) -> bool:
    if "/" not in path:
        return path in _bare_files()
    return (PACKAGE / path).is_file() or (ROOT / path).is_file()


def all_refs() -> list[Ref]:
    refs = []
    for path in sorted(PACKAGE.rglob("*.py")):
        filename = str(path.relative_to(ROOT))
        refs += docstring_refs(path.read_text(), _module_name(path), filename)
    for page in PAGES:
        refs += page_refs(page.read_text(), str(page.relative_to(ROOT)))
    return refs


def _stale(refs: list[Ref]) -> list[str]:
    out = []
    for ref in refs:
        why = resolve(ref)
        if why:
            shown = f":{ref.role}:`{ref.target}`" if ref.role not in ("file", "name", "link") \
                else f"`{ref.target}`"
            out.append(f"{ref.where}: {' '.join(shown.split())} ({why})")
    return out


def test_every_reference_resolves() -> None:
    refs = all_refs()
    # Guards the collectors: finding nothing would pass everything.
    assert sum(r.module is not None for r in refs) > 500
    assert sum(r.role == "file" for r in refs) > 100
    stale = _stale(refs)
    if stale:
        # The list alone, one line each: a traceback would only hide it.
        pytest.fail(
            f"{len(stale)} stale references (renamed, moved or removed?). Point each at "
            "what exists now, or drop it. Roles resolve as Sphinx does (absolute, in the "
            "class, in the module, '.name' also in its packages); files relative to "
            "ucstage/ or the checkout (a bare name.py anywhere in it); links relative to "
            "their page:\n" + "\n".join(stale), pytrace=False)


SAMPLE = '''"""A module naming :mod:`.atomic`, :mod:`ucstage.errors`, :class:`Invalid`,
:exc:`~ucstage.errors.InvalidArgument`, :func:`~.errors.nowhere`, :mod:`.nomodule` and
:func:`ucstage.errors` (a module, not a function); docs/gone.md."""
from ucstage.errors import InvalidArgument as Invalid
X = 1
"""Attribute docstring: :data:`X`, :data:`Y`, :class:`pathlib.Path`, :func:`len`,
:meth:`title <Kind.run>`, :meth:`Kind.gone`."""


class Kind:
    """:meth:`run`, :meth:`.run`, :attr:`size` (instances only), :attr:`weight`,
    :func:`torch.utils.data.DataLoader`, :class:`Kind.Inner`"""

    def __init__(self) -> None:
        self.size = 1  # :meth:`run` and :func:`gone_in_comment`

    def run(self) -> None:
        """:meth:`run()` :meth:`stop` :meth:`~ucstage.errors.InvalidArgument.with_traceback`
        :meth:`Kind.run
        <Kind.run>`"""
'''


def test_the_resolver_tells_stale_from_live(tmp_path: Path, monkeypatch: Any) -> None:
    """The checks can fail: a module of ucstage/'s namespace, made for this
    test, names live and stale things in each form the docstrings use."""
    (tmp_path / "docref_sample.py").write_text(SAMPLE)
    spec = importlib.util.spec_from_file_location("ucstage.docref_sample",
                                                  tmp_path / "docref_sample.py")
    assert spec and spec.loader
    sample = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "ucstage.docref_sample", sample)
    spec.loader.exec_module(sample)
    refs = docstring_refs(SAMPLE, "ucstage.docref_sample", "docref_sample.py")
    lookup.cache_clear()
    try:
        stale = {_target(r.target): resolve(r) for r in refs if resolve(r)}
    finally:  # forget the sample module
        lookup.cache_clear()
        _import.cache_clear()
        _self_attributes.cache_clear()
    assert sorted(stale) == sorted([
        ".errors.nowhere", ".nomodule", "ucstage.errors", "Y", "Kind.gone", "weight",
        "Kind.Inner", "stop", "gone_in_comment", "docs/gone.md"]), stale
    assert stale["ucstage.errors"] == "ucstage.errors is a module"
    assert len(refs) == 26
    # A wrapped role keeps its line: ":meth:`Kind.run" starts on the 19th line.
    assert [r.where for r in refs if "\n" in r.target] == ["docref_sample.py:19"]


def test_pages_checks_can_fail() -> None:
    page = ("| a | was |\n|---|---|\n| `data/gone.py` | `scripts/gone.py` |\n"
            "See `cache/nothere.py`, `planning.py`, `scripts/setup.sh`, `scripts/none.sh`,\n"
            "`ucstage.snapshot(src)`, `ucstage.nothing`, `tables/logpaths.Gone`,\n"
            "```\n`ucstage.in_a_fence`\n```\n`s3://bucket/x.py` and :func:`ucstage.gone`.\n"
            "[ok](../README.md), [gone](examples/gone.py#top), [web](https://x.org/a.py),\n"
            "and in prose: cache/gone.py, sharding/order.py.\n")
    stale = _stale(page_refs(page, "docs/p.md"))
    assert stale == [
        "docs/p.md:3: `data/gone.py` (no such file)",
        "docs/p.md:4: `cache/nothere.py` (no such file)",
        "docs/p.md:4: `scripts/none.sh` (no such file)",
        "docs/p.md:5: `ucstage.nothing` (no such name)",
        "docs/p.md:5: `ucstage.tables.logpaths.Gone` (no such name)",
        "docs/p.md:9: :func:`ucstage.gone` (resolves to nothing)",
        "docs/p.md:10: `docs/examples/gone.py` (the link's target does not exist)",
        "docs/p.md:11: `cache/gone.py` (no such file)",
    ], stale
