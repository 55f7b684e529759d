"""The written docs keep up with the CLI: docs/cli.md names every option of every
command in that command's section, and the README stays a short first read whose
links resolve."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click

from tests.common.clitree import commands
from ucstage.cli import cli

ROOT = Path(__file__).resolve().parents[2]
HEADING = re.compile(r"^(#{1,6}) (.*)$", re.MULTILINE)




def _section(text: str, path: tuple[str, ...]) -> str:
    """The text under the heading that opens with `ucstage <path>`, up to the next
    heading of the same or a higher level."""
    want = " ".join(("ucstage", *path))
    headings = list(HEADING.finditer(text))
    for i, m in enumerate(headings):
        code = re.match(r"`([^`]*)`", m.group(2))
        if code and (code.group(1) == want or code.group(1).startswith(want + " ")):
            level = len(m.group(1))
            end = next((h.start() for h in headings[i + 1:] if len(h.group(1)) <= level),
                       len(text))
            return text[m.end():end]
    raise AssertionError(f"docs/cli.md has no section for `{want}`")


def test_docs_cli_documents_every_option_of_every_command() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    for path, cmd in commands(cli):
        if isinstance(cmd, click.Group) and path:
            continue  # a group's options are its subcommands'
        section = _section(text, path)
        for param in cmd.params:
            longs = [o for o in getattr(param, "opts", []) if o.startswith("--")]
            if not isinstance(param, click.Option) or not longs or longs[0] == "--help":
                continue
            # In a row of the section's option table, not only in its synopsis.
            assert re.search(rf"^\|.*`[^`|]*{re.escape(longs[0])}(?![\w-])", section,
                             re.MULTILINE), (
                f"docs/cli.md's table does not document {longs[0]} under "
                f"`ucstage {' '.join(path)}`")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(page: Path) -> Iterator[tuple[Path, str]]:
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        yield (page.parent / file).resolve() if file else page, anchor


def test_readme_is_a_short_first_read_and_its_links_resolve() -> None:
    readme = ROOT / "README.md"
    lines = readme.read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines; reference belongs in docs/"
    first_code = lines[lines.index("```bash") + 1:][:2]
    assert [line.split()[0] for line in first_code] == ["scripts/demo.sh", "scripts/test.sh"]
    assert "docs/design.md" in "\n".join(lines[:20]), "the design page is linked near the top"
    for page in (readme, ROOT / "docs" / "cli.md"):
        for target, anchor in _links(page):
            assert target.exists(), f"{page.name} links to a missing {target}"
            if anchor and target.suffix == ".md":
                slugs = {_slug(h) for _, h in HEADING.findall(target.read_text())}
                assert anchor in slugs, f"{page.name} links to a missing #{anchor} in {target.name}"
