"""Polling with deadlines: small tenacity pieces over an injectable clock (tests use a synthetic one)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Generic, Protocol, TypeVar

import tenacity

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Monotonic time; sleeps through gevent so other hosts' greenlets keep running (pyinfra CLI and API mode)."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        import gevent

        gevent.sleep(seconds)


class Deadline:
    def __init__(self, clock: Clock, seconds: float):
        self.clock = clock
        self.start = clock.now()
        self.end = self.start + seconds

    def elapsed(self) -> float:
        return self.clock.now() - self.start

    def remaining(self) -> float:
        return self.end - self.clock.now()


class Stable:
    """True once a condition has held for ``window`` seconds over at least two consecutive readings."""

    def __init__(self, clock: Clock, window: float):
        self.clock, self.window = clock, window
        self.since: float | None = None
        self.readings = 0

    def update(self, ok: bool) -> bool:
        if not ok:
            self.since, self.readings = None, 0
            return False
        if self.since is None:
            self.since = self.clock.now()
        self.readings += 1
        return self.readings >= 2 and self.clock.now() - self.since >= self.window


@dataclass
class Outcome(Generic[T]):
    value: T
    done: bool
    reads: int


def poll(read: Callable[[], T], done: Callable[[T], bool], deadline: Deadline, interval: float,
         on_read: Callable[[T], None] | None = None) -> Outcome[T]:
    """Call ``read`` until ``done(value)`` or the deadline.

    The deadline is never overshot: a read is not started unless the longest read so far still fits.
    """
    clock = deadline.clock
    longest = [0.0]
    reads = [0]

    def timed_read() -> T:
        t0 = clock.now()
        value = read()
        longest[0] = max(longest[0], clock.now() - t0)
        reads[0] += 1
        if on_read:
            on_read(value)
        return value

    def no_time_left(_: tenacity.RetryCallState) -> bool:
        return deadline.remaining() - longest[0] <= 0

    def pause(_: tenacity.RetryCallState) -> float:
        return max(0.0, min(interval, deadline.remaining() - longest[0]))

    retrying = tenacity.Retrying(
        stop=no_time_left, wait=pause, sleep=clock.sleep,
        retry=tenacity.retry_if_result(lambda v: not done(v)),
        retry_error_callback=lambda rs: rs.outcome.result(),
    )
    value = retrying(timed_read)
    return Outcome(value, done(value), reads[0])
