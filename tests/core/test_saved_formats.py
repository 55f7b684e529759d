"""Files written at c3a3ebf (before the slot rule became values) still load.

``saved/`` holds a loader state from ``DataLoader.state_dict()`` (shuffle,
node scope, equal_length="pad", one rank x 2 workers, 3 batches delivered),
the manifest it was made over in both formats, and what c3a3ebf's re-split
computed from that state (``expected-c3a3ebf.json``). They were written by
the code of that commit and must never be regenerated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ucstage import manifest as mf
from ucstage.resume import LoaderState, load_state
from ucstage.sharding import Layout, resume_slots

SAVED = Path(__file__).parent / "saved"
EXPECTED = json.loads((SAVED / "expected-c3a3ebf.json").read_text())


def test_a_saved_loader_state_loads_and_writes_back_the_same() -> None:
    """A version-1 state (files, nothing partial) writes back as version 2 with
    every field the same, plus ``unit`` and an empty ``partial``."""
    text = (SAVED / "loader-state-c3a3ebf.json").read_text()
    state = load_state(SAVED / "loader-state-c3a3ebf.json")
    saved = json.loads(text)
    assert saved["version"] == 1
    assert state.to_dict() == {**saved, "version": 2, "unit": "file", "partial": []}
    again = LoaderState.from_dict(state.to_dict())
    assert json.dumps(again.to_dict(), indent=1) == json.dumps(state.to_dict(), indent=1)
    assert state.order.shuffle_scope == "node" and state.order.equal_length == "pad"
    assert state.last.layout == Layout(1, 2)


@pytest.mark.parametrize("shape", ["1x2", "3x1"])
def test_a_saved_loader_state_resumes_as_it_did(shape: str) -> None:
    state = load_state(SAVED / "loader-state-c3a3ebf.json")
    w, k = (int(v) for v in shape.split("x"))
    chain, rest = resume_slots(state.order, state.segments, Layout(w, k))
    assert len(chain) == EXPECTED[shape]["segments"]
    assert [r.tolist() for r in rest] == EXPECTED[shape]["rest"]  # type: ignore[union-attr]


def test_a_saved_state_without_a_scope_reads_as_global() -> None:
    """States saved before the node scope existed were global (deliberately kept)."""
    doc = json.loads((SAVED / "loader-state-c3a3ebf.json").read_text())
    del doc["shuffle_scope"]
    assert LoaderState.from_dict(doc).order.shuffle_scope == "global"


@pytest.mark.parametrize("name", ["manifest-c3a3ebf.json", "manifest-c3a3ebf.manifest.arrow"])
def test_a_saved_manifest_loads(name: str) -> None:
    m = mf.load(SAVED / name)  # verifies the fingerprint
    assert m.fingerprint == EXPECTED["fingerprint"]
    assert [[e.path, e.size] for e in m.entries] == EXPECTED["entries"]
    assert m.paths() == [p for p, _ in EXPECTED["entries"]]


def test_the_resume_plan_of_a_saved_state() -> None:
    """``ucstage.resume.resume_plan``: what ``shard-plan --resume`` prints, per slot."""
    from ucstage.resume import resume_plan

    state = load_state(SAVED / "loader-state-c3a3ebf.json")
    sizes = [size for _, size in EXPECTED["entries"]]
    rest = resume_plan(state, Layout(3, 1), fingerprint=EXPECTED["fingerprint"], sizes=sizes)
    assert not rest.continued
    assert [s.files.tolist() for s in rest.slots] == EXPECTED["3x1"]["rest"]
    assert [s.bytes for s in rest.slots] == [sum(sizes[i] for i in r)
                                             for r in EXPECTED["3x1"]["rest"]]
    assert rest.remaining_files == sum(len(r) for r in EXPECTED["3x1"]["rest"])
    totals = rest.rank_totals(batch_size=2)
    assert [t["batches"] for t in totals] == [-(-len(r) // 2) for r in EXPECTED["3x1"]["rest"]]
    assert resume_plan(state, Layout(1, 2), fingerprint=EXPECTED["fingerprint"],
                       sizes=sizes).continued
