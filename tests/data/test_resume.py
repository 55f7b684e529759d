"""Mid-epoch resume in one process, ranks given explicitly: 203 files on the
FUSE volume, 2 ranks x 2 workers, batch size 4, interrupted after k batches and
resumed on other layouts. Across both runs every file is delivered once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.common.resume import make_named_volume, run_rank
from ucstage import merge_states
from ucstage.errors import InvalidArgument, ResumeMismatch

pytestmark = [pytest.mark.fuse]

N = 203
LAYOUTS = [(2, 2), (3, 1), (1, 0), (2, 3)]


@pytest.fixture(scope="module")
def volume(fuse_volume):  # type: ignore[no-untyped-def]
    return make_named_volume(fuse_volume, N)


def first_run(source: str, k: int, **options) -> tuple[list[str], list[dict]]:  # type: ignore[no-untyped-def]
    items, states = [], []
    for rank in range(2):
        got, state, batches = run_rank(source, rank=rank, world=2, workers=2, state=None,
                                       stop_after=k, **options)
        assert batches == k
        items += got
        states.append(state)
    return items, states


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("k", [4, 5])  # a multiple of num_workers, and not one
def test_resume_on_every_layout_delivers_each_file_once(volume, shuffle, k) -> None:  # type: ignore[no-untyped-def]
    source, names = volume
    before, states = first_run(source, k, shuffle=shuffle, seed=7)
    assert len(before) == 2 * k * 4  # prefetched batches are not counted as delivered
    merged = merge_states(states)
    assert sum(merged["segments"][0]["delivered"]) == len(before)
    for world, workers in LAYOUTS:
        after = []
        for rank in range(world):
            got, _, _ = run_rank(source, rank=rank, world=world, workers=workers,
                                     state=merged, shuffle=shuffle, seed=7)
            after += got
        assert Counter(before + after) == Counter(names), (world, workers)


def test_same_layout_continues_each_slot_from_its_own_rank_state(volume) -> None:  # type: ignore[no-untyped-def]
    source, names = volume
    before, states = first_run(source, 5, shuffle=True)
    after = []
    for rank in range(2):  # no merge: each rank loads the state it saved
        got, _, _ = run_rank(source, rank=rank, world=2, workers=2, state=states[rank],
                             shuffle=True)
        after += got
    assert Counter(before + after) == Counter(names)
    with pytest.raises(InvalidArgument, match="does not say what slot 1:0 delivered"):
        run_rank(source, rank=0, world=3, workers=1, state=states[0], shuffle=True)


def test_a_second_interruption_in_the_same_epoch(volume) -> None:  # type: ignore[no-untyped-def]
    source, names = volume
    delivered, states = first_run(source, 5, shuffle=True)
    second = []
    for rank in range(3):  # resumed on 3 x 1, interrupted again after 3 batches
        got, state, _ = run_rank(source, rank=rank, world=3, workers=1,
                                 state=merge_states(states), stop_after=3, shuffle=True)
        delivered += got
        second.append(state)
    merged = merge_states(second)
    assert len(merged["segments"]) == 2
    for rank in range(2):  # and finished on 2 x 3
        got, state, _ = run_rank(source, rank=rank, world=2, workers=3, state=merged,
                                 shuffle=True)
        delivered += got
    assert Counter(delivered) == Counter(names)


def test_equal_length_resumes_give_every_rank_the_same_batches(volume) -> None:  # type: ignore[no-untyped-def]
    source, names = volume
    before, states = first_run(source, 5, shuffle=True, equal_length="pad")
    after, batches = [], set()
    for rank in range(3):
        got, _, count = run_rank(source, rank=rank, world=3, workers=1,
                                 state=merge_states(states), shuffle=True, equal_length="pad")
        after += got
        batches.add(count)
    assert len(batches) == 1
    assert set(before + after) == set(names)  # padded: a few twice, none skipped


def test_a_state_for_another_seed_or_listing_is_refused(volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    source, _ = volume
    _, states = first_run(source, 2, shuffle=True, seed=1)
    merged = merge_states(states)
    with pytest.raises(ResumeMismatch, match="seed 1 in the state, 2 here"):
        run_rank(source, rank=0, world=1, workers=0, state=merged, shuffle=True, seed=2)
    other = dict(merged, fingerprint="0" * 64)
    with pytest.raises(ResumeMismatch, match="listing 000000000000"):
        run_rank(source, rank=0, world=1, workers=0, state=other, shuffle=True, seed=1)
    with pytest.raises(InvalidArgument, match="resumes epoch 0"):
        from tests.common.resume import RankedDataset

        paths = RankedDataset(source, shuffle=True, seed=1)
        paths.load_state_dict(merged)
        paths.set_epoch(1)


def shard_plan_resume(source: str, state: Path, *args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from ucstage.cli.app import cli

    result = CliRunner().invoke(cli, ["shard-plan", source, "--resume", str(state), *args])
    return result.exit_code, result.output


def test_shard_plan_resume_prints_what_the_resumed_ranks_read(volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    source, _ = volume
    _, states = first_run(source, 5, shuffle=True, seed=2)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(merge_states(states)))
    code, out = shard_plan_resume(source, path, "-w", "3", "-k", "0", "--json")
    assert code == 0, out
    plan = json.loads(out)
    assert plan["mode"] == "resplit" and plan["resumed_files"] == 40
    for rank in range(3):  # what each resumed rank reads, in order, is what the plan says
        got, _, _ = run_rank(source, rank=rank, world=3, workers=0,
                             state=merge_states(states), shuffle=True, seed=2)
        assert got == plan["slots"][rank]["files"]
    # A list of per-rank states is merged on the way; same layout: slots continue.
    path_list = tmp_path / "states.json"
    path_list.write_text(json.dumps(states))
    code, out = shard_plan_resume(source, path_list, "-w", "2", "-k", "2", "--json")
    assert code == 0 and json.loads(out)["mode"] == "continue"


def test_shard_plan_resume_refuses_a_state_that_does_not_fit(volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    source, _ = volume
    _, states = first_run(source, 2, shuffle=True)
    merged = merge_states(states)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(dict(merged, fingerprint="f" * 64)))
    code, out = shard_plan_resume(source, path, "-w", "1", "-k", "0")
    assert code == 2 and "cannot resume epoch 0" in out and "listing ffffffffffff" in out
    beyond = json.loads(json.dumps(merged))
    beyond["segments"][0]["delivered"][0] = 60  # slot 0:0 reads 51 of 203 files
    path.write_text(json.dumps(beyond))
    code, out = shard_plan_resume(source, path, "-w", "1", "-k", "0")
    assert code == 2 and "slot 0:0 delivered 60 files but reads only 51" in out
    path.write_text(json.dumps(states[0]))  # one rank's state, on another layout
    code, out = shard_plan_resume(source, path, "-w", "3", "-k", "1")
    assert code == 2 and "does not say what slot 1:0 delivered" in out
    code, out = shard_plan_resume(source, path, "-w", "2", "-k", "2", "--seed", "4")
    assert code == 2 and "--resume takes shuffle, its scope, seed and epoch from the state" in out
    assert "leave --seed out" in out
    code, out = shard_plan_resume(source, path, "-w", "2", "-k", "2", "--shuffle-scope", "node")
    assert code == 2 and "leave --shuffle-scope out" in out


def test_a_state_saved_between_epochs_starts_the_next_one(volume) -> None:  # type: ignore[no-untyped-def]
    from tests.common.resume import Decode, RankedDataset
    from ucstage.data import DataLoader

    source, names = volume
    paths = RankedDataset(source, shuffle=True)
    loader = DataLoader(Decode(paths), batch_size=50, num_workers=0, audit=False)
    assert sum(len(b) for b in loader) == N
    done = loader.state_dict()
    assert done["finished"] and done["epoch"] == 0
    paths.set_epoch(1)  # and before epoch 1 starts: its state is at its start
    fresh = loader.state_dict()
    assert not fresh["finished"] and fresh["epoch"] == 1
    assert fresh["segments"][0]["delivered"] == [0]
    resumed = RankedDataset(source, shuffle=True)
    resumed.load_state_dict(done)
    assert resumed.epoch == 1
    assert sorted(Path(p).read_text() for p in resumed) == names
