"""The client-side pace of ucstage/engines/pace.py against a simulated token
bucket (a store allowing RATE requests per second, as S3 throttles a
prefix), on a simulated clock: the logic alone, deterministic. The same pace
against moto behind a rate-limiting proxy is in tests/cache/test_faults.py."""

from __future__ import annotations

from ucstage.engines.pace import BETA, Pace


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(rate: float, seconds: float, rtt: float = 0.01) -> tuple[int, int, Pace]:
    """A client sending as fast as its pace lets it against a store bucket of
    ``rate`` per second (burst rate / 10): (answered, throttled, pace)."""
    clock = Clock()
    p = Pace(clock)
    tokens, filled, ok, refused = rate / 10, 0.0, 0, 0
    step = 0.001
    inflight: list[tuple[float, float]] = []  # (answer time, sent time)
    while clock.now < seconds:
        # Answers due now.
        for due, sent in [x for x in inflight if x[0] <= clock.now]:
            inflight.remove((due, sent))
            tokens = min(rate / 10, tokens + (clock.now - filled) * rate)
            filled = clock.now
            if tokens >= 1:
                tokens -= 1
                ok += 1
                p.answered()
            else:
                refused += 1
                p.throttle(sent)
        # Send whatever the pace allows this millisecond (32 waiting at most).
        while len(inflight) < 32 and p.take() == 0.0:
            inflight.append((clock.now + rtt, clock.now))
        clock.now += step
    return ok, refused, p


def test_the_pace_converges_on_the_rate_the_store_allows() -> None:
    ok, refused, p = _run(100, 10)
    assert ok >= 0.85 * 100 * 10  # within ~1.2x of N / rate
    assert refused <= 0.1 * ok
    assert p.rate is not None and 50 <= p.rate <= 200


def test_a_burst_of_throttles_cuts_once() -> None:
    clock = Clock()
    p = Pace(clock)
    for _ in range(50):
        assert p.take() == 0.0  # unpaced until the first throttle
    clock.now = 0.1
    for _ in range(30):  # every request of the burst, sent before the cut
        p.throttle(0.0)
    assert p.cuts == 1 and p.rate is not None
    assert p.rate == BETA * p.peak
    clock.now = 0.2
    p.throttle(0.15)  # sent after the cut: cut again
    assert p.cuts == 2


def test_the_rate_climbs_back_after_a_cut() -> None:
    clock = Clock()
    p = Pace(clock)
    for i in range(100):
        clock.now = i / 100
        p.take()
    p.throttle(0.99)
    cut = p.rate
    assert cut is not None
    for i in range(1, 400):
        clock.now = 1 + i / 100
        while p.take() == 0.0:
            pass
        p.answered()
    assert p.rate is not None and p.rate > cut


def test_an_unthrottled_source_keeps_only_a_window_of_send_times() -> None:
    clock = Clock()
    p = Pace(clock)
    for i in range(10_000):
        clock.now = i / 1000  # 1000 a second for 10 s, never throttled
        assert p.take() == 0.0
    assert p.rate is None
    assert len(p._sent) <= 1001
