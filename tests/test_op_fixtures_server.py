"""server.running and server.stopped as pyinfra tests its own operations: fact documents in, commands out.

Each ``ops/server.running/*.json`` / ``ops/server.stopped/*.json`` holds the operation's ``kwargs``, the host
``data``, the ``facts`` (documents under ``ops/facts/``, captured from the simulated host with ``pyinfra
INVENTORY fact ...``), and what must come out: ``commands`` (see tests/opharness.py for their notation), the
``noop``, the ``logs`` lines, the facts read with their arguments (``fact_calls``), or the ConfigError raised.
"""
import json

import pytest

from opharness import OPS, FakeHost, FakeState, check, run
from operations import server
from operations.errors import ConfigError

CASES = sorted((OPS / "server.running").glob("*.json")) + sorted((OPS / "server.stopped").glob("*.json"))
BODIES = {"server.running": server.running._inner, "server.stopped": server.stopped._inner}


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.stem}" for c in CASES])
def test_fixture(case):
    spec = json.loads(case.read_text())
    host = FakeHost("gpu-a", spec["data"], spec["facts"])
    body = BODIES[case.parent.name]
    if "raises" in spec:
        with pytest.raises(ConfigError) as err:
            run(body, host, FakeState([host]), **spec["kwargs"])
        assert str(err.value) == spec["raises"]
        return
    check(spec, host, run(body, host, FakeState([host]), **spec["kwargs"]))
    assert [[name, kwargs] for name, kwargs in host.fact_calls] == spec["fact_calls"]


def test_the_cases_cover_converge_start_switch_and_each_refusal():
    names = {f"{c.parent.name}/{c.stem}" for c in CASES}
    assert {"server.running/converged_noop", "server.running/fresh_start", "server.running/config_switch_restarts",
            "server.running/switch_with_stale_process_steps", "server.running/config_switch_engine_verdict_kept",
            "server.running/engine_refusal_kept_still_refuses",
            "server.running/other_user_blocks_before_stop", "server.running/no_driver_fails",
            "server.running/engine_refuses_flag", "server.running/unsafe_state_dir",
            "server.stopped/running_is_stopped", "server.stopped/not_running_noop"} <= names, names
