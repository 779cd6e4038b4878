"""The idle wait loop and its verdicts, against a scripted host on a synthetic clock (nothing really sleeps)."""
import re
from dataclasses import dataclass

import pytest

from operations.controller.idle_converge import Timing, converge_idle
from operations.model.idle_plan import Selection, plan_idle

from factories import proc, state


class FakeClock:
    def __init__(self):
        self.t = 1000.0
        self.slept = []

    def now(self):
        return self.t

    def sleep(self, seconds):
        assert seconds >= 0
        self.slept.append(seconds)
        self.t += seconds


@dataclass
class SimProc:
    pid: int
    gpu: int
    mib: int
    ignores_term: bool = False
    unkillable: bool = False  # stays in D state after SIGKILL
    stuck: bool = False  # memory never released
    user: str = "root"
    appears_at: float = 0.0
    died_at: float | None = None


class World:
    """A host whose processes die on signals and whose driver frees memory ``delay`` seconds after death."""

    def __init__(self, clock, *procs, gpus=2, delay=2.0, read_cost=0.1):
        self.clock, self.procs, self.gpus, self.delay, self.read_cost = clock, list(procs), gpus, delay, read_cost
        self.signals, self.conditions = [], []

    def read(self, condition=None, budget=0.0):
        self.conditions.append(condition)
        self.clock.t += self.read_cost  # a probe takes time
        now = self.clock.t
        used = [0] * self.gpus
        live = []
        for p in self.procs:
            if now < self.clock0 + p.appears_at:
                continue
            dead = p.died_at is not None
            if not dead:
                live.append(proc(p.pid, p.gpu, p.mib, user=p.user, uid=0 if p.user == "root" else 1000))
            if not dead or p.stuck or now < p.died_at + self.delay:
                used[p.gpu] += p.mib
        return state(tuple(used), *live)

    def kill(self, sig, targets):
        self.signals.append((sig, [t.pid for t in targets]))
        for p in self.procs:
            if p.pid in [t.pid for t in targets] and p.died_at is None:
                if (sig == "TERM" and not p.ignores_term) or (sig == "KILL" and not p.unkillable):
                    p.died_at = self.clock.t

    def start(self):
        self.clock0 = self.clock.t
        return self.read()


def run(world, timing=Timing(grace_s=5, deadline_s=20, stable_s=0.1, poll_s=0.05, progress_s=1), sel=Selection()):
    initial = world.start()
    plan = plan_idle(initial, sel)
    world.kill("TERM", plan.targets)
    logs = []
    t0 = world.clock.t
    verdict = converge_idle(world.read, world.kill, plan, sel, timing, world.clock, logs.append)
    return verdict, logs, world.clock.t - t0


def test_term_then_release_is_idle_soon_after_the_driver_frees():
    clock = FakeClock()
    world = World(clock, SimProc(10, 0, 70000), delay=2.0)
    verdict, logs, took = run(world)
    assert verdict.ok and verdict.stopped == {10: "TERM"}
    assert world.signals == [("TERM", [10])]
    assert 2.0 <= took <= 2.0 + 0.4  # release at 2.0s, then two stable readings
    assert verdict.text.startswith("idle: GPU 0,1 idle after") and "pid 10 stopped by SIGTERM" in verdict.text


def test_term_ignored_escalates_to_kill_after_grace():
    clock = FakeClock()
    world = World(clock, SimProc(10, 0, 70000), SimProc(11, 1, 5000, ignores_term=True), delay=1.0)
    verdict, logs, took = run(world)
    assert world.signals == [("TERM", [10, 11]), ("KILL", [11])]
    assert verdict.ok and verdict.stopped == {10: "TERM", 11: "KILL"}
    assert "pid 11 needed SIGKILL" in verdict.text
    assert any(re.search(r"pid 11 \(python3 serve\) ignored SIGTERM for 5\.[01]s: sending SIGKILL", line)
               for line in logs), logs
    assert 6.0 <= took <= 6.6


