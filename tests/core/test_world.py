"""World: the calling process's place in its job, read from the environment in
one place with one rule; and what a Layout derives (node ranks, per-rank workers)."""

from __future__ import annotations

import pytest

from ucstage.errors import InvalidArgument
from ucstage.sharding import Layout, World


def test_a_process_without_a_group_is_rank_0_of_1_in_the_main_process(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "3")  # not read: without a process group the ranks share nothing
    monkeypatch.setenv("WORLD_SIZE", "8")
    world = World.detect()
    assert world == World(0, 1, 0, 0, None, None)
    assert not world.in_worker and world.local_ranks is None
    # The view a spawned worker's dataset carries applies only inside a worker.
    assert World.detect(carried=(2, 4)) == world


def test_local_world_size_is_parsed_by_one_rule(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert World.detect().local_ranks == 4
    assert World.detect().node_readers(3) == 12  # 4 ranks x 3 workers share the node's cache
    assert World.detect().node_readers(0) == 4  # num_workers=0: each main process reads
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "")
    assert World.detect().local_ranks is None and World.detect().node_readers(2) == 2
    for bad in ("two", "0", "-1", "1.5"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        world = World.detect()  # detecting never fails: using the value does
        for use in (lambda w: w.local_ranks, lambda w: w.node_readers(2)):
            with pytest.raises(InvalidArgument) as info:
                use(world)
            assert info.value.message == (f"$LOCAL_WORLD_SIZE must be a whole number of at "
                                          f"least 1, got {bad!r}")
            assert "nproc_per_node" in (info.value.hint or "")


def test_torchrun_run_needs_local_rank(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-1")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert World.detect().torchrun_run is None
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert World.detect().torchrun_run == "run-1"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "")
    assert World.detect().torchrun_run is None


def test_layout_derives_nodes_and_per_rank_workers() -> None:
    layout = Layout(8, 2, 4)
    assert list(layout.node_ranks(1)) == [4, 5, 6, 7]
    assert [layout.local_rank(r) for r in (0, 3, 4, 7)] == [0, 3, 0, 3]
    assert Layout(3).node_ranks(0) == range(3)  # one node: every rank
    with pytest.raises(InvalidArgument, match="node_rank must be 0 or more"):
        layout.node_ranks(-1)
    assert Layout(3, 2).workers_per_rank() == [2, 2, 2]
    assert Layout(2, [0, 3]).workers_per_rank() == [0, 3]
    assert Layout(2, [0, 1]).readers_agree and Layout(2, 5).readers_agree
    assert not Layout(2, [2, 1]).readers_agree
