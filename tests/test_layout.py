"""The package's shape: no import cycles, and heavy or CLI-only imports stay in
their layer (docs/design.md, "Layout and layering"). Modules are not capped by
line count: a module holds one concept, which review checks (issue 33)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "ucstage"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import in ``name``,
    including those under ``if TYPE_CHECKING:`` and inside functions."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    top_level = {id(n) for n in tree.body}
    for node in tree.body:  # module-level `if TYPE_CHECKING:` / `try:` blocks count as top level
        if isinstance(node, (ast.If, ast.Try)):
            top_level.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                target = sub if sub in MODULES else module
                found.append((target, node.lineno, id(node) in top_level))
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name in MODULES:
        for target, _, _ in _imports(name):
            if target not in MODULES or target == name:
                continue
            # A package __init__ re-exporting its own submodules is not a
            # dependency of theirs: importing a submodule runs the __init__
            # first, but the __init__ does not need the submodule's importer.
            if _is_package(name) and target.startswith(name + "."):
                continue
            graph[name].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


CORE = {"ucstage.errors", "ucstage.units", "ucstage.volumes", "ucstage.volumes.entry",
        "ucstage.volumes.location", "ucstage.volumes.walk", "ucstage.volumes.listing",
        "ucstage.manifest", "ucstage.manifest.model", "ucstage.manifest.columns",
        "ucstage.manifest.formats", "ucstage.manifest.files", "ucstage.manifest.groups",
        "ucstage.manifest.arrays", "ucstage.manifest.rowgroups", "ucstage.manifest.shardsamples",
        "ucstage.shardfiles", "ucstage.shardfiles.shardformat", "ucstage.shardfiles.tarindex",
        "ucstage.shardfiles.lineindex", "ucstage.shardfiles.shardindex",
        "ucstage.shardfiles.sourceindex", "ucstage.shardfiles.packindex",
        "ucstage.source", "ucstage.ports",
        "ucstage.sharding", "ucstage.sharding.order", "ucstage.sharding.rule",
        "ucstage.sharding.plan", "ucstage.sharding.forecast",
        "ucstage.sharding.resplit", "ucstage.sharding.stats", "ucstage.progress", "ucstage.atomic", "ucstage.percentile",
        "ucstage.resume", "ucstage.cloudfs", "ucstage.aside",
        "ucstage.params", "ucstage.shutdown", "ucstage.shown", "ucstage.thrift"}


ENGINES = {name for name in MODULES if name == "ucstage.engines" or name.startswith("ucstage.engines.")}
"""The engines (issue 41): every byte that moves between a source and a local
descriptor. They are part of the core (the volumes walk through them), below
the cache, the tables, the data side and the CLI, which call them."""
CORE |= ENGINES


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_the_engines_import_nothing_of_their_callers(name):
    """What the cache lends a copy (its MD5 evidence, what stops it) comes in as
    a value: the engines never import the cache, the data side, the tables or
    the CLI."""
    callers = ("ucstage.cache", "ucstage.data", "ucstage.tables", "ucstage.cli",
               "ucstage.export", "ucstage.packing")
    found = [(t, line) for t, line, _ in _imports(name) if t.startswith(callers)]
    assert found == [], f"{name} imports its callers: {found}"


def test_one_fork_hook_resets_the_engines():
    """Every process-global the engines keep is reset by the one hook of
    :mod:`ucstage.engines`, and nothing else in the package registers its own."""
    own = sorted(name for name in ENGINES if name != "ucstage.engines"
                 and "register_at_fork" in MODULES[name].read_text())
    assert own == []
    assert "register_at_fork" in MODULES["ucstage.engines"].read_text()


@pytest.mark.parametrize("name", sorted(CORE))
def test_core_imports_nothing_above_it(name):
    above = [(t, line) for t, line, _ in _imports(name)
             if t.startswith("ucstage.") and t not in CORE]
    assert above == [], f"{name} imports from above the core: {above}"


def _third_party(prefixes: tuple[str, ...]) -> dict[str, list[tuple[str, int, bool]]]:
    return {name: [(t, line, top) for t, line, top in _imports(name) if t.startswith(prefixes)]
            for name in MODULES}


TORCH_CHECKPOINT = {"ucstage.checkpoint.writer", "ucstage.checkpoint.reader",
                    "ucstage.checkpoint.index", "ucstage.checkpoint.tee",
                    "ucstage.checkpoint.upload"}
"""torch.distributed.checkpoint's storage classes, its ``.metadata`` and the
save's tee and upload (which only the writer imports):
``ucstage.checkpoint`` loads them lazily, so the ``checkpoint`` commands never
import torch (but ``verify`` of a plain torch checkpoint, which reads its
``.metadata``)."""


def test_torch_only_in_data_and_lazily_in_bench_loader():
    for name, hits in _third_party(("torch",)).items():
        if not hits or name.startswith("ucstage.data") or name in TORCH_CHECKPOINT:
            continue
        assert name == "ucstage.bench.loadermode", f"{name} imports torch: {hits}"
    # ...and nothing imports bench.loader or the checkpoint's storage at module level.
    for name in MODULES:
        eager = [line for t, line, top in _imports(name)
                 if (t == "ucstage.bench.loadermode" or t in TORCH_CHECKPOINT) and top
                 and name not in {*TORCH_CHECKPOINT, "ucstage.checkpoint"}]  # its own, lazily
        assert eager == [], f"{name} imports a torch-only module eagerly (line {eager})"


def test_click_and_rich_only_in_the_cli():
    for name, hits in _third_party(("click", "rich")).items():
        assert not hits or name.startswith("ucstage.cli"), f"{name} imports {hits}"


def test_pyspark_only_in_export_and_deltalake_in_tables():
    for name, hits in _third_party(("pyspark",)).items():
        assert not hits or name.startswith("ucstage.export"), f"{name} imports {hits}"
    for name, hits in _third_party(("deltalake",)).items():
        assert not hits or name.startswith(("ucstage.export", "ucstage.tables")), \
            f"{name} imports {hits}"
        assert all(not top for _, _, top in hits), f"{name} imports deltalake eagerly: {hits}"


TABLES = sorted(name for name in MODULES if name.startswith("ucstage.tables"))


@pytest.mark.parametrize("name", TABLES)
def test_tables_sit_on_the_core_alone(name):
    """tables/ is what data/ and export/ share: it imports only the core."""
    above = [(t, line) for t, line, _ in _imports(name)
             if t.startswith("ucstage.") and t not in CORE and not t.startswith("ucstage.tables")]
    assert above == [], f"{name} imports from above tables/: {above}"


def test_export_and_data_do_not_import_each_other():
    for name in MODULES:
        for target, line, _ in _imports(name):
            for a, b in (("ucstage.data", "ucstage.export"), ("ucstage.export", "ucstage.data")):
                assert not (name.startswith(a) and target.startswith(b)), \
                    f"{name} imports {target} (line {line}): share it through ucstage.tables"


SLOT_RULE_KEYWORDS = {"rank", "world_size", "num_workers", "worker", "shuffle", "seed", "epoch",
                      "shuffle_scope", "nproc_per_node", "equal_length"}
"""What travels together as the slot rule's values (ucstage.sharding.rule)."""
KEYWORD_ENTRY_POINTS = {
    # The public keyword forms users call; each builds the values and calls the library.
    "ucstage.data.dataset.VolumeDataset.__init__",
    "ucstage.data.table.TableDataset.__init__",
    "ucstage.data.shardset.ShardDataset.__init__",
    # click commands: their parameters are the command's flags.
    "ucstage.cli.shard_plan.shard_plan",
    "ucstage.cli.cache_warm.warm",
}


