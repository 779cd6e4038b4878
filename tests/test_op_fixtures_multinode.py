"""multinode.running's five stages as pyinfra prepares them: every rank's fact documents in, each stage's
commands per rank out.

Each ``ops/multinode.running/*.json`` holds the ``kwargs``, the host ``data`` every rank shares, each rank's
``hosts`` facts (documents in ``ops/facts/``: the ``*-70b-2node-*`` ones captured from a simulated two-host
cluster over SSH after a real ``multinode.running``), the ``active`` hosts (the rest unreachable), and per stage
and rank the ``commands``, ``noop`` and ``logs``. A rank that fails a stage takes no part in later ones, as in
pyinfra.
"""
import json

import pytest

from opharness import OPS, FakeHost, FakeState, run
from operations import multinode

CASES = sorted((OPS / "multinode.running").glob("*.json"))
STAGES = {  # in the order multinode.running adds them, with the arguments it gives each
    "stop_and_idle": (multinode._stop_and_idle, {"idle": True, "users": None, "grace_s": 10.0,
                                                 "idle_deadline_s": 120.0}),
    "start_rank0": (multinode._start_ranks, {"leader": True}),
    "start_ranks_gt0": (multinode._start_ranks, {"leader": False}),
    "rank0_ready": (multinode._leader_ready, {"progress_s": 10.0}),
    "ranks_gt0_alive": (multinode._workers_live, {}),
}


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_fixture(case):
    spec = json.loads(case.read_text())
    hosts = [FakeHost(name, spec["data"], facts) for name, facts in spec["hosts"].items()]
    state = FakeState(hosts)
    if spec.get("active") is not None:
        state.active_hosts = {h for h in hosts if h.name in spec["active"]}
    assert list(spec["stages"]) == list(STAGES)
    for stage, (op, extra) in STAGES.items():
        for h in hosts:
            if h not in state.active_hosts:
                assert h.name not in spec["stages"][stage], (stage, h.name)
                continue
            want = spec["stages"][stage][h.name]
            noops, logs = len(h.noops), len(h.logs)
            commands = run(op._inner, h, state, config=spec["kwargs"]["config"], server_name="llm",
                           supervisor=None, state_dir=None, python=None, **extra)
            assert commands == want["commands"], (stage, h.name, json.dumps(commands, indent=1))
            assert h.noops[noops:] == ([want["noop"]] if "noop" in want else []), (stage, h.name, h.noops)
            assert h.logs[logs:] == want.get("logs", []), (stage, h.name, h.logs[logs:])
            if any(c.startswith("fail: ") for c in commands):
                state.active_hosts.discard(h)  # pyinfra runs no further operation on a failed host


def test_the_group_is_read_once_per_stage_of_the_run():
    """Every rank's Server fact is read once for the whole prepare stage (one decision for the group), not once
    per rank and operation."""
    spec = json.loads((OPS / "multinode.running" / "fresh_group_starts_in_order.json").read_text())
    hosts = [FakeHost(name, spec["data"], facts) for name, facts in spec["hosts"].items()]
    state = FakeState(hosts)
    for op, extra in STAGES.values():
        for h in hosts:
            run(op._inner, h, state, config=spec["kwargs"]["config"], server_name="llm", supervisor=None,
                state_dir=None, python=None, **extra)
    for h in hosts:
        assert [name for name, _ in h.fact_calls].count("Server") == 1, h.fact_calls
        assert [name for name, _ in h.fact_calls].count("EngineParse") == 1, h.fact_calls
