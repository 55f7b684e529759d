"""Which pytest-xdist worker runs which tests (scripts/test.sh: ``-n 3 --dist loadgroup``).

Most tests wait (for a mount, a server, a subprocess) rather than compute, so
they run on any worker. Tests of a heavy real part are grouped onto one
worker, where they run one after another:

* ``spark``: the session's embedded Spark Connect server is one JVM per
  worker that asks for it, and these tests start more (a user's export
  process, a script-started server). Two workers doing so would run two
  JVMs on 2 cores.
* ``torchrun``: each test starts 3 to 8 processes that import torch. Two at
  once would starve each other past their rendezvous and audit timeouts.

A test joins a group by its marker (``@pytest.mark.spark``) or by asking for
one of the group's fixtures. Without xdist (``-n0``, ``-p no:xdist``) the
marks change nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

GROUPS = {"spark": {"spark_session", "big_table", "warehouse_root"}, "torchrun": set()}
"""Group name (also the marker's) -> the fixtures that put a test in it."""


def group_of(item: pytest.Item) -> str | None:
    """The group ``item`` belongs to, if any."""
    fixtures = set(getattr(item, "fixturenames", ()))
    for group, wanted in GROUPS.items():
        if item.get_closest_marker(group) or wanted & fixtures:
            return group
    return None


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """Mark each grouped test ``xdist_group`` before pytest-xdist reads the
    marks; after it, check that the test's id carries the ``@group`` suffix
    that ``--dist loadgroup`` schedules by."""
    for item in items:
        group = group_of(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    yield
    if getattr(config.option, "loadgroup", False):  # set on xdist's workers
        for item in items:
            _check_grouped(item)


def _check_grouped(item: pytest.Item) -> None:
    """pytest-xdist 3.8 writes the suffix into ``item._nodeid``, which pytest
    9.2's structured node ids no longer read (pytest-xdist issue #1386), so
    there the groups silently spread over every worker and two JVMs start on
    2 cores. scripts/constraints.txt pins pytest 9.1 for that reason; this
    check stops a run whose pytest and xdist disagree again."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return
    suffix = "@" + str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    if not item.nodeid.endswith(suffix):
        raise pytest.UsageError(
            f"pytest-xdist did not put {item.nodeid} in its group {suffix[1:]}: this pytest "
            "and pytest-xdist disagree on node ids (pin the versions in scripts/constraints.txt)")
