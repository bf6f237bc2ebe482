"""A pod's bounds on Redis' clock, from its replies alone: what a grant's trust and a call's
deadline rest on. The pod's monotonic clock is a list of readings the test steps through."""

from __future__ import annotations

from collections.abc import Callable

from gateway.backends.redis.clock import RedisClock


def stepped(*readings: float) -> Callable[[], float]:
    """A monotonic clock that returns ``readings`` in turn, then keeps the last."""
    remaining = list(readings)

    def now() -> float:
        return remaining.pop(0) if len(remaining) > 1 else remaining[0]

    return now


def test_nothing_is_known_before_the_first_reply() -> None:
    """No bound, no deadline (0), and no lease can be trusted yet."""
    clock = RedisClock(stepped(5.0))
    assert clock.upper_ms() is None and clock.lower_ms() is None
    assert clock.deadline_ms(0.5) == 0
    assert not clock.outlives(10**15, 0)


def test_the_bounds_bracket_redis_by_the_calls_round_trip() -> None:
    """Sent at 10.000 s, read at 10.004 s, Redis said 50 000 ms: at 10.104 s Redis is
    between 50 100 and 50 104 ms."""
    clock = RedisClock(stepped(10.000, 10.004, 10.104, 10.104))
    sent = clock.sent()
    clock.observe(50_000, sent)
    assert clock.upper_ms() == 50_104
    assert clock.lower_ms() == 50_100


def test_a_reply_read_late_does_not_pull_the_lower_bound_back() -> None:
    """A pod frozen between Redis answering and reading the reply learns a bound 4 s too
    low; the tighter one from the reply before it stays, so calls are not refused late."""
    clock = RedisClock(stepped(0.0, 0.001, 5.0))
    clock.observe(1_000, clock.sent())  # sent at 0.0, read at 0.001
    clock.observe(2_000, 1.0)  # sent at 1.0, run at once, read at 5.0: the pod slept
    assert clock.lower_ms() == 5_000 + 999  # from the first reply, not 5 000 - 3 000
    assert clock.upper_ms() == 5_000 + 1_000


def test_a_lease_is_trusted_only_if_it_outlives_the_margin_by_the_upper_bound() -> None:
    """Upper bound 1 010 ms: a lease to 1 600 outlives a 500 ms margin, one to 1 400 not."""
    clock = RedisClock(stepped(0.0, 0.010, 0.010))
    clock.observe(1_000, clock.sent())
    assert clock.outlives(1_600, 500)
    assert not clock.outlives(1_400, 500)


def test_a_deadline_is_never_later_than_the_time_the_pod_waits() -> None:
    """Lower bound 1 000 ms now: a call the pod waits 0.3 s for must run by 1 300 ms."""
    clock = RedisClock(stepped(0.0, 0.0, 0.0))
    clock.observe(1_000, clock.sent())
    assert clock.deadline_ms(0.3) == 1_300
