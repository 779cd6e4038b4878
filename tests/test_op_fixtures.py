"""gpu.idle as pyinfra tests its own operations: probe documents in, commands (or a noop) out.

Each ``ops/gpu.idle/*.json`` holds ``kwargs``, the probe document the fact returns, and the expected
``commands`` / ``noop`` / ``logs`` (notation in tests/opharness.py: host programs as ``PY <program> ARGS``,
``fail: MESSAGE`` for a failure the operation already sees).
"""
import json

import pytest

from opharness import OPS, FakeHost, FakeState, check, run
from operations import gpu

CASES = sorted((OPS / "gpu.idle").glob("*.json"))


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_fixture(case):
    spec = json.loads(case.read_text())
    host = FakeHost("fake-host", spec.get("data"), {"Gpus": spec["probe"]})
    check(spec, host, run(gpu.idle._inner, host, FakeState([host]), **spec.get("kwargs", {})))
    python = spec.get("data", {}).get("specops_python", "python3")
    assert host.fact_calls == [("Gpus", {"python": python, "devices": "/dev/nvidia*"})]


def test_every_fixture_is_exercised():
    assert len(CASES) >= 6