def test_stuck_memory_is_needs_reset_within_deadline():
    clock = FakeClock()
    world = World(clock, SimProc(10, 1, 70000, stuck=True))
    timing = Timing(grace_s=5, deadline_s=8, stable_s=0.1, poll_s=0.05, progress_s=1)
    verdict, logs, took = run(world, timing)
    assert verdict.status == "needs-reset"
    assert took <= 8.0  # never overshot, reads included
    assert "GPU 1: 70000 MiB still allocated" in verdict.text and "survived SIGKILL: none" in verdict.text
    assert "nvidia-smi --gpu-reset -i 1" in verdict.text


def test_process_surviving_kill_is_named():
    clock = FakeClock()
    world = World(clock, SimProc(10, 0, 70000, ignores_term=True, unkillable=True))
    verdict, _, took = run(world, Timing(grace_s=1, deadline_s=4, stable_s=0.1, poll_s=0.05))
    assert verdict.status == "needs-reset" and verdict.survivors == (10,)
    assert "pids that survived SIGKILL: 10" in verdict.text
    assert took <= 4.0


def test_process_appearing_during_wait_is_busy_and_not_killed():
    clock = FakeClock()
    world = World(clock, SimProc(10, 0, 1000), SimProc(12, 1, 3000, appears_at=0.5), delay=1.0)
    verdict, _, _ = run(world, Timing(grace_s=1, deadline_s=3, stable_s=0.1, poll_s=0.05))
    assert verdict.status == "busy"
    assert [sig for sig, _ in world.signals] == ["TERM"]  # pid 12 was never in the plan: never signalled
    assert "pid 12 on GPU 1" in verdict.text


@pytest.mark.parametrize("read_cost", [0.01, 0.3, 0.7, 1.3])
def test_deadline_never_overshot_whatever_the_read_cost(read_cost):
    clock = FakeClock()
    world = World(clock, SimProc(10, 0, 70000, stuck=True), read_cost=read_cost)
    verdict, _, took = run(world, Timing(grace_s=1, deadline_s=3, stable_s=0.1, poll_s=0.05))
    assert verdict.status == "needs-reset" and took <= 3.0 + read_cost  # the initial plan read is outside


def test_flicker_restarts_the_stable_window():
    clock = FakeClock()
    readings = iter([state((0,)), state((900,)), state((0,)), state((0,)), state((0,))])
    sel = Selection()
    plan = plan_idle(state((0,), proc(1, 0, 10)), sel)  # pretend pid 1 was stopped
    seen = []

    def read(condition, budget):
        clock.t += 0.1
        value = next(readings)
        seen.append(value.gpus[0].used_mib)
        return value

    verdict = converge_idle(read, lambda *a: None, plan, sel, Timing(stable_s=0.1, poll_s=0.05), clock, print)
    assert verdict.ok
    assert seen == [0, 900, 0, 0]  # 0 alone is not enough; the second consecutive idle reading ends it


def test_progress_lines_report_elapsed_and_mib():
    clock = FakeClock()
    world = World(clock, SimProc(10, 0, 70000), delay=3.0)
    _, logs, _ = run(world)
    progress = [line for line in logs if line.startswith("waiting for GPU 0,1")]
    assert len(progress) >= 2
    assert "s elapsed, 70000 MiB still held" in progress[0]


def test_negative_timing_rejected():
    with pytest.raises(ValueError):
        Timing(grace_s=-1)


def test_grace_is_a_minimum_even_with_slow_reads():
    clock = FakeClock()
    world = World(clock, SimProc(11, 1, 5000, ignores_term=True), delay=0.5, read_cost=0.3)
    verdict, logs, _ = run(world, Timing(grace_s=1.0, deadline_s=10, stable_s=0.1, poll_s=0.05))
    (line,) = [line for line in logs if "ignored SIGTERM" in line]
    assert float(line.split("ignored SIGTERM for ")[1].split("s")[0]) >= 1.0
    assert verdict.ok


def test_grace_must_leave_time_before_the_deadline():
    with pytest.raises(ValueError, match="grace_s .60.0. must be shorter than deadline_s .60.0."):
        Timing(grace_s=60.0, deadline_s=60.0)
