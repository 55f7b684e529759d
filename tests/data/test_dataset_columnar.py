"""VolumeDataset's frozen listing is a mapped columnar manifest; workers check its header."""

from __future__ import annotations

import os
import pickle

import pytest
import torch.utils.data as tud

from ucstage import manifest as mf
from ucstage.data import VolumeDataset
from ucstage.errors import ManifestError
from ucstage.sharding import Layout, ReadOrder, Slot, slot_array


def _files(root, n):
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        with open(os.path.join(root, f"f{i:04d}.bin"), "wb") as fh:
            fh.write(b"x" * (i + 1))


def test_frozen_listing_is_columnar_and_mapped(tmp_path):
    _files(tmp_path / "vol", 30)
    ds = VolumeDataset(str(tmp_path / "vol"), cache_dir=str(tmp_path / "cache"), shuffle=True)
    m = ds.freeze()
    assert ds._manifest_path.endswith(".manifest.arrow")
    with open(ds._manifest_path, "rb") as fh:
        assert fh.read(6) == b"ARROW1"
    assert isinstance(m.entries, mf.ArrowEntries)
    # The slot's rows are the slot rule's, made on demand.
    want = [m.entries[i] for i in slot_array(ReadOrder(30, shuffle=True), Layout(1, 3), Slot(0, 1))]
    assert ds.slot_entries(rank=0, world_size=1, num_workers=3, worker=1) == want


def test_worker_refuses_a_manifest_replaced_after_freezing(tmp_path):
    _files(tmp_path / "vol", 10)
    ds = VolumeDataset(str(tmp_path / "vol"), cache_dir=str(tmp_path / "cache"), read_ahead=0)
    ds.freeze()
    path = ds._manifest_path
    # Another listing written over the frozen file: the header check catches it.
    _files(tmp_path / "vol", 11)
    mf.save(mf.snapshot(str(tmp_path / "vol")), path)
    loader = tud.DataLoader(pickle.loads(pickle.dumps(ds)), num_workers=1, batch_size=None)
    with pytest.raises(ManifestError, match="expected"):
        list(loader)


def test_another_node_refuses_a_source_changed_since_freezing(tmp_path):
    """Unpickled where the frozen file is not (another node), the dataset lists
    its source again and refuses a different listing, naming both fingerprints."""
    _files(tmp_path / "vol", 10)
    ds = VolumeDataset(str(tmp_path / "vol"), cache_dir=str(tmp_path / "cache"), read_ahead=0)
    frozen = ds.freeze().fingerprint
    shipped = pickle.dumps(ds)
    os.remove(ds._manifest_path)  # the other node has no copy of rank 0's file
    _files(tmp_path / "vol", 11)
    again = mf.snapshot(str(tmp_path / "vol")).fingerprint
    with pytest.raises(ManifestError) as info:
        list(pickle.loads(shipped))
    assert info.value.message == (
        f"the listing of {tmp_path / 'vol'} changed since it was frozen "
        f"(fingerprint {again[:12]}, expected {frozen[:12]})")


def test_workers_read_every_file_once(tmp_path):
    _files(tmp_path / "vol", 25)
    ds = VolumeDataset(str(tmp_path / "vol"), cache_dir=str(tmp_path / "cache"), shuffle=True)
    ds.freeze()
    got = [os.path.basename(p) for p in tud.DataLoader(ds, num_workers=2, batch_size=None)]
    assert sorted(got) == [f"f{i:04d}.bin" for i in range(25)]



def _record_loads(worker_id):
    """worker_init_fn: log, from inside the worker, every manifest load and
    every full fingerprint pass (a spawned worker imports ucstage afresh)."""
    log = os.environ["UCSTAGE_TEST_LOAD_LOG"]
    real_load, real_hash = mf.load, mf.columns.arrow_fingerprint

    def load(*args, **kwargs):
        with open(log, "a") as fh:
            fh.write(f"load verify={kwargs.get('verify', True)}\n")
        return real_load(*args, **kwargs)

    def hashing(batches):
        with open(log, "a") as fh:
            fh.write("full fingerprint\n")
        return real_hash(batches)

    mf.load, mf.columns.arrow_fingerprint = load, hashing


def test_workers_check_the_header_only(tmp_path, monkeypatch):
    """Hashing the whole manifest happens once, in the main process: a worker
    that loads the frozen listing checks its header (size, fingerprint, rows)."""
    _files(tmp_path / "vol", 40)
    log = tmp_path / "loads"
    monkeypatch.setenv("UCSTAGE_TEST_LOAD_LOG", str(log))
    ds = VolumeDataset(str(tmp_path / "vol"), cache_dir=str(tmp_path / "cache"), read_ahead=0)
    ds.freeze()
    # Spawned workers unpickle the dataset and load the frozen file themselves.
    loader = tud.DataLoader(ds, num_workers=2, batch_size=None, multiprocessing_context="spawn",
                            worker_init_fn=_record_loads)
    got = sorted(os.path.basename(p) for p in loader)
    assert got == [f"f{i:04d}.bin" for i in range(40)]
    assert log.read_text().splitlines() == ["load verify=False"] * 2
