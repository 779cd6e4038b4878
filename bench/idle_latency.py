"""How soon after the simulated driver releases memory does gpu.idle finish?  (Target: within 0.25 s.)

    .venv/bin/python bench/idle_latency.py [--runs 5] [--delay 2.0] [--nvml | --no-nvml]

Each run: a fresh simulated host, a holder on GPUs 0-1, then ``pyinfra -y`` runs gpu.idle followed by a
python.call that stamps the time. The driver frees memory at (holder death + release delay), read from the
ledger; latency = stamp - release. Printed against two baselines measured in the same run: one bare probe
round trip (the floor for any read-based check), and the seed routine's fixed ``sleep 5`` after the kill.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "simulator")]  # the product and its simulator (specops-gpusim)

from gpusim.host import SimHost  # noqa: E402

DEPLOY = """
import time
from pyinfra.operations import python
from operations import gpu

def stamp():
    open({stamp!r}, "w").write(repr(time.time()))

gpu.idle(name="idle", grace_s=10, deadline_s=30)
python.call(name="stamp", function=stamp)
"""


def dead_at(root: Path, timeout: float = 30) -> float:
    """The moment the watcher recorded the holder's death (before the entry is freed)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for path in (root / "ledger").glob("*.json"):
            try:
                entry = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if entry.get("dead_at"):
                return entry["dead_at"]
        time.sleep(0.005)
    raise TimeoutError("holder never died")


def probe_round_trip(sim: SimHost) -> float:
    from operations.controller.remote import python_script

    cmd = shlex.split(python_script(sys.executable, "probe_gpu.py").get_raw_value())
    t0 = time.monotonic()
    subprocess.run(cmd, env=sim.env(), capture_output=True, check=True)
    return time.monotonic() - t0


def one_run(tmp: Path, delay: float, nvml: bool) -> tuple[float, float]:
    sim = SimHost.create(tmp / "host", 2, nvml=nvml, release_delay_s=delay)
    try:
        sim.hold([0, 1], 60000)
        stamp = tmp / "stamp"
        (tmp / "deploy.py").write_text(DEPLOY.format(stamp=str(stamp)))
        proc = subprocess.Popen([str(Path(sys.executable).with_name("pyinfra")), "-y", str(REPO / "inventory" / "sim.py"),
                                 str(tmp / "deploy.py")], cwd=tmp, env=sim.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        released = dead_at(sim.root) + delay
        out, _ = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(out)
        return float(stamp.read_text()) - released, probe_round_trip(sim)
    finally:
        sim.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--delay", type=float, default=2.0)
    ap.add_argument("--no-nvml", dest="nvml", action="store_false")
    a = ap.parse_args()
    lat, rtt = [], []
    for i in range(a.runs):
        with tempfile.TemporaryDirectory() as tmp:
            latency, round_trip = one_run(Path(tmp), a.delay, a.nvml)
        lat.append(latency)
        rtt.append(round_trip)
        print(f"run {i + 1}: finished {latency:+.3f}s after the driver released memory (probe round trip {round_trip:.3f}s)")
    med, worst, probe = statistics.median(lat), max(lat), statistics.median(rtt)
    seed_wait = 5.0 - a.delay  # `sleep 5` after the kill: seconds wasted past the release (or too early if < 0)
    print(f"\nsource: {'pynvml (libnvidia-ml stand-in)' if a.nvml else 'nvidia-smi stand-in'}; release delay {a.delay}s")
    print(f"release -> gpu.idle done: median {med:.3f}s, worst {worst:.3f}s (target <= 0.25s: "
          f"{'met' if worst <= 0.25 else 'NOT met'})")
    print(f"baseline, one bare probe round trip: {probe:.3f}s -> ratio worst/probe = {worst / probe:.2f}x")
    print(f"baseline, seed routine `sleep 5`: {seed_wait:+.3f}s past release -> ratio worst/seed = "
          f"{worst / seed_wait:.2f}x" if seed_wait > 0 else "seed routine would start too early (OOM)")


if __name__ == "__main__":
    main()
