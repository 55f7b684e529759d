"""The read path of one item (issue 41): the first item of an epoch, traced by
``benchmarks.readpath`` (a local folder, ``read_ahead=0``, no workers), runs
no more ucstage functions and modules than it does now. A regression guard on
the fan-out, not on time: a new layer on the hit path fails it here."""

from __future__ import annotations

from typing import Any

from benchmarks.readpath import first_items

HIT_MODULES = 11
HIT_FUNCTIONS = 44
"""The hit path as issue 41 left it (84 functions in 20 modules before);
docs/design.md, "The read path of one item", names its modules."""
MISS_MODULES = 15
MISS_FUNCTIONS = 97
"""The miss path after issue 41's cache side (196 functions in 26 modules
before it): the crash-safe copy, with the cache's one-time set-up at its
opening and the namespace's and the volume's when the listing is adopted,
not in the first fetch, and an epoch reading through the namespace the
dataset bound then (no ``LocalCache.at`` per epoch)."""


def test_the_first_item_runs_no_more_of_ucstage_than_it_did(tmp_path: Any) -> None:
    traces = first_items(str(tmp_path), 8)
    hit, miss = traces["hit"], traces["miss"]
    assert len(hit.modules) <= HIT_MODULES, hit.modules
    assert len(hit.functions) <= HIT_FUNCTIONS, sorted(hit.functions)
    assert len(miss.modules) <= MISS_MODULES, miss.modules
    assert len(miss.functions) <= MISS_FUNCTIONS, sorted(miss.functions)
    # A hit is one validity check of the leading block (no fetch, no second lookup).
    assert hit.lookups == 1
    # A miss: the leading block's check found it missing, and the fetch checks
    # it once more, under the entry's lock; nothing checks it in between.
    assert miss.lookups == 2
    assert not {name for m, name in hit.functions
                if m == "ucstage.cache.fetch"} - {"Bound.lookup_rows"}, hit.functions
    # A file this process fetched is vouched for by the stamp it wrote: no stamp read.
    assert ("ucstage.cache.paths", "read_stamp") not in hit.functions
    # A new root's byte ledger is counted when the cache opens, not by the
    # first copy (no walk of the tree on a miss); a copy that checks nothing
    # costs the run's counters nothing of the checks' tally.
    assert ("ucstage.cache.space", "walk") not in miss.functions
    assert not {name for m, name in miss.functions if m == "ucstage.engines.checks"}
    # The namespace (its folder and record) is prepared and the volume resolved
    # when the listing is adopted: the first item writes no record, resolves nothing.
    assert not {m for m, _ in miss.functions} & {"ucstage.atomic", "ucstage.manifest.model"}
    assert ("ucstage.cache.space", "CacheSpace.prepare") not in miss.functions
    # The slot rule is worked out once per layout: an epoch only deals.
    assert ("ucstage.sharding.rule", "Layout.__post_init__") not in hit.functions
    assert ("ucstage.sharding.rule", "stride") not in hit.functions
    # Unshuffled, the read order is the listing: the slot's positions are its rows.
    assert not {name for m, name in hit.functions if m == "ucstage.sharding.order"}


def test_a_read_ahead_miss_is_checked_once_before_its_lock_and_once_under_it(
        tmp_path: Any, monkeypatch: Any) -> None:
    """With read-ahead, the consumer looks each entry up before it queues it;
    the queued fetch then goes straight to the entry's lock, where the check
    is made again: two validity checks per miss (three before issue 41)."""
    import os
    from collections import Counter

    from ucstage import VolumeDataset
    from ucstage.cache.fetch import Bound

    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}.bin").write_bytes(os.urandom(1000 + i))
    checks: Counter[str] = Counter()
    real = Bound.lookup_rows

    def counted(self: Bound, rels: Any, sizes: Any, versions: Any, **kw: Any) -> list[str]:
        found = real(self, rels, sizes, versions, **kw)
        checks.update(rels[:len(found) + 1])  # the run ends at the first that fails
        return found

    monkeypatch.setattr(Bound, "lookup_rows", counted)
    ds = VolumeDataset(str(src), cache_dir=str(tmp_path / "cache"), read_ahead=2)
    assert len(list(ds)) == 6
    assert dict(checks) == {f"f{i}.bin": 2 for i in range(6)}
