"""The exactly-once audit in one process: equal_length's planned re-reads and
skips are expected, anything beyond them is counted and warned about, and a
resumed epoch counts the files delivered before the restart."""

from __future__ import annotations

import logging

import pytest

from tests.common.resume import Decode, RankedDataset, run_rank
from ucstage import merge_states
from ucstage.data import DataLoader, VolumeDataset
from ucstage.data.audit import EpochAudit
from ucstage.data.state import start_epoch


def write(root, n: int) -> str:  # type: ignore[no-untyped-def]
    root.mkdir()
    for i in range(n):
        path = root / f"f{i:02d}.txt"
        path.write_text(f"f{i:02d}.txt")
    return str(root)


@pytest.mark.parametrize(("mode", "dups", "gaps"), [(None, 0, 0), ("pad", 1, 0), ("drop", 0, 1)])
def test_equal_length_is_expected(tmp_path, mode, dups, gaps) -> None:  # type: ignore[no-untyped-def]
    source = write(tmp_path / "vol", 5)  # 5 files over 2 slots
    paths = VolumeDataset(source, equal_length=mode or False)
    loader = DataLoader(Decode(paths), batch_size=2, num_workers=2)
    items = [x for batch in loader for x in batch]
    (audit,) = loader.audits
    assert (audit.duplicates, audit.gaps) == (dups, gaps)
    assert (audit.expected_duplicates, audit.expected_gaps) == (dups, gaps)
    assert audit.coverage_ok and audit.files == len(set(items)) == 5 - gaps


def test_duplicates_and_gaps_beyond_it_are_warned_about(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    source = write(tmp_path / "vol", 6)
    paths = VolumeDataset(source)
    loader = DataLoader(Decode(paths), batch_size=2, num_workers=0)
    paths.freeze()
    audit = EpochAudit(start_epoch(loader, paths))
    audit.add([0, 1, 2, 2, 2])  # file 2 three times; 3, 4 and 5 never
    with caplog.at_level(logging.WARNING, logger="ucstage"):
        result = audit.finish(True)
    assert result is not None and not result.coverage_ok
    assert (result.files, result.duplicates, result.gaps) == (3, 2, 3)
    assert "2 duplicate deliveries and 3 files never delivered" in caplog.text
    with caplog.at_level(logging.WARNING, logger="ucstage"):
        assert EpochAudit(start_epoch(loader, paths)).finish(False) is None
    assert "left the epoch early" in caplog.text


def test_a_resumed_epoch_counts_what_was_delivered_before(tmp_path) -> None:  # type: ignore[no-untyped-def]
    source = write(tmp_path / "vol", 41)
    states = [run_rank(source, rank=r, world=2, workers=2, state=None, stop_after=3,
                       shuffle=True)[1] for r in range(2)]
    paths = RankedDataset(source, shuffle=True)
    loader = DataLoader(Decode(paths), batch_size=4, num_workers=1)
    loader.load_state_dict(merge_states(states))
    assert len([x for batch in loader for x in batch]) == 41 - 24
    (audit,) = loader.audits
    assert audit.coverage_ok and audit.files == 41 and audit.resumed_files == 24


def test_audit_metrics_go_to_the_loader_prefix() -> None:
    from ucstage.data.audit import AuditResult, log_result

    class Sink:
        def __init__(self) -> None:
            self.added: list[tuple[str, float, int]] = []

        def add(self, name: str, value: float, step: int) -> None:
            self.added.append((name, value, step))

        def send(self) -> None:
            pass

    sink = Sink()
    log_result(sink, AuditResult(epoch=0, files=10, duplicates=0, gaps=0, expected_duplicates=0,
                                 expected_gaps=0, resumed_files=4), 3)
    assert sink.added == [("epoch_files", 10, 3), ("epoch_coverage_ok", 1, 3),
                          ("epoch_duplicates", 0, 3), ("epoch_gaps", 0, 3),
                          ("resumed_files", 4, 3)]


def test_audit_groups_are_let_go_at_exit_while_the_interpreter_is_whole() -> None:
    """The exit handler drops every hooks' audit group, also of a loader kept
    alive only by a reference cycle, so the group is freed before teardown
    (freed during teardown, gloo's threads could abort a finished rank)."""
    import gc
    import weakref

    from ucstage.data import loader as hooks

    class Group:  # stands in for the gloo group object; only its lifetime matters
        pass

    class Loader:
        pass

    loader, group = Loader(), Group()
    h = hooks.LoaderHooks(loader, None, audit=True, audit_timeout=5.0, find=lambda d: None)
    loader.hooks = h  # the cycle a real loader has (its hooks point back at it)
    h._group = group
    hooks._HOLDING_GROUPS.add(h)
    gone = weakref.ref(group)
    del group, h
    gc.disable()
    try:
        assert gone() is not None
        hooks._release_groups()
        assert gone() is None
    finally:
        gc.enable()
