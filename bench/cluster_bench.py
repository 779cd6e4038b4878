"""Cluster benchmark (needs root): no-op converge against a bare pyinfra deploy and against Ansible, SSH commands
per host, config-switch overhead and controller peak RSS, on N simulated hosts over real SSH, in one run.

    sudo .venv/bin/python bench/cluster_bench.py --hosts 1 2 4 8 [--runs 5] [--write bench/RESULTS.md]

Every figure is the median of ``--runs`` runs. Ratios are against the bare deploy (``bench/bare_deploy.py``: one
``server.shell("true")``) on the same hosts in the same run. The switch alternates baseline and EAGLE-3 configs
and reads, from the lines the host-side transition streams, how long the engine itself took from its start to
its first generation and how long the driver took to release the memory; its overhead is the rest:
``switch - bare deploy - (engine start + release of the slowest host)``, median over the runs. The first switch
to each config also pays the host's SGLang parse (later ones use the verdict the host kept): shown apart. The Ansible figure (ansible-core in ``.venv-ansible``,
installed on first use; ControlPersist and pipelining on, facts off) is a one-task play (``command: true``) on
the same hosts. Targets (issue 15): switch overhead <= 1.0 s, no-op <= 1.1x bare, peak RSS <= 1.3x bare.
"""
from __future__ import annotations

import argparse
import json
import os
import re
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
ANSIBLE_VENV = REPO / ".venv-ansible"
START_S, RELEASE_S = 1.0, 0.5
CONFIGS = ("baseline-llama3.1-8b", "eagle3-llama3.1-8b")
KEEP_ENV = False  # --as-is: keep PYTHONDONTWRITEBYTECODE if the environment sets it
STAMP = re.compile(r"\[(\S+?)\] server\.running: \[\s*([\d.]+)s\] (.*)")


