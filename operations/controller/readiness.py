"""Live verification of a started server: health, a real generation, the config it reports, accept length.

``await_ready`` takes an injected ``read(budget)`` (one on-host sampling round of server_ctl ``wait``), so the
logic and its verdicts are tested with a synthetic clock and scripted documents.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from operations.model.server_config import ServerConfig
from operations.model.engines import engine_for, mismatches
from operations.controller.waiting import Clock, Deadline, ReadCost, poll


@dataclass(frozen=True)
class Readiness:
    status: str  # ready | dead | mismatch | low-accept | timeout | misplaced
    elapsed: float
    reasons: tuple[str, ...] = ()
    log_tail: tuple[str, ...] = ()
    accept_length: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ready"

    @property
    def text(self) -> str:
        if self.ok:
            acc = f", avg accept length {self.accept_length:.2f}" if self.accept_length is not None else ""
            return f"ready after {self.elapsed:.1f}s: health_generate 200, generation ok, config confirmed{acc}"
        head = {"dead": "server exited during start", "mismatch": "server reports a different config",
                "low-accept": "speculation underperforms", "timeout": "not ready before the deadline",
                "misplaced": "server runs on other GPUs than its config declares"}[self.status]
        return f"{head} after {self.elapsed:.1f}s: {'; '.join(self.reasons) or 'no answer'}"


def accept_length(server_info: dict | None) -> float | None:
    states = (server_info or {}).get("internal_states") or [{}]
    value = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
    return float(value) if value is not None else None


def live_problems(cfg: ServerConfig, server_info: dict | None) -> list[str]:
    """What a converged server's own report says is wrong now (re-checked on every no-op run, not only at start):
    today the average accept length against ``min_accept_length``."""
    acc = accept_length(server_info)
    if cfg.speculative and cfg.min_accept_length is not None and acc is not None and acc < cfg.min_accept_length:
        return [f"its average accept length is {acc:.2f} < min_accept_length {cfg.min_accept_length} "
                f"(speculation underperforms)"]
    return []


LOW_ACCEPT_READINGS = 3  # one short generation is noisy: fail on low accept length only when it persists


def judge(cfg: ServerConfig, doc: dict, low_seen: int = LOW_ACCEPT_READINGS - 1) -> Readiness | None:
    """A final verdict for this document, or None to keep waiting. ``low_seen``: earlier low readings in a row."""
    if doc.get("dead"):
        return Readiness("dead", 0.0, (doc.get("reason") or "the process is gone",), tuple(doc.get("log_tail") or ()))
    if doc.get("health_generate") != 200 or not doc.get("generation_ok"):
        return None
    info = doc.get("server_info")
    if info is None:
        return None
    engine = engine_for(cfg.engine)
    wrong = [f"{k}: reports {now!r}, want {want!r}"
             for k, now, want in mismatches(engine.desired_view(cfg), engine.reported_view(cfg, info))]
    if wrong:
        return Readiness("mismatch", 0.0, tuple(wrong))
    acc = accept_length(info)
    if cfg.speculative and cfg.min_accept_length is not None:
        if acc is None:
            return None  # not measured yet
        if acc < cfg.min_accept_length:
            if low_seen + 1 < LOW_ACCEPT_READINGS:
                return Readiness("low-pending", 0.0, accept_length=acc)
            return Readiness("low-accept", 0.0, (f"avg accept length {acc:.2f} < min_accept_length "
                                                 f"{cfg.min_accept_length}",), accept_length=acc)
    return Readiness("ready", 0.0, accept_length=acc)


def _pending_reason(doc: dict) -> str:
    if doc.get("health_generate") != 200:
        return f"health_generate {doc.get('health_generate') or 'no answer'}"
    if not doc.get("generation_ok"):
        return str(doc.get("generated"))
    return "server_info not available yet"


def await_ready(read: Callable[[float], dict], cfg: ServerConfig, clock: Clock, log: Callable[[str], None],
                progress_s: float = 10.0, poll_s: float = 0.1, spent_s: float = 0.0) -> Readiness:
    """Read until a verdict or ``ready_timeout_s``, of which ``spent_s`` already went by (a host-side wait
    that ran before this: its reading is ``read``'s first answer)."""
    deadline = Deadline(clock, max(0.0, cfg.ready_timeout_s - spent_s))
    verdicts: list[Readiness | None] = [None]
    next_progress = [progress_s]

    low = [0]

    def on_read(doc: dict) -> None:
        verdict = judge(cfg, doc, low[0])
        low[0] = low[0] + 1 if verdict is not None and verdict.status == "low-pending" else 0
        verdicts[0] = None if verdict is not None and verdict.status == "low-pending" else verdict
        if verdicts[0] is None and (spent_s + deadline.elapsed()) >= next_progress[0]:
            next_progress[0] = (spent_s + deadline.elapsed()) + progress_s
            log(f"waiting for the server: {(spent_s + deadline.elapsed()):.0f}s of {cfg.ready_timeout_s:.0f}s, "
                f"{_pending_reason(doc)}")

    outcome = poll(read, lambda doc: verdicts[0] is not None, deadline, poll_s, on_read, chunk=progress_s,
                   cost=ReadCost(), waited=lambda doc: float(doc.get("waited_s", 0.0)))
    verdict = verdicts[0]
    if verdict is None:
        verdict = Readiness("timeout", 0.0, (_pending_reason(outcome.value),),
                            tuple(outcome.value.get("log_tail") or ()))
    # the log may echo the server's arguments (SGLang logs its ServerArgs, api_key included) or environment
    return Readiness(verdict.status, spent_s + deadline.elapsed(), tuple(map(cfg.redact, verdict.reasons)),
                     tuple(map(cfg.redact, verdict.log_tail)), verdict.accept_length)


def server_gpus(gpus, pid: int | None) -> set[int]:
    """The GPUs on which the server's processes (its pid and its process group: SGLang's scheduler and TP
    workers are its children there) hold memory, as the GPU fact reads the driver."""
    if not pid:
        return set()
    return {p.gpu_index for p in gpus.processes if p.pid == pid or p.pgid == pid}


def placement_problem(cfg: ServerConfig, gpus, pid: int | None) -> str | None:
    """Why the server does not run on exactly the GPUs its config declares, or None (also None when the GPU fact
    cannot be read or lists none of its processes: nothing to judge by)."""
    if not gpus.available:
        return None
    actual, want = server_gpus(gpus, pid), set(cfg.gpu_indices())
    if not actual or actual == want:
        return None
    extra, missing = sorted(actual - want), sorted(want - actual)
    parts = ([f"also on GPU {','.join(map(str, extra))}"] if extra else []) + (
        [f"not on GPU {','.join(map(str, missing))}"] if missing else [])
    return (f"runs on GPU {','.join(map(str, sorted(actual)))}, config declares GPU "
            f"{','.join(map(str, sorted(want)))} ({'; '.join(parts)})")
