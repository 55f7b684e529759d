"""The library bodies of ``cache warm --rank/--node-rank``, ``cache verify``,
``status``/``clear`` and ``cache lazy``'s environment (ucstage.cache.warm):
what the CLI calls, without the CLI."""

from __future__ import annotations

import click
import pytest

from ucstage.cache import LocalCache
from ucstage.cache.local import MAX_BYTES_ENV
from ucstage.cache.paths import CACHE_DIR_ENV
from ucstage.cache.warm import (
    cached_volumes,
    job_env,
    rank_slice,
    share_text,
    verify_source,
    warm_ranks,
    warm_slice,
)
from ucstage.cli.output import error_hint, flag_names
from ucstage.errors import CacheFull, InvalidArgument, SourceNotFound
from ucstage.sharding import Layout, ReadOrder, rank_entries
from ucstage.source import open_source
from ucstage.volumes import VOLUMES_ROOT_ENV


def _source(tmp_path, n=8):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(n):
        (src / f"f{i}.bin").write_bytes(b"x" * (100 + i))
    return src


def test_warm_ranks_numbers_a_node_as_torchrun_does():
    assert warm_ranks() is None
    assert warm_ranks(3, world_size=8, num_workers=2) == [3]
    assert warm_ranks(node_rank=1, world_size=8, num_workers=2, nproc_per_node=4) == [4, 5, 6, 7]


@pytest.mark.parametrize(("kwargs", "library", "cli"), [
    ({"world_size": 4}, "world_size/num_workers/nproc_per_node need `rank` or node_rank",
     "--world-size/--num-workers/--nproc-per-node need --rank or --node-rank"),
    ({"rank": 1, "node_rank": 0, "world_size": 4, "num_workers": 1},
     "give `rank` or node_rank, not both", "give --rank or --node-rank, not both"),
    ({"rank": 1}, "`rank` and node_rank need world_size and num_workers",
     "--rank and --node-rank need --world-size and --num-workers"),
    ({"node_rank": 1, "world_size": 4, "num_workers": 1},
     "node_rank needs nproc_per_node P (ranks per node)",
     "--node-rank needs --nproc-per-node P (ranks per node)"),
])
def test_warm_ranks_names_parameters_the_cli_says_as_flags(kwargs, library, cli):
    from ucstage.cli.cache_warm import warm

    with pytest.raises(InvalidArgument) as caught:
        warm_ranks(**kwargs)
    assert caught.value.message == library
    assert flag_names(caught.value.message, warm) == cli


def test_rank_slice_is_the_slot_rule_and_marks_a_node_share(tmp_path):
    entries = list(open_source(str(_source(tmp_path))).snapshot().entries)
    layout = Layout(4, 1, 2)
    plain = ReadOrder(len(entries))
    chosen, slice_ = rank_slice(entries, [1], layout, plain)
    assert chosen == rank_entries(entries, [1], layout, plain) and slice_.nodes is None
    shuffled = ReadOrder(len(entries), shuffle=True, seed=3)
    chosen, slice_ = rank_slice(entries, [2, 3], layout, shuffled)
    assert slice_.nodes == [1] and chosen == rank_entries(entries, [2, 3], layout, shuffled)
    assert share_text([1], layout) == "node 1's whole share (ranks 2..3)"
    assert share_text([0, 1], layout) == "nodes 0, 1' whole share (ranks 0..1, 2..3)"
    assert share_text([0], Layout(4, 1)) == "the whole share of the job's one node (every file)"


def test_a_node_share_that_does_not_fit_says_so(tmp_path):
    m = open_source(str(_source(tmp_path))).snapshot()
    entries = list(m.entries)
    cache = LocalCache(str(tmp_path / "cache"), max_bytes=150)
    chosen, slice_ = rank_slice(entries, [0], Layout(4, 1, 2),
                                ReadOrder(len(entries), shuffle=True))
    with pytest.raises(CacheFull) as caught:
        warm_slice(cache, m.volume(), chosen, slice_)
    assert caught.value.message.startswith("node 0's whole share (ranks 0..1) does not fit: ")
    assert "(raise max_bytes, a larger disk)" in caught.value.hint
    # Any other warm raises LocalCache.warm's own error, which ends in WARM_FEWER.
    with pytest.raises(CacheFull) as plain:
        warm_slice(cache, m.volume(), entries)
    assert plain.value.hint == "raise max_bytes, or warm fewer files"


def test_error_hint_names_the_flags_that_choose_fewer_files():
    from ucstage.cli.cache_maint import prune
    from ucstage.cli.cache_warm import warm

    full = CacheFull("too big", hint="raise max_bytes, or warm fewer files")
    assert error_hint(full, warm) == "raise --max-bytes, or warm fewer files (--include, --rank)"
    # A command without those flags gets the hint as the library wrote it.
    assert error_hint(full, prune) == "raise --max-bytes, or warm fewer files"
    assert error_hint(InvalidArgument("x", hint="warm fewer files"), warm) == "warm fewer files"


def test_verify_source_checks_one_source_or_all(tmp_path):
    src = _source(tmp_path, 4)
    cache = LocalCache(str(tmp_path / "cache"))
    m = open_source(str(src)).snapshot()
    cache.warm(m.volume(), m.entries)
    heard = []
    one = verify_source(cache, open_source(str(src)), listed=heard.append)
    assert [(s.source, s.checked, s.ok) for s in one.sources] == [(m.source, 4, 4)]
    assert len(heard) == 1 and one.clean
    (src / "f0.bin").write_bytes(b"changed")
    every = verify_source(cache, None)
    assert [len(s.stale) for s in every.sources] == [1] and not every.clean
    filtered = verify_source(cache, open_source(str(src)), include=["f1*"])
    assert filtered.sources[0].checked == 1


def test_cached_volumes_refuses_a_typo(tmp_path):
    cache = LocalCache(str(tmp_path / "cache"))
    assert cached_volumes(cache, None) is None
    typo = str(tmp_path / "nowhere")
    with pytest.raises(SourceNotFound, match="nothing cached for"):
        cached_volumes(cache, typo)


def test_job_env_holds_what_differs_from_the_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv(VOLUMES_ROOT_ENV, raising=False)
    monkeypatch.setenv(MAX_BYTES_ENV, " 2G ")
    m = open_source(str(_source(tmp_path, 1))).snapshot()
    cache = LocalCache(str(tmp_path / "cache"))
    assert job_env(m, cache) == {CACHE_DIR_ENV: cache.root, MAX_BYTES_ENV: "2G"}


def test_the_cache_group_has_every_subcommand():
    from ucstage.cli.cache import command

    assert isinstance(command, click.Group)
    assert sorted(command.commands) == ["clear", "lazy", "prune", "status", "verify", "warm"]
