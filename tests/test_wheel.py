"""The package works from an installed wheel in a fresh venv, run from a directory outside the checkout: the
product wheel and the simulator's (specops-gpusim, from simulator/) are built once per module, each from a clean
copy of its sources (so a stale build/ in the checkout cannot hide a missing package-data glob), and installed
with pip; nothing of the checkout is on the path of what runs it."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import REPO, _run, changed, free_port
from gpusim.host import SimHost
from gpusim.ledger import proc_start_time

FLAG_TABLE = "operations/model/engines/data/sglang-0.5.23-server-args.tsv"


def sh(*argv, **kw):
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


@dataclass
class Installed:
    wheel: Path
    names: list[str]  # the product wheel's members
    sim_names: list[str]  # the simulator wheel's members (specops-gpusim)
    env_dir: Path  # the venv both are installed in
    py: Path

    def env(self, home: Path) -> dict:
        """A bare environment: the venv's bin first, nothing of the checkout (no PYTHONPATH)."""
        return {"PATH": f"{self.env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(home)}


# what each wheel is built from (its pyproject.toml's packages and package-dir, and its readme)
SOURCES = {"specops": ("pyproject.toml", "README.md", "operations", "templates"),
           "specops_gpusim": ("simulator/pyproject.toml", "simulator/gpusim")}


def _source_copy(dest: Path, sources) -> Path:
    """The checkout's sources of a wheel copied to dest, without build outputs (build/ of an earlier in-tree
    build would still hold files since deleted, or added by a glob since removed, and ship them)."""
    root = REPO / Path(sources[0]).parent
    for name in sources:
        src, to = REPO / name, dest / (REPO / name).relative_to(root)
        if src.is_dir():
            shutil.copytree(src, to, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_build"))
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, to)
    return dest


def _members(wheel: Path) -> list[str]:
    return [line.split()[0] for line in sh(sys.executable, "-m", "zipfile", "-l", wheel).splitlines()[1:]]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    wheels = {}
    for dist_name, sources in SOURCES.items():
        src = _source_copy(base / dist_name, sources)
        sh(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", dist, src)
        (wheels[dist_name],) = dist.glob(f"{dist_name}-*.whl")
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    sh(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *wheels.values())
    return Installed(wheels["specops"], _members(wheels["specops"]), _members(wheels["specops_gpusim"]), env_dir, py)


def test_wheels_ship_every_data_file_and_the_product_no_simulator(installed):
    for member in ("operations/templates/launch.sh.j2", "operations/templates/server.service.j2",
                   "operations/remote/probe_gpu.py", "operations/remote/signalling.py", FLAG_TABLE):
        assert member in installed.names, installed.names
    assert "gpusim/nvml_stub.c" in installed.sim_names, installed.sim_names
    assert not [n for n in installed.names if n.startswith("gpusim/") or "gpusim" in n.split("/")[0]], installed.names
    assert not [n for n in installed.sim_names if n.startswith("operations/")], installed.sim_names
    # every data file, whatever joins them
    for data_dir, root, names in (("operations/model/engines/data", REPO, installed.names),
                                  ("simulator/gpusim/engine", REPO / "simulator", installed.sim_names)):
        shipped = {p.relative_to(root).as_posix() for p in (REPO / data_dir).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
        assert shipped and shipped <= set(names), shipped - set(names)


def test_wheel_in_clean_venv_runs_a_deploy_from_elsewhere(installed, tmp_path):
    py = installed.py
    work = tmp_path / "elsewhere"
    work.mkdir()
    host_dir = tmp_path / "host"
    env = installed.env(tmp_path)
    sh(py, "-m", "gpusim", "init", host_dir, "--gpus", "2", "--release-delay", "0.3", cwd=work, env=env)
    held = json.loads(sh(py, "-m", "gpusim", "hold", host_dir, "--gpus", "1", "--mib", "4000", cwd=work, env=env))
    start = proc_start_time(held["pid"])
    try:
        _deploy_from_elsewhere(tmp_path, installed, work, host_dir)
        assert proc_start_time(held["pid"]) is None
    finally:  # stop what this test started, by PID, if the deploy did not
        for pid in (held["pid"], held["watcher"]):
            if proc_start_time(pid) is not None and (pid != held["pid"] or proc_start_time(pid) == start):
                os.kill(pid, signal.SIGKILL)


def _deploy_from_elsewhere(tmp_path, installed, work, host_dir):
    (work / "inv.py").write_text(textwrap.dedent(f"""
        import os, sys
        hosts = [("@local", {{"specops_python": sys.executable, "specops_gpu_devices": "{host_dir}/dev/nvidia*",
                             "_env": {{"PATH": "{host_dir}/bin:" + os.environ["PATH"],
                                      "LD_LIBRARY_PATH": "{host_dir}/lib"}}}})]
    """))
    (work / "deploy.py").write_text(textwrap.dedent("""
        import operations
        from operations import gpu
        from operations.model.render import render

        print("operations from", operations.__file__)
        print(render("launch.sh.j2", name="demo", config_hash="abc", env_file=None,
                     env={"NCCL_DEBUG": "WARN"}, argv=["python3", "-m", "sglang.launch_server", "--model", "a b"]))
        gpu.idle(name="wheel idle", grace_s=1, deadline_s=20)
    """))
    env_dir = installed.env_dir
    out = sh(env_dir / "bin" / "pyinfra", "-y", "inv.py", "deploy.py", cwd=work, env=installed.env(tmp_path))
    assert f"operations from {env_dir}/lib/" in out and "site-packages/operations/__init__.py" in out, out
    assert "exec python3 -m sglang.launch_server --model 'a b'" in out, out
    assert "idle: GPU 0,1 idle after" in out and "stopped by SIGTERM" in out, out


# --- server.running from the installed wheel: a config given by path, and one given as a ServerConfig object ---

SIM_INVENTORY = """
from gpusim.tools import host_data  # the installed simulator's own description of its host

hosts = [("@local", host_data({root!r}))]
"""

BY_PATH = """
from pyinfra import host
from operations import server

server.running(name="wheel: config by path", config=host.data.get("config"))
"""

BY_OBJECT = """
from operations import server
from operations.model.config import ServerConfig, from_mapping

cfg = from_mapping({data!r}, "baseline-llama3.1-8b", source="wheel test deploy")
assert isinstance(cfg, ServerConfig)
server.running(name="wheel: config object", config=cfg)
"""

STOP = """
from operations import server

server.stopped(server_name="llm", port={port}, grace_s=10)
"""


READY_TIMEOUT_S = 30  # a server that never gets ready fails the run well before pyinfra's timeout here


def _settings(name: str) -> dict:
    """configs/NAME.specops.yaml (specops' settings beside the engine file), {} where there is none."""
    sidecar = REPO / "configs" / f"{name}.specops.yaml"
    return (yaml.safe_load(sidecar.read_text()) or {}) if sidecar.exists() else {}


def _config_by_path(work: Path, port: int) -> tuple[str, list[str]]:
    """configs/eagle3-llama3.1-8b.yaml (and its .specops.yaml sidecar, if any) copied into work, on ``port``;
    deploy.py passes its path (--data config=PATH) to server.running."""
    name = "eagle3-llama3.1-8b"
    configs = work / "configs"
    configs.mkdir()
    data = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    data["port"] = port
    if (REPO / "configs" / f"{name}.specops.yaml").exists():
        (configs / f"{name}.specops.yaml").write_text(
            yaml.safe_dump({**_settings(name), "ready_timeout_s": READY_TIMEOUT_S}))
    else:
        data.setdefault("specops", {})["ready_timeout_s"] = READY_TIMEOUT_S
    path = configs / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    (work / "deploy.py").write_text(BY_PATH)
    return "EAGLE3", ["--data", f"config={path}"]


def _config_by_object(work: Path, port: int) -> tuple[str, list[str]]:
    """deploy.py builds the baseline config as a ServerConfig (from_mapping) and passes the object."""
    name = "baseline-llama3.1-8b"
    data = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    data["port"] = port
    data["specops"] = {**_settings(name), **(data.get("specops") or {}), "ready_timeout_s": READY_TIMEOUT_S}
    (work / "deploy.py").write_text(BY_OBJECT.format(data=data))
    return "baseline", []


def _group_members(pgid: int) -> list[int]:
    """Live PIDs whose process group is ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                out.append(int(entry.name))
    return out


@pytest.mark.parametrize("given", [_config_by_path, _config_by_object], ids=["config-by-path", "config-object"])
def test_wheel_converges_a_server_from_elsewhere_then_noop_then_stops_it(installed, tmp_path, given):
    work = tmp_path / "elsewhere"
    work.mkdir()
    host_dir = (tmp_path / "host").resolve()
    env = installed.env(tmp_path)
    sh(installed.py, "-m", "gpusim", "init", host_dir, "--gpus", "2", "--release-delay", "0.3", cwd=work, env=env)
    (work / "inv.py").write_text(SIM_INVENTORY.format(root=str(host_dir)))
    port = free_port()
    (work / "stop.py").write_text(STOP.format(port=port))
    kind, data = given(work, port)
    pyinfra = str(installed.env_dir / "bin" / "pyinfra")

    def converge(*args, deploy="deploy.py"):
        return _run([pyinfra, "-y", "inv.py", deploy, *data, *args], env, work, 180)

    sim = SimHost(host_dir)  # reads DIR/servers/*/state.json; cleanup() stops those servers by PID and start time
    try:
        first = converge()
        assert first.rc == 0 and changed(first) > 0, first
        assert "config confirmed" in first.out and "FileNotFoundError" not in first.out, first
        if kind == "EAGLE3":
            assert re.search(r"avg accept length \d\.\d\d", first.out), first
        (server,) = [s for s in sim.servers() if s.get("status") == "running"]
        assert proc_start_time(server["pid"]) == server["start"]

        again = converge("-v")
        assert again.rc == 0 and changed(again) == 0, again
        assert "healthy" in again.out and re.search(r"No changes", again.out), again
        (same,) = sim.servers()
        assert (same["pid"], same["start"]) == (server["pid"], server["start"])

        stop = converge(deploy="stop.py")
        assert stop.rc == 0 and changed(stop) > 0, stop
        assert proc_start_time(server["pid"]) != server["start"], stop
        assert not _group_members(server.get("pgid") or server["pid"]), stop
        assert not sim.snapshot().procs, stop  # the simulated driver lists no process on any GPU
        stopped_again = converge(deploy="stop.py")
        assert stopped_again.rc == 0 and changed(stopped_again) == 0, stopped_again
    finally:
        sim.cleanup()