def run(argv: list[str], env: dict) -> tuple[int, float, int, str]:
    """(rc, seconds, peak RSS KiB, output) of one controller run, its modules' bytecode cached as on a user's
    machine (an environment with PYTHONDONTWRITEBYTECODE set recompiles every specops module on every run)."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE" or KEEP_ENV}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), time.monotonic() - t0, usage.ru_maxrss, out


def pyinfra(cluster, deploy: str, *args: str):
    env = {**os.environ, "SPECOPS_CLUSTER": os.path.join(cluster.directory, "cluster.json")}
    return run([PYINFRA, "-y", str(REPO / "inventory" / "cluster_sim.py"), deploy, *args], env)


def host_phases(out: str) -> dict[str, tuple[float, float]]:
    """Per host, (engine start: 'started pid' to 'the server generates', release wait) from the streamed lines."""
    marks: dict[str, dict[str, float]] = {}
    for host, t, text in STAMP.findall(out):
        m = marks.setdefault(host, {})
        if text.startswith("started pid"):
            m["started"] = float(t)
        elif text.startswith("the server generates"):
            m["ready"] = float(t)
        elif text.startswith("waiting for GPU"):
            m["release_from"] = float(t)
        elif text.startswith("GPU memory released"):
            m["released"] = float(t)
    return {h: (m["ready"] - m["started"], m.get("released", 0.0) - m.get("release_from", 0.0))
            for h, m in marks.items() if "ready" in m and "started" in m}


def sessions(cluster) -> list[int]:
    return [Path(n.root, "sshd.log").read_text().count("Starting session:") for n in cluster.nodes]


def ansible_ready() -> Path | None:
    exe = ANSIBLE_VENV / "bin" / "ansible-playbook"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(ANSIBLE_VENV)], check=True)
        subprocess.run([str(ANSIBLE_VENV / "bin" / "pip"), "install", "-q", "ansible-core"], check=False)
    return exe if exe.exists() else None


def ansible_files(cluster, tmp: Path) -> tuple[Path, Path, dict]:
    doc = json.loads(Path(cluster.directory, "cluster.json").read_text())
    lines = ["[sim]"]
    for name, data in doc["hosts"]:
        lines.append(f"{name} ansible_user={data['ssh_user']} ansible_port={data['ssh_port']} "
                     f"ansible_ssh_private_key_file={data['ssh_key']} ansible_python_interpreter=/usr/bin/python3")
    known = doc["hosts"][0][1]["ssh_known_hosts_file"]
    (tmp / "hosts.ini").write_text("\n".join(lines) + "\n")
    (tmp / "ansible.cfg").write_text(
        "[defaults]\ngathering = explicit\nhost_key_checking = True\nforks = 64\ninterpreter_python = /usr/bin/python3\n"
        "[ssh_connection]\npipelining = True\n"
        f"ssh_args = -o ControlMaster=auto -o ControlPersist=60s -o UserKnownHostsFile={known} "
        f"-o StrictHostKeyChecking=yes\ncontrol_path_dir = {tmp}/cp\n")
    (tmp / "noop.yml").write_text("- hosts: sim\n  gather_facts: false\n  tasks:\n"
                                  "    - ansible.builtin.command: \"true\"\n      changed_when: false\n")
    return tmp / "hosts.ini", tmp / "noop.yml", {**os.environ, "ANSIBLE_CONFIG": str(tmp / "ansible.cfg")}


def measure(n: int, runs: int, ansible: Path | None, switch: bool = True) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = SimCluster.up(Path(tmp) / "c", n, 4, server_start_s=START_S, release_delay_s=RELEASE_S)
        try:
            first = pyinfra(cluster, "deploy.py", "--data", f"config={CONFIGS[1]}")
            assert first[0] == 0, "first converge failed:\n" + first[3][-3000:]
            row: dict = {"n": n, "failed_starts": 0}
            before = sessions(cluster)
            noop, bare = [], []
            for _ in range(runs):  # interleaved, so drift in the machine's load weighs on both alike
                noop.append(pyinfra(cluster, "deploy.py", "--data", f"config={CONFIGS[1]}"))
                assert noop[-1][0] == 0, noop[-1][3][-3000:]
                bare.append(pyinfra(cluster, "bench/bare_deploy.py"))
                assert bare[-1][0] == 0, bare[-1][3][-3000:]
            row["ssh"] = (max(b - a for a, b in zip(before, sessions(cluster))) - runs) / runs  # less bare's one
            row.update(noop=statistics.median(r[1] for r in noop), bare=statistics.median(r[1] for r in bare),
                       rss_noop=max(r[2] for r in noop), rss_bare=max(r[2] for r in bare))
            switches, engine, release, held = [], [], [], []
            for i in range(runs if switch else 0):
                rc, t, _, out = pyinfra(cluster, "deploy.py", "--data", f"config={CONFIGS[i % 2]}")
                phases = host_phases(out)
                if rc != 0 or len(phases) != n:
                    row["failed_starts"] += 1
                    print(out[-3000:], file=sys.stderr)
                    continue
                switches.append(t)
                # the slowest host bounds the run: its own engine start plus release is what nobody can cut
                slowest = max(phases.values(), key=sum)
                engine.append(slowest[0])
                release.append(slowest[1])
                held.append(sum(slowest))
                if i == 0:  # the first switch to this config: the host's engine parses it (later ones: kept)
                    row["cold_over"] = t - statistics.median(r[1] for r in bare) - sum(slowest)
            if switches:
                row.update(switch=statistics.median(switches), engine=statistics.median(engine),
                           release=statistics.median(release), held=statistics.median(held),
                           over=statistics.median(t - row["bare"] - h for t, h in zip(switches, held)))
            if ansible:
                inv, play, env = ansible_files(cluster, Path(tmp))
                (Path(tmp) / "cp").mkdir(exist_ok=True)
                warm = run([str(ansible), "-i", str(inv), str(play)], env)  # opens the ControlPersist masters
                assert warm[0] == 0, warm[3][-2000:]
                row["ansible"] = statistics.median(run([str(ansible), "-i", str(inv), str(play)], env)[1]
                                                   for _ in range(runs))
            return row
        finally:
            cluster.down()


def table(rows: list[dict], command: str, runs: int) -> str:
    out = [f"Command: `{command}` (stand-in start {START_S} s, release delay {RELEASE_S} s; medians of {runs} "
           f"runs; machine: {os.cpu_count()} CPUs, {_mem_gib():.0f} GiB, every simulated host on it; controller bytecode: "
           f"{'as the environment has it' if KEEP_ENV else 'cached, PYTHONDONTWRITEBYTECODE unset'})", "",
           "| hosts | no-op converge | bare deploy | no-op ratio | Ansible no-op (ratio to bare) | SSH cmds/host "
           "(no-op) | switch total | engine start + release (host-measured) | switch overhead | first switch to "
           "a config: overhead | failed starts | peak RSS (ratio) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ans = f"{r['ansible']:.2f} s ({r['ansible'] / r['bare']:.2f}x)" if "ansible" in r else "not measured"
        if "switch" in r:
            cold = f"{r['cold_over']:.2f} s" if "cold_over" in r else "-"
            sw = f"{r['switch']:.2f} s | {r['engine']:.2f} + {r['release']:.2f} s | {r['over']:.2f} s | {cold}"
        else:
            sw = "- | - | - | -"
        out.append(f"| {r['n']} | {r['noop']:.2f} s | {r['bare']:.2f} s | {r['noop'] / r['bare']:.2f}x | {ans} | "
                   f"{r['ssh']:.0f} | {sw} | {r['failed_starts']} | {r['rss_noop'] / 1024:.0f} MiB "
                   f"({r['rss_noop'] / r['rss_bare']:.2f}x) |")
    return "\n".join(out) + "\n"


def _mem_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--no-ansible", action="store_true")
    p.add_argument("--switch-upto", type=int, default=None, metavar="N",
                   help="measure switches only up to N hosts (larger N: no-op, bare deploy and RSS only)")
    p.add_argument("--as-is", action="store_true", help="keep PYTHONDONTWRITEBYTECODE from the environment")
    p.add_argument("--write", type=Path, help="write the table into this file (replacing it)")
    a = p.parse_args()
    command = "sudo .venv/bin/python bench/cluster_bench.py " + " ".join(sys.argv[1:])
    global KEEP_ENV
    KEEP_ENV = a.as_is
    ansible = None if a.no_ansible else ansible_ready()
    rows = []
    for n in a.hosts:  # each row said as soon as it is measured: a later failure keeps the earlier ones
        rows.append(measure(n, a.runs, ansible, a.switch_upto is None or n <= a.switch_upto))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    text = table(rows, command, a.runs)
    print(text)
    if a.write:
        a.write.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
