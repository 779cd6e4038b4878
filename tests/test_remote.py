"""How host programs reach a host: the bundle travels only with the facts; every other command names it by hash
and, when it is missing, exits 97 with one line that ``ask`` answers by installing it and running again. Run here
through a real shell with HOME set to a test directory, as a host runs them."""
from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

from operations.controller import remote
from operations.facts.view import HostView

PY = sys.executable


class ShellHost:
    """A host whose commands run in ``sh -c`` here, with its own HOME; records every command it ran."""

    name = "shell-host"

    def __init__(self, home):
        self.home, self.ran, self.data = str(home), [], {}

    def run_shell_command(self, command, **_):
        raw = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
        self.ran.append(raw)
        done = subprocess.run(["sh", "-c", raw], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "HOME": self.home})
        return done.returncode == 0, SimpleNamespace(stdout_lines=done.stdout.splitlines(),
                                                     stderr_lines=done.stderr.splitlines())


def test_a_lean_command_carries_no_bundle_and_says_when_it_is_missing(tmp_path):
    digest, payload = remote.bundle()
    lean = remote.python_script(PY, "server_ctl.py", "status", str(tmp_path / "srv"), "1").get_raw_value()
    full = remote.python_script(PY, "server_ctl.py", "status", str(tmp_path / "srv"), "1",
                                install=True).get_raw_value()
    assert payload not in lean and len(lean) < 600 and payload in full, (len(lean), len(full))
    assert remote.readable(lean) == remote.readable(full) == f"{PY} <server_ctl> status {tmp_path / 'srv'} 1"
    done = subprocess.run(["sh", "-c", lean], capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == remote.MISSING_RC, done
    assert done.stderr.strip() == f"{remote.MISSING} in {tmp_path}/.cache/specops/{digest}", done.stderr
    assert not (tmp_path / ".cache" / "specops" / digest).exists()


def test_ask_installs_a_missing_bundle_once_and_runs_the_command_again(tmp_path):
    host = ShellHost(tmp_path)
    doc = remote.ask(host, remote.python_script(PY, "server_ctl.py", "status", str(tmp_path / "srv"), "1"))
    assert doc.get("alive") is False and "error" not in doc, doc
    assert len(host.ran) == 3 and remote.bundle()[1] in host.ran[1], [len(r) for r in host.ran]  # lean, install, lean
    assert (tmp_path / ".cache" / "specops" / remote.bundle()[0] / "ok").is_file()
    host.ran.clear()  # installed now: one lean command per ask
    assert remote.ask(host, remote.python_script(PY, "server_ctl.py", "status", str(tmp_path / "srv"), "1"))["alive"] is False
    assert len(host.ran) == 1 and remote.bundle()[1] not in host.ran[0]


def test_the_facts_carry_the_installer_so_a_run_s_first_contact_installs_it(tmp_path, monkeypatch):
    from pyinfra.context import ctx_host

    host = SimpleNamespace(name="h", data={"specops_python": PY})
    with ctx_host.use(host):
        command = HostView().command(directory=str(tmp_path / "srv"), port=1, devices=str(tmp_path / "dev*"))
    raw = command.get_raw_value()
    assert remote.bundle()[1] in raw
    done = subprocess.run(["sh", "-c", raw], capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    doc = HostView().process(done.stdout.splitlines())
    assert doc["server"]["alive"] is False and doc["gpus"]["source"] in ("none", "pynvml", "nvidia-smi"), doc
