"""sweep.benchmarked as pyinfra prepares it: the controller's results folder and host data in, commands out.

Each ``ops/sweep.benchmarked/*.json`` holds the ``kwargs``, the inventory (``hosts``: name -> data) and which
``host`` runs it, the ``results`` already collected (written under a temporary results folder, named RESULTS in
the expected lines), and what must come out: ``commands``, the benchmark ``run`` (the runner argv, workload,
result path, target) or the ``noop``, the ``logs``, or the ConfigError raised.
"""
import json

import pytest
from pyinfra.context import ctx_host, ctx_state

from opharness import OPS, FakeHost, FakeState, serialise
from operations import sweep
from operations.errors import ConfigError

CASES = sorted((OPS / "sweep.benchmarked").glob("*.json"))


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_fixture(case, tmp_path):
    spec = json.loads(case.read_text())
    for rel, record in spec["results"].items():
        (tmp_path / rel).parent.mkdir(parents=True)
        (tmp_path / rel).write_text(json.dumps(record))
    hosts = [FakeHost(name, data) for name, data in spec["hosts"].items()]
    host = next(h for h in hosts if h.name == spec["host"])
    with ctx_host.use(host), ctx_state.use(FakeState(hosts)):
        if "raises" in spec:
            with pytest.raises(ConfigError) as err:
                list(sweep.benchmarked._inner(results=str(tmp_path), **spec["kwargs"]))
            assert str(err.value) == spec["raises"]
            return
        commands = list(sweep.benchmarked._inner(results=str(tmp_path), **spec["kwargs"]))
    assert [serialise(c, host) for c in commands] == spec["commands"]
    runs = [c for c in commands if getattr(c, "function", None) is sweep._run]
    if "run" in spec:
        cfg, sup, argv, workload, path, target, timeout_s, progress_s = runs[0].args
        assert {"argv": argv, "workload": workload.as_dict(), "path": str(path.relative_to(tmp_path)),
                "target": target, "timeout_s": timeout_s} == spec["run"]
    else:
        assert not runs
    assert [n.replace(str(tmp_path), "RESULTS") for n in host.noops] == ([spec["noop"]] if "noop" in spec else [])
    assert [line.replace(str(tmp_path), "RESULTS") for line in host.logs] == spec["logs"]
    assert not host.fact_calls  # the sweep reads no fact: server.running before it proved the server
