"""The default num_workers=6 on a machine with fewer cores: ucstage says so
once, in its own words, and torch's warning (given twice) is left out
(data/loader.py ``check_worker_number_rationality``).

The machine's cores are set for real: the script pins itself to one core
(``os.sched_setaffinity``) before building the loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import json, os, sys, warnings
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from ucstage.data import DataLoader, VolumeDataset
    ds = VolumeDataset(sys.argv[1], cache_dir=sys.argv[2])
    kwargs = json.loads(sys.argv[3])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loader = DataLoader(ds, batch_size=None, log_mlflow=False,
                            multiprocessing_context="fork", **kwargs)
        for epoch in range(2):
            ds.set_epoch(epoch)
            n = sum(1 for _ in loader)
    print(json.dumps({"items": n, "warnings": [str(w.message) for w in seen]}))
""")


def _run(tmp_path: Path, **kwargs: object) -> dict:  # type: ignore[type-arg]
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for i in range(12):
        (src / f"f{i:02d}").write_text(str(i))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(src), str(tmp_path / "cache"),
                           json.dumps(kwargs)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_the_default_on_one_core_is_said_once_in_ucstage_s_words(tmp_path: Path) -> None:
    got = _run(tmp_path)
    assert got["items"] == 12  # every file, over 6 workers on one core
    about = [w for w in got["warnings"] if "CPU core" in w or "worker processes" in w]
    assert about == [
        "ucstage DataLoader: num_workers defaults to 6 (a constant, so that every rank shards "
        "alike), more than the 1 CPU core this process may use; pass num_workers=1 (the "
        "same on every rank) if the workers slow each other down"], got["warnings"]
    assert not any("This DataLoader will create" in w for w in got["warnings"])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_a_chosen_count_over_the_cores_is_said_once_and_one_that_fits_not_at_all(
        tmp_path: Path) -> None:
    over = _run(tmp_path, num_workers=2)
    assert [w for w in over["warnings"] if "CPU core" in w or "worker processes" in w] == [
        "ucstage DataLoader: num_workers=2 is more than the 1 CPU core this process may "
        "use; the workers may slow each other down"]
    fits = _run(tmp_path, num_workers=1)
    assert not [w for w in fits["warnings"] if "CPU core" in w or "worker processes" in w]
