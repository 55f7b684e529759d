"""VolumeDataset's shuffle scope and nproc_per_node: the one rule, from LOCAL_WORLD_SIZE
or given, refused when the world size is not a multiple of it."""

from __future__ import annotations

import os

import pytest

from ucstage.data import VolumeDataset
from ucstage.errors import InvalidArgument
from ucstage.sharding import Layout, ReadOrder, Slot, slot_array


def _files(root, n):  # type: ignore[no-untyped-def]
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        with open(os.path.join(root, f"f{i:04d}.bin"), "wb") as fh:
            fh.write(b"x" * (i + 1))


def rows(ds: VolumeDataset, rank: int, world: int) -> list[str]:
    return [e.path for w in range(2)
            for e in ds.slot_entries(rank=rank, world_size=world, num_workers=2, worker=w)]


def rule(n: int, rank: int, world: int, shuffle_scope: str = "node",
         nproc_per_node: int | None = None) -> list[str]:
    order = ReadOrder(n, shuffle=True, seed=3, epoch=1, shuffle_scope=shuffle_scope)
    return [f"f{i:04d}.bin" for w in range(2)
            for i in slot_array(order, Layout(world, 2, nproc_per_node), Slot(rank, w))]


def test_nproc_per_node_comes_from_local_world_size(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _files(tmp_path / "vol", 50)
    ds = VolumeDataset(str(tmp_path / "vol"), cache_dir=str(tmp_path / "cache"), shuffle=True,
                       seed=3)
    ds.set_epoch(1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert rows(ds, 3, 4) == rule(50, 3, 4, shuffle_scope="global")  # one node
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun: 2 ranks per node, 2 nodes
    assert ds.ranks_per_node(4) == 2
    assert rows(ds, 3, 4) == rule(50, 3, 4, nproc_per_node=2)
    assert rows(ds, 3, 4) != rule(50, 3, 4, shuffle_scope="global")
    # The node keeps its files over epochs, and len() follows the node's block.
    node1 = sorted(rows(ds, 2, 4) + rows(ds, 3, 4))
    ds.set_epoch(2)
    assert sorted(rows(ds, 2, 4) + rows(ds, 3, 4)) == node1 and len(node1) == 25
    # An explicit value wins over the environment; global ignores nodes.
    explicit = VolumeDataset(str(tmp_path / "vol"), cache_dir=str(tmp_path / "cache"),
                             shuffle=True, seed=3, nproc_per_node=1)
    explicit.set_epoch(1)
    assert rows(explicit, 3, 4) == rule(50, 3, 4, nproc_per_node=1)
    flat = VolumeDataset(str(tmp_path / "vol"), cache_dir=str(tmp_path / "cache"),
                         shuffle=True, seed=3, shuffle_scope="global")
    flat.set_epoch(1)
    assert rows(flat, 3, 4) == rule(50, 3, 4, shuffle_scope="global")


def test_bad_layouts_are_refused(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _files(tmp_path / "vol", 10)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    ds = VolumeDataset(str(tmp_path / "vol"), cache_dir=str(tmp_path / "cache"), shuffle=True)
    with pytest.raises(InvalidArgument, match="world_size 4 is not a multiple of nproc_per_node 3"):
        ds.slot_entries(rank=0, world_size=4, num_workers=2, worker=0)
    with pytest.raises(InvalidArgument, match="shuffle_scope must be one of"):
        VolumeDataset(str(tmp_path / "vol"), shuffle_scope="rack")
    with pytest.raises(InvalidArgument, match="nproc_per_node must be"):
        VolumeDataset(str(tmp_path / "vol"), nproc_per_node=0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(InvalidArgument, match="LOCAL_WORLD_SIZE"):
        ds.ranks_per_node(4)


def test_a_bad_local_world_size_is_one_error_wherever_it_is_read(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The dataset's ranks per node, the node's readers of the loader's window
    check and the loader's guard all read $LOCAL_WORLD_SIZE through World."""
    from ucstage.data import slotread
    from ucstage.data.loader import _GuardInfo
    from ucstage.sharding import World

    _files(tmp_path / "vol", 4)
    ds = VolumeDataset(str(tmp_path / "vol"), cache_dir=str(tmp_path / "cache"))
    ds.freeze()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")
    expected = "$LOCAL_WORLD_SIZE must be a whole number of at least 1, got '0'"
    for read in (lambda: ds.ranks_per_node(4), lambda: ds.layout(4, 2),
                 lambda: slotread.check_loader_window(ds, ds.cache(), 2),
                 lambda: World.detect().local_ranks):
        with pytest.raises(InvalidArgument) as info:
            read()
        assert info.value.message == expected
    # The guard records it so the ranks still compare, then every rank raises.
    assert _GuardInfo.of(2, ds, True, 4).nproc_per_node == f"invalid ({expected})"
    assert ds.ranks_per_node(1) is None  # one rank is one node: the variable is not read
