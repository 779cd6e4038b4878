"""Shared fixtures: simulated GPU hosts and a runner for the real pyinfra CLI against them."""
from __future__ import annotations

import os
import shutil
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpusim.host import SimHost



REPO = Path(__file__).resolve().parent.parent
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


@dataclass
class Run:
    rc: int
    out: str
    seconds: float

    def __repr__(self) -> str:  # shown by pytest when an assertion fails
        return f"rc={self.rc} after {self.seconds:.2f}s\n{self.out}"


def changed(run: Run) -> int:
    """Operations that changed something, summed over hosts: the 'Success' column of pyinfra's grand total row."""
    row = re.search(r"Grand total\s+\d+\s+(\S+)\s+(\S+)\s+(\S+)", run.out)
    assert row, run
    return 0 if row.group(1) == "-" else int(row.group(1))


def pyinfra_argv(inventory: str, deploy: str, args) -> list[str]:
    return [PYINFRA, *([] if "--dry" in args else ["-y"]), str(REPO / "inventory" / inventory), deploy, *args]


def _run(argv: list[str], env: dict, cwd: Path, timeout: float) -> Run:
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0)


def run_pyinfra(sim: SimHost, *args: str, deploy: str = "deploy.py", cwd: Path = REPO, timeout: float = 120) -> Run:
    """``pyinfra -y inventory/sim.py deploy.py ARGS`` against ``sim`` (its root handed over as GPUSIM_ROOT)."""
    return _run(pyinfra_argv("sim.py", deploy, args), sim.env(), cwd, timeout)


def cluster_env(cluster) -> dict:
    return {**os.environ, "SPECOPS_CLUSTER": os.path.join(cluster.directory, "cluster.json")}


def run_cluster(cluster, *args: str, deploy: str = "deploy.py", timeout: float = 180) -> Run:
    """``pyinfra -y inventory/cluster_sim.py deploy.py ARGS`` against the simulated cluster, over SSH."""
    return _run(pyinfra_argv("cluster_sim.py", deploy, args), cluster_env(cluster), REPO, timeout)


@pytest.fixture
def sim(tmp_path):
    """A fresh 4-GPU simulated host (with the libnvidia-ml stand-in) and a short release delay."""
    host = SimHost.create(tmp_path / "host", 4, release_delay_s=0.5)
    yield host
    host.cleanup()


@pytest.fixture
def sim_smi_only(tmp_path):
    """A simulated host without libnvidia-ml: the probe must fall back to nvidia-smi."""
    host = SimHost.create(tmp_path / "host", 4, nvml=False, release_delay_s=0.5)
    yield host
    host.cleanup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server_sim(sim):
    sim.configure(server_start_s=0.4)
    return sim


def shipped(name: str) -> dict:
    """A shipped config as one mapping: its engine file with its specops settings (``NAME.specops.yaml``) as the
    ``specops:`` section, the single-file form tests write into their own directories."""
    data = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    sidecar = REPO / "configs" / f"{name}.specops.yaml"
    if sidecar.exists():
        data["specops"] = {**yaml.safe_load(sidecar.read_text()), **(data.get("specops") or {})}
    data.setdefault("specops", {})
    return data


@pytest.fixture
def configs(tmp_path):
    """The shipped configs, copied with a free port (tests never share a port with anything else)."""
    port = free_port()
    out = {}
    shutil.copytree(REPO / "configs" / "adaptive", tmp_path / "adaptive")  # tables the adaptive configs ship
    for name in ("eagle3-llama3.1-8b", "baseline-llama3.1-8b", "eagle3-adaptive-llama3.1-8b",
                 "eagle3-adaptive-tuned-llama3.1-8b"):
        data = shipped(name)
        data["port"] = port
        data["specops"]["ready_timeout_s"] = 30
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        out[name] = path
    out["port"] = port
    return out


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.fixture
def make_cluster(tmp_path):
    """``make_cluster(k, **settings)``: a simulated K-host cluster (netns + sshd each), torn down after the test
    (every host's init stopped by PID, namespaces and bridge removed), also when the test fails."""
    from gpusim.cluster import SimCluster

    clusters = []

    def make(hosts: int, gpus: int = 4, **settings):
        cluster = SimCluster.up(tmp_path / f"cluster{len(clusters)}", hosts, gpus, **settings)
        clusters.append(cluster)
        return cluster

    yield make
    problems = [p for c in clusters for p in c.down()]
    assert not problems, problems
