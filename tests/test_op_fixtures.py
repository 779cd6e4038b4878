"""gpu.idle as pyinfra tests its own operations: probe documents in, commands (or a noop) out.

Each ``ops/gpu.idle/*.json`` holds ``kwargs``, the probe document the fact returns, and the expected
``commands`` / ``noop`` / ``fail`` / ``logs``. Commands that run our remote scripts are written as
``PY <program> ARGS`` so fixtures stay readable.
"""
import json
from pathlib import Path

import pytest
from pyinfra.api import FunctionCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state

from operations import gpu
from operations.facts.gpu import Gpus
from operations.controller.remote import readable

CASES = sorted((Path(__file__).parent / "ops" / "gpu.idle").glob("*.json"))


class FakeHost:
    name = "fake-host"

    def __init__(self, probe_doc, data=None):
        self.state = probe_doc  # what the fact returns: the probe's JSON document
        self.data = dict(data or {})
        self.noops, self.logs, self.fact_calls = [], [], []

    def get_fact(self, fact, **kwargs):
        assert fact is Gpus
        self.fact_calls.append(kwargs)
        return self.state

    def noop(self, description):
        self.noops.append(description)

    def log_styled(self, message, **_):
        self.logs.append(message)


class FakeState:
    is_executing = False

    def should_check_for_changes(self):
        return True

    def add_callback_handler(self, handler):  # the run summary registers itself; nothing runs here
        pass


def serialise(command, host):
    if isinstance(command, FunctionCommand):
        if command.function.__name__ == "_fail":  # run it: it logs the failure message and returns False
            assert command.function(FakeState(), host, *command.args) is False
            return "fail"
        return f"call {command.function.__name__}"
    assert isinstance(command, StringCommand)
    return readable(command.get_raw_value())


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_fixture(case):
    spec = json.loads(case.read_text())
    host = FakeHost(spec["probe"], spec.get("data"))
    with ctx_host.use(host), ctx_state.use(FakeState()):
        commands = [serialise(c, host) for c in gpu.idle._inner(**spec.get("kwargs", {}))]
    assert commands == spec["commands"]
    assert host.noops == ([spec["noop"]] if spec.get("noop") else [])
    for expected in spec.get("logs", []):
        assert any(expected in line for line in host.logs), (expected, host.logs)
    assert host.fact_calls == [{"python": spec.get("data", {}).get("specops_python", "python3"), "devices": "/dev/nvidia*"}]


def test_every_fixture_is_exercised():
    assert len(CASES) >= 6
