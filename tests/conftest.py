"""Shared fixtures: simulated GPU hosts and a runner for the real pyinfra CLI against them."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

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


def run_pyinfra(sim: SimHost, *args: str, deploy: str = "deploy.py", cwd: Path = REPO, timeout: float = 120) -> Run:
    """``pyinfra -y inventory/sim.py deploy.py ARGS`` against ``sim`` (its root handed over as GPUSIM_ROOT)."""
    argv = [PYINFRA, *([] if "--dry" in args else ["-y"]), str(REPO / "inventory" / "sim.py"), deploy, *args]
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=sim.env(), capture_output=True, text=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0)


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


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
