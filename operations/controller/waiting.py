"""Polling with deadlines: small tenacity pieces over an injectable clock (tests use a synthetic one)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Generic, Protocol, TypeVar

import tenacity

from operations.remote.common import StableWindow

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

        from operations.controller.interrupt import check

        check("waiting further")  # Ctrl-C ends every wait at its next pause
        gevent.sleep(seconds)
        check("waiting further")


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
    """True once a condition has held for ``window`` seconds over at least two consecutive readings (the same
    rule the probe applies on the host)."""

    def __init__(self, clock: Clock, window: float):
        self.clock = clock
        self.window = StableWindow(window, need=2)

    def update(self, ok: bool) -> bool:
        return self.window.update(ok, self.clock.now())


@dataclass
class ReadCost:
    """Worst time a read spent beyond waiting on the host; shared by the polls of one wait so none overshoots."""

    worst: float | None = None  # unknown until the first read: that one gets no budget to wait

    def margin(self) -> float:
        return self.worst or 0.0


class StopAtDeadline(tenacity.stop.stop_base):
    """tenacity stop: no time is left before the deadline for one more read (its worst overhead so far)."""

    def __init__(self, deadline: Deadline, cost: ReadCost | None = None):
        self.deadline, self.cost = deadline, cost or ReadCost()

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.deadline.remaining() - self.cost.margin() <= 0


class WaitWithinDeadline(tenacity.wait.wait_base):
    """tenacity wait: ``interval`` between reads, cut short so the next read still fits before the deadline."""

    def __init__(self, interval: float, deadline: Deadline, cost: ReadCost | None = None):
        self.interval, self.deadline, self.cost = interval, deadline, cost or ReadCost()

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        return max(0.0, min(self.interval, self.deadline.remaining() - self.cost.margin()))


@dataclass
class Outcome(Generic[T]):
    value: T
    done: bool
    reads: int


def poll(read: Callable[[float], T], done: Callable[[T], bool], deadline: Deadline, interval: float,
         on_read: Callable[[T], None] | None = None, chunk: float = 0.0, initial: T | None = None,
         cost: ReadCost | None = None, waited: Callable[[T], float] = lambda value: 0.0) -> Outcome[T]:
    """Call ``read(budget)`` until ``done(value)`` or the deadline.

    ``budget`` is how long one read may itself wait on the host (at most ``chunk``). The deadline is never
    overshot: each budget leaves room for the worst overhead seen so far, and no read starts without it.
    ``initial``: a reading already taken when no time is left; it is judged instead of reading again.
    ``waited``: how long a reading says it spent waiting on the host (the rest of its duration is overhead).
    """
    if initial is not None:
        return Outcome(initial, done(initial), 0)
    clock = deadline.clock
    cost = ReadCost() if cost is None else cost
    reads = [0]

    def timed_read() -> T:
        budget = 0.0 if cost.worst is None else max(0.0, min(chunk, deadline.remaining() - cost.worst))
        t0 = clock.now()
        value = read(budget)
        cost.worst = max(cost.margin(), clock.now() - t0 - waited(value))
        reads[0] += 1
        if on_read:
            on_read(value)
        return value

    retrying = tenacity.Retrying(
        stop=StopAtDeadline(deadline, cost), wait=WaitWithinDeadline(interval, deadline, cost), sleep=clock.sleep,
        retry=tenacity.retry_if_result(lambda v: not done(v)),
        retry_error_callback=lambda rs: rs.outcome.result(),
    )
    value = retrying(timed_read)
    return Outcome(value, done(value), reads[0])
