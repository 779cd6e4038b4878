"""Cluster benchmark (needs root): P1 no-op converge vs a bare pyinfra deploy, P3 SSH commands per host,
P4 config-switch overhead, P5 controller peak RSS, on N simulated hosts over real SSH, measured in one run.

    sudo .venv/bin/python bench/cluster_bench.py --hosts 1 8 32 [--runs 3] [--write bench/RESULTS.md]

Prints a markdown table; ratios are against the bare deploy (``bench/bare_deploy.py``: one ``server.shell("true")``)
on the same hosts in the same run. Targets: P1 <= 1.5x, P3 <= 3, P4 <= 1.5 s.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "simulator")]  # the product and its simulator (specops-gpusim)
from gpusim.cluster import SimCluster  # noqa: E402

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
START_S, RELEASE_S = 1.0, 0.5


def pyinfra(cluster, deploy: str, *args: str) -> tuple[int, float, int]:
    """(rc, seconds, peak RSS KiB) of one pyinfra run."""
    env = {**os.environ, "SPECOPS_CLUSTER": os.path.join(cluster.directory, "cluster.json")}
    t0 = time.monotonic()
    proc = subprocess.Popen([PYINFRA, "-y", str(REPO / "inventory" / "cluster_sim.py"), deploy, *args], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), time.monotonic() - t0, usage.ru_maxrss


def sessions(cluster) -> list[int]:
    return [Path(n.root, "sshd.log").read_text().count("Starting session:") for n in cluster.nodes]


def measure(n: int, runs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = SimCluster.up(Path(tmp), n, 4, server_start_s=START_S, release_delay_s=RELEASE_S)
        try:
            assert pyinfra(cluster, "deploy.py")[0] == 0, "first converge failed"
            noop, bare, rss_noop, rss_bare = [], [], [], []
            before = sessions(cluster)
            for _ in range(runs):
                rc, t, rss = pyinfra(cluster, "deploy.py")
                assert rc == 0
                noop.append(t), rss_noop.append(rss)
            per_host = max(b - a for a, b in zip(before, sessions(cluster))) / runs
            for _ in range(runs):
                rc, t, rss = pyinfra(cluster, "bench/bare_deploy.py")
                assert rc == 0
                bare.append(t), rss_bare.append(rss)
            rc, switch, _ = pyinfra(cluster, "deploy.py", "--data", "config=baseline-llama3.1-8b")
            return {"n": n, "noop": statistics.median(noop), "bare": statistics.median(bare), "ssh": per_host,
                    "switch": switch, "switch_ok": rc == 0, "rss_noop": max(rss_noop), "rss_bare": max(rss_bare)}
        finally:
            cluster.down()


def table(rows: list[dict], command: str) -> str:
    out = [f"Command: `{command}` (stand-in start {START_S} s, release delay {RELEASE_S} s)", "",
           "| hosts | P1 no-op converge | bare deploy | P1 ratio | P3 SSH cmds/host | P4 switch total | "
           "P4 overhead | P5 peak RSS (ratio) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        overhead = r["switch"] - START_S - RELEASE_S
        out.append(f"| {r['n']} | {r['noop']:.2f} s | {r['bare']:.2f} s | {r['noop'] / r['bare']:.2f}x | "
                   f"{r['ssh']:.0f} | {r['switch']:.2f} s{'' if r['switch_ok'] else ' (FAILED)'} | "
                   f"{overhead:.2f} s | {r['rss_noop'] / 1024:.0f} MiB ({r['rss_noop'] / r['rss_bare']:.2f}x) |")
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--write", type=Path)
    a = p.parse_args()
    command = "sudo .venv/bin/python bench/cluster_bench.py " + " ".join(sys.argv[1:])
    text = table([measure(n, a.runs) for n in a.hosts], command)
    print(text)
    if a.write:
        a.write.write_text("# Cluster benchmark results\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
