"""docs/design.md keeps what it promises: every package of ucstage/ has its
section and its place in the layer diagram, every file the page names exists,
and a fetch, a dataset iteration and a shard plan each read in at most three
modules that hold the entry points the page names.

Why a test: the page is how a newcomer finds which package owns what, and
issue 20 found it naming files that had become packages. It describes
packages and concepts, not every file (issue 33): a module is named where it
is the place to look for a concept. Paths are relative to ucstage/, or to the
checkout's root (``benchmarks/...``, ``tests/...``). Reads text only: fast, no
imports.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
PACKAGE = ROOT / "ucstage"

PY_PATH = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.py)`")
"""A backticked ``xyz.py`` or ``some/where/xyz.py``."""
LAYOUT_SECTION = "Layout and layering"
READING_SECTION = "How to read a fetch, a dataset iteration, a shard plan"
BENCHMARK_SECTION = "Benchmarks"
READS = ("a fetch", "a dataset iteration", "a shard plan")
"""The paths issue 33 asks to be readable in at most three modules each."""


def _section(title: str) -> str:
    """The text of the section headed ``## N. <title>``, up to the next ``## ``."""
    found = re.search(rf"^## \d+\. {re.escape(title)}\n.*?(?=^## |\Z)", DESIGN.read_text(),
                      re.MULTILINE | re.DOTALL)
    assert found, f"docs/design.md has no section '## N. {title}'"
    return found.group(0)


def _rows(section: str) -> list[list[str]]:
    """The cells of every table row of ``section``, header and rule rows left out."""
    rows = []
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("path", "to read") or set(cells[0]) <= set("-: "):
            continue
        rows.append(cells)
    return rows


def _packages() -> list[str]:
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def test_there_are_packages_to_check() -> None:
    # Guards the globbing: no packages found would pass everything below.
    assert {"cache", "data", "sharding", "volumes"} <= set(_packages())


def test_every_package_has_a_section() -> None:
    headings = re.findall(r"^## \d+\. (.*)$", DESIGN.read_text(), re.MULTILINE)
    missing = [p for p in _packages() if not any(f"`{p}/`" in h for h in headings)]
    assert not missing, (
        "docs/design.md has no section for these packages (a '## N. ...' heading naming "
        "`PACKAGE/`: what it owns, its key types, the rules it keeps): " + ", ".join(missing))
    assert any("top level" in h for h in headings), "no section for the top-level core modules"
    assert any("`planning.py`" in h for h in headings), "no section for planning.py"


def test_the_layer_diagram_places_every_package() -> None:
    diagram = re.search(r"```\n(.*?)```", _section(LAYOUT_SECTION), re.DOTALL)
    assert diagram, "section 1 has no layer diagram"
    missing = [p for p in _packages() if f"{p}/" not in diagram.group(1)]
    assert not missing, f"the layer diagram of docs/design.md does not place: {missing}"


def test_each_path_reads_in_at_most_three_modules() -> None:
    rows = {cells[0]: cells for cells in _rows(_section(READING_SECTION))}
    assert sorted(rows) == sorted(READS)
    for what in READS:
        opened = PY_PATH.findall(rows[what][1])
        assert 1 <= len(opened) <= 3, f"{what}: open {opened} (at most three modules)"
        missing = [m for m in opened if not (PACKAGE / m).is_file()]
        assert not missing, f"{what}: no such modules under ucstage/: {missing}"
        # Each module opened is named with its entry point: it must define it.
        for module, name in re.findall(r"`([\w/]+\.py)` \(`([\w.]+)`", rows[what][1]):
            defined = re.search(rf"^\s*(?:def|class) {re.escape(name.rsplit('.', 1)[-1])}\b",
                                (PACKAGE / module).read_text(), re.MULTILINE)
            assert defined, f"{what}: {module} does not define {name}"
        assert rows[what][2], f"{what}: say what the modules opened call"


def test_the_benchmarks_table_names_files_of_benchmarks() -> None:
    named = [path for cells in _rows(_section(BENCHMARK_SECTION))
             for cell in cells for path in PY_PATH.findall(cell)]
    assert named, "docs/design.md's Benchmarks section has no table of benchmarks/ modules"
    stale = sorted({p for p in named if not (p.startswith("benchmarks/") and (ROOT / p).is_file())})
    assert not stale, f"docs/design.md's Benchmarks table names missing files: {stale}"


def test_every_python_file_the_page_names_exists() -> None:
    # Prose too: "the rule lives in sharding.py" outlived sharding.py once.
    named = set(PY_PATH.findall(DESIGN.read_text()))
    assert len(named) > 30  # guards the regex
    stale = sorted(path for path in named
                   if not ((PACKAGE / path).is_file() or (ROOT / path).is_file()))
    assert not stale, ("docs/design.md names files that exist neither under ucstage/ nor "
                       "at the checkout's root (moved, renamed or removed?): " + ", ".join(stale))
