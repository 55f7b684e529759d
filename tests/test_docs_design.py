"""docs/design.md's module map stays the tree's: every module under ucstage/
has exactly one row, and every file the page names exists.

Why a test: the map is how a newcomer finds which file owns what, and issue 20
found it naming files that had become packages. Paths in section 1's tables
are relative to ucstage/; paths elsewhere on the page may also be relative to
the checkout's root (``benchmarks/...``). Reads text only: fast, no imports.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
PACKAGE = ROOT / "ucstage"

PY_PATH = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.py)`")
"""A backticked ``xyz.py`` or ``some/where/xyz.py``."""
MODULE_SECTION = "Layout and layering"
BENCHMARK_SECTION = "Benchmarks"


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
        if cells[0] == "path" or set(cells[0]) <= set("-: "):
            continue
        rows.append(cells)
    return rows


def _modules() -> list[str]:
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def test_the_module_table_has_rows() -> None:
    # Guards the parsing: a table the regexes stopped seeing would pass everything below.
    assert len(_rows(_section(MODULE_SECTION))) > 50


def test_every_module_under_ucstage_has_one_row() -> None:
    owners: dict[str, int] = {}
    for cells in _rows(_section(MODULE_SECTION)):
        for path in PY_PATH.findall(cells[0]):
            owners[path] = owners.get(path, 0) + 1
    missing = [m for m in _modules() if m not in owners]
    assert not missing, (
        "docs/design.md's module table (section 1, 'Which file is whose') has no row for:\n"
        + "\n".join(f"  ucstage/{m}: add | `{m}` | what it owns | to the "
                     f"{m.rpartition('/')[0] + '/' if '/' in m else 'top-level'} group"
                     for m in missing))
    twice = sorted(p for p, n in owners.items() if n > 1)
    assert not twice, f"modules with more than one row in docs/design.md's module table: {twice}"


def test_every_path_the_module_table_names_exists() -> None:
    stale = sorted({path for cells in _rows(_section(MODULE_SECTION))
                    for cell in cells for path in PY_PATH.findall(cell)
                    if not (PACKAGE / path).is_file()})
    assert not stale, (
        "docs/design.md's module table names files that do not exist under ucstage/ "
        "(moved, renamed or removed: update or drop their rows): " + ", ".join(stale))


def test_the_benchmarks_table_names_files_of_benchmarks() -> None:
    named = [path for cells in _rows(_section(BENCHMARK_SECTION))
             for cell in cells for path in PY_PATH.findall(cell)]
    assert named, "docs/design.md's Benchmarks section has no table of benchmarks/ modules"
    stale = sorted({p for p in named if not (p.startswith("benchmarks/") and (ROOT / p).is_file())})
    assert not stale, f"docs/design.md's Benchmarks table names missing files: {stale}"


def test_every_python_file_the_page_names_exists() -> None:
    # Prose too: "the rule lives in sharding.py" outlived sharding.py once.
    stale = sorted({path for path in PY_PATH.findall(DESIGN.read_text())
                    if not ((PACKAGE / path).is_file() or (ROOT / path).is_file())})
    assert not stale, ("docs/design.md names files that exist neither under ucstage/ nor "
                       "at the checkout's root: " + ", ".join(stale))