def _functions(name: str) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, definition) of every function and method of module ``name``."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{prefix}.{child.name}", child))
                visit(child, f"{prefix}.{child.name}")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}")

    visit(ast.parse(MODULES[name].read_text(), str(MODULES[name])), name)
    return found


def test_no_function_takes_the_slot_rule_as_loose_keywords():
    """Five or more of the slot rule's keywords go as values (Layout, Slot,
    ReadOrder), except in the public keyword entry points."""
    loose = []
    for name in MODULES:
        for qualified, fn in _functions(name):
            args = fn.args
            params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
            if len(params & SLOT_RULE_KEYWORDS) >= 5 and qualified not in KEYWORD_ENTRY_POINTS:
                loose.append(qualified)
    assert loose == [], f"pass Layout/Slot/ReadOrder instead of the keywords: {loose}"


def test_the_entry_points_listed_exist():
    known = {q for name in MODULES for q, _ in _functions(name)}
    assert known >= KEYWORD_ENTRY_POINTS


def _lines(name: str) -> int:
    return len(MODULES[name].read_text().splitlines())


def test_no_two_modules_share_a_name():
    """A module's file name says what it is without its package: `warm.py`
    in two packages made readers open the wrong one."""
    seen: dict[str, list[str]] = {}
    for path in ROOT.rglob("*.py"):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {n: p for n, p in seen.items() if len(p) > 1} == {}


def test_cli_modules_stay_thin():
    big = {name: _lines(name) for name in MODULES
           if name.startswith("ucstage.cli") and _lines(name) > 400}
    assert big == {}, f"move domain logic out of these CLI modules into the library: {big}"


MAX_EXPORTED = 84
"""Names the package ``__init__`` files export, all together (172 before issue 33
halved them; 81, then ``ucstage.checkpoint``'s ``Writer``, ``Reader`` and
``latest``): a
name is public when the CLI or another package imports it or the docs show it
to users; the rest is imported from its module."""


def _exported(name: str) -> list[str]:
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def test_the_packages_export_few_names():
    exported = {name: _exported(name) for name in MODULES if _is_package(name)}
    total = sum(len(names) for names in exported.values())
    assert total <= MAX_EXPORTED, \
        f"{total} exported names (at most {MAX_EXPORTED}): {exported}"

