"""The op-fixture harness: run an operation's body as pyinfra prepares it (``--dry``), facts in, commands out.

The body is consumed whole, every fact answering with the fixture's document: the plan as it stands before
anything ran (pyinfra itself only takes the first command while preparing, and at execute runs the body lazily,
so later reads there see what earlier commands did; a fixture's ``note`` says where that matters).

A fixture names each fact's document (``HostView``, the GPUs and the server read at once, is made of the
``Gpus`` and ``Server`` documents, and the host's kept engine verdict ``EngineKept`` if named, unless given) (``tests/ops/facts/<name>.json``, captured from the simulated host through
``pyinfra INVENTORY fact ...``, or a variant of one) or gives it inline. Commands come out as text:
``PY <program> ARGS`` for host programs, ``upload PATH`` for files, ``call NAME`` for controller steps (``call switch SPEC`` with the host-side transition's steps),
``fail: MESSAGE`` for a failure the operation already sees. Nothing here touches a host: a fake host that
was asked to run a command fails the test.
"""
from __future__ import annotations

import json
from pathlib import Path

from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state

from operations.controller.remote import readable

OPS = Path(__file__).parent / "ops"


def doc(ref):
    """A fact document: a name in tests/ops/facts/ or the document itself."""
    return json.loads((OPS / "facts" / f"{ref}.json").read_text()) if isinstance(ref, str) else ref


class FakeHost:
    def __init__(self, name: str, data: dict | None = None, facts: dict | None = None):
        self.name = name
        self.data = dict(data or {})
        self.facts = {k: doc(v) for k, v in (facts or {}).items()}  # fact class name -> document
        self.noops, self.logs, self.fact_calls = [], [], []
        self.current_op_hash = None
        self.current_op_global_arguments = {}

    def get_fact(self, fact, **kwargs):
        self.fact_calls.append((fact.__name__, kwargs))
        if fact.__name__ == "HostView" and "HostView" not in self.facts:  # observe.py: both documents at once
            return {"gpus": self.facts["Gpus"], "server": self.facts["Server"],
                    **({"engine": self.facts["EngineKept"]} if "EngineKept" in self.facts else {})}
        assert fact.__name__ in self.facts, f"{self.name}: no {fact.__name__} document in the fixture ({kwargs})"
        return self.facts[fact.__name__]

    def noop(self, description):
        self.noops.append(description)

    def log_styled(self, message, **_):
        self.logs.append(message)

    def run_shell_command(self, *args, **kwargs):
        raise AssertionError(f"{self.name}: a command ran while preparing: {args}")


class FakeConfig:
    DIFF = False


class FakeState:
    is_executing = False
    config = FakeConfig()

    def __init__(self, hosts=()):
        self.inventory = list(hosts)
        self.active_hosts = set(hosts)
        self.failed_hosts = set()

    def should_check_for_changes(self):
        return True

    def add_callback_handler(self, handler):  # the run summary and the lease register; nothing runs here
        pass


def serialise(command, host) -> str:
    if isinstance(command, FunctionCommand):
        if command.function.__name__ == "_fail":
            assert command.function(FakeState(), host, *command.args) is False  # it fails this host only
            return f"fail: {command.args[0]}"
        if command.function.__name__ == "switch":  # the one host-side transition: what it is asked to do
            return f"call switch {json.dumps(command.args[2], sort_keys=True)}"
        if command.function.__name__ == "_acquire" and command.args[3]:  # the lease, then the server directory
            return f"call _acquire, prepare {command.args[3]}"
        return f"call {command.function.__name__}"
    if isinstance(command, FileUploadCommand):
        return f"upload {command.dest}"
    assert isinstance(command, StringCommand), command
    return readable(command.get_raw_value())


def run(body, host: FakeHost, state: FakeState, **kwargs) -> list[str]:
    """The commands ``body`` (an operation's ``_inner``) yields on ``host`` while preparing."""
    with ctx_host.use(host), ctx_state.use(state):
        return [serialise(c, host) for c in body(**kwargs)]


def check(spec: dict, host: FakeHost, commands: list[str]) -> None:
    """The expected ``commands``, ``noop`` and ``logs`` (each a fragment of some log line) of a fixture."""
    assert commands == spec["commands"], json.dumps(commands, indent=1)
    assert host.noops == ([spec["noop"]] if spec.get("noop") else []), host.noops
    for expected in spec.get("logs", []):
        assert any(expected in line for line in host.logs), (expected, host.logs)
