"""``jobs="auto"``: the in-flight limit follows a simulated store's throughput."""

from __future__ import annotations

import pytest

from tests.common.parts import unique
from ucstage import LocalCache
from ucstage.cache.tuning import (
    FIRST_GUESS,
    LOCAL,
    MOUNT,
    OBJECT_STORE,
    OBJECT_STORE_CEILING,
    REMOTE,
    Jobs,
    check_jobs,
    first_guess,
    source_kind,
)
from ucstage.engines.engine import of as engine_of
from ucstage.engines.mounts import mount_fstype
from ucstage.volumes import list_files, resolve


class Store:
    """A store whose throughput grows with requests in flight up to ``knee``,
    then stays flat (or falls past ``collapse``); time advances per window."""

    def __init__(self, knee: int, collapse: int | None = None) -> None:
        self.knee, self.collapse = knee, collapse
        self.now = 0.0

    def rate(self, inflight: int) -> float:
        if self.collapse is not None and inflight > self.collapse:
            return 1e6 * self.knee / 4
        return 1e6 * min(inflight, self.knee)


def drive(jobs: Jobs, store: Store, windows: int, *, errors_at: tuple[int, ...] = ()) -> list[int]:
    """Run ``windows`` measurement windows; return the limit after each."""
    seen = []
    for w in range(windows):
        limit = jobs.limit
        # About 0.3 s of copies of 1 MB each, finishing at the store's rate
        # for this many in flight (at least a full round of them).
        rate = store.rate(limit)
        for _ in range(max(limit, int(rate * 0.3 / 1e6))):
            assert jobs.enter()
            if w in errors_at:
                jobs.error()
            store.now += 1e6 / rate
            jobs.leave(1_000_000)
            if jobs.limit != limit:
                break  # the window closed and the limit moved
        seen.append(jobs.limit)
    return seen


def _jobs(store: Store, ceiling: int = OBJECT_STORE_CEILING) -> Jobs:
    return Jobs(None, ceiling=ceiling, clock=lambda: store.now)


def test_auto_ramps_while_throughput_rises_and_settles_at_the_knee() -> None:
    store = Store(knee=40)
    jobs = _jobs(store)
    limits = drive(jobs, store, 12)
    assert limits[:2] == [64, 128]  # from 32, doubling while it pays
    assert 32 <= jobs.settled <= 64  # settled where more stopped helping
    threads = Jobs(None, ceiling=64, clock=lambda: store.now)
    assert drive(threads, store, 2) == [16, 32]  # threads start at 8


def test_auto_stops_at_the_ceiling() -> None:
    store = Store(knee=10_000)
    jobs = _jobs(store, ceiling=64)
    drive(jobs, store, 10)
    assert jobs.settled == 64 and jobs.peak == 64


def test_auto_backs_off_on_errors_and_on_falling_throughput() -> None:
    store = Store(knee=64)
    jobs = _jobs(store)
    drive(jobs, store, 8)
    before = jobs.settled
    drive(jobs, store, 1, errors_at=(0,))  # throttled: halve
    assert jobs.settled == before // 2
    store = Store(knee=16, collapse=24)  # the store degrades past 24 in flight
    jobs = _jobs(store)
    drive(jobs, store, 10)
    assert jobs.settled <= 24


def test_an_explicit_number_is_kept() -> None:
    store = Store(knee=100)
    jobs = Jobs(4, ceiling=OBJECT_STORE_CEILING, clock=lambda: store.now)
    drive(jobs, store, 6, errors_at=(2,))
    assert jobs.settled == 4 and jobs.fixed


@pytest.mark.parametrize("bad", [0, -1, "x", "", True, "1.5"])
def test_bad_jobs_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="jobs must be a positive number or 'auto'"):
        check_jobs(bad)  # type: ignore[arg-type]
    assert check_jobs("auto") is None and check_jobs(None) is None and check_jobs("8") == 8


def test_try_enter_takes_a_free_place_without_waiting() -> None:
    jobs = Jobs(2, ceiling=256)
    assert jobs.try_enter() and jobs.try_enter()
    assert not jobs.try_enter()  # full: refused at once, no wait
    jobs.leave(0)
    assert jobs.try_enter()
    jobs.close()
    jobs.leave(0)
    assert not jobs.try_enter()  # closed


def test_a_first_guess_is_where_a_tuned_job_starts_and_it_ramps_from_there() -> None:
    store = Store(knee=100)
    jobs = Jobs(None, ceiling=64, start=32, clock=lambda: store.now)
    assert jobs.limit == 32
    assert drive(jobs, store, 1) == [64]  # doubling from the guess while it pays
    assert Jobs(None, ceiling=16, start=32).limit == 16  # never above the ceiling
    assert Jobs(5, ceiling=64, start=32).limit == 5  # an explicit number wins


def test_the_first_guess_of_a_fuse_mount(fuse_volume: tuple[str, str]) -> None:
    _, mnt = fuse_volume
    volume = resolve(mnt)
    assert mount_fstype(mnt).startswith("fuse")
    assert source_kind(volume, engine_of(volume)) == MOUNT
    assert first_guess(volume, engine_of(volume)) == FIRST_GUESS[MOUNT] == 32


def test_the_first_guess_of_a_local_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    volume = resolve(str(tmp_path))
    assert source_kind(volume, engine_of(volume)) == LOCAL
    assert first_guess(volume, engine_of(volume)) == FIRST_GUESS[LOCAL] == 8


def test_the_first_guess_of_an_s3_volume(moto, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    volume = resolve(f"s3://ucstage-test/{unique()}", must_exist=False)
    assert engine_of(volume).name == "obstore"
    assert first_guess(volume, engine_of(volume)) == FIRST_GUESS[OBJECT_STORE] == 64
    monkeypatch.setenv("UCSTAGE_ENGINE", "fsspec")
    volume = resolve(f"s3://ucstage-test/{unique()}", must_exist=False)
    assert first_guess(volume, engine_of(volume)) == FIRST_GUESS[REMOTE] == 32


def test_mountinfo_is_read_for_the_deepest_mount(tmp_path) -> None:  # type: ignore[no-untyped-def]
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:39 / /mnt/my\\040data rw,relatime - fuse.rclone remote: rw\n"
        "41 40 0:40 / /mnt/my\\040data/nfs rw - nfs4 srv:/x rw\n"
        "broken line\n")
    assert mount_fstype("/mnt/my data/a/b", str(info)) == "fuse.rclone"
    assert mount_fstype("/mnt/my data/nfs/c", str(info)) == "nfs4"
    assert mount_fstype("/mnt/my datax", str(info)) == "ext4"  # a prefix is not a parent
    assert mount_fstype("/x", str(tmp_path / "missing")) == ""


def test_warm_starts_from_the_sources_first_guess(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from ucstage.cache import fetch

    starts: list[int | None] = []

    class Recorded(Jobs):
        def __init__(self, jobs: int | None, **kw) -> None:  # type: ignore[no-untyped-def]
            starts.append(kw.get("start"))
            super().__init__(jobs, **kw)

    monkeypatch.setattr(fetch, "Jobs", Recorded)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"x")
    volume = resolve(str(src))
    cache = LocalCache(str(tmp_path / "cache"))
    cache.warm(volume, list_files(volume).entries)
    cache.warm(volume, list_files(volume).entries, jobs=3)
    assert starts == [FIRST_GUESS[LOCAL], None]  # a fixed number has no guess
