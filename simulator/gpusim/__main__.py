"""``python -m gpusim``: create a simulated GPU host and put memory-holding processes on it.

    python -m gpusim init DIR [--gpus 8] [--mib 143771] [--release-delay 2] [--mig 3] [--no-nvml]
    python -m gpusim hold DIR --gpus 0,1 --mib 70000 [--on-term exit|ignore] [--user nobody]
                               [--name nvidia-persistenced] [--stuck] [--release-delay S]
                               [--no-device-fds] [--report-pid N] [--pin-child]
    python -m gpusim gpu DIR --index 0 --memory ok|na|noperm   # memory unreadable: [N/A] (GB10) / no permission
    python -m gpusim ls DIR          # the ledger as JSON
    python -m gpusim reset DIR       # free every allocation (the simulator's GPU reset)
    python -m gpusim driver DIR load|unload
    python -m gpusim env DIR         # shell exports that make this host's GPUs visible
    python -m gpusim cluster up DIR [--hosts 3] [--gpus 4] [--server-start 1] [--release-delay 0.5]   # root
    python -m gpusim cluster down DIR

``init`` writes DIR/bin/nvidia-smi and DIR/bin/gpusim-snapshot (bound to DIR and this Python), DIR/bin/python (this
Python with the host's stand-in SGLang: ``DIR/bin/python -m sglang.launch_server ...``; host.json
``sglang_version`` and ``sglang_removed_flags`` make it an older release), the device-file stand-ins
DIR/dev/nvidia0..N-1, nvidiactl and nvidia-uvm, and, unless --no-nvml, builds DIR/lib/libnvidia-ml.so.1 with gcc.
Put DIR/bin first on PATH and DIR/lib on LD_LIBRARY_PATH.

``hold`` prints {"pid", "watcher", "pgid"} (with --pin-child also "pin_pid", "pin_start"). The holder keeps DIR/dev's
files for its GPUs open unless --no-device-fds; --report-pid N makes the driver list it as PID N (a driver seen
from another PID namespace); --pin-child forks an unlisted child in its own session that inherits the device files,
so the memory stays allocated after the holder dies until that child dies too (then the release delay).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from . import holder, ledger
from .host import SimHost
from .tools import host_env, install_tools

def _gpu_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpusim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    i.add_argument("root", type=Path)
    i.add_argument("--gpus", type=int, default=8)
    i.add_argument("--mib", type=int, default=ledger.H200_MIB)
    i.add_argument("--name", default="NVIDIA H200")
    i.add_argument("--release-delay", type=float, default=ledger.DEFAULT_RELEASE_DELAY_S)
    i.add_argument("--mig", type=_gpu_list, default=[], help="GPU indices in MIG mode (per-process memory [N/A])")
    i.add_argument("--base-mib", type=int, default=0, help="memory each GPU reports used when idle")
    i.add_argument("--no-nvml", action="store_true", help="do not build the libnvidia-ml.so.1 stand-in")
    h = sub.add_parser("hold")
    h.add_argument("root", type=Path)
    h.add_argument("--gpus", type=_gpu_list, required=True)
    h.add_argument("--mib", type=int, required=True, help="MiB held on each listed GPU")
    h.add_argument("--name", default="python3")
    h.add_argument("--on-term", choices=holder.TERM_MODES, default="exit")
    h.add_argument("--user")
    h.add_argument("--stuck", action="store_true", help="memory is never released after the process dies")
    h.add_argument("--release-delay", type=float)
    h.add_argument("--no-device-fds", action="store_true", help="hold memory but open no device file")
    h.add_argument("--report-pid", type=int, help="the PID the driver lists for this allocation")
    h.add_argument("--pin-child", action="store_true",
                   help="an unlisted child (own session) keeps the device files and the memory after the holder dies")
    g = sub.add_parser("gpu", help="change one GPU's settings in host.json")
    g.add_argument("root", type=Path)
    g.add_argument("--index", type=int, required=True)
    g.add_argument("--memory", choices=ledger.MEMORY_MODES, required=True,
                   help="ok; na: memory not reported ([N/A], NVML NOT_SUPPORTED); noperm: [Insufficient Permissions]")
    for name in ("ls", "reset"):
        sub.add_parser(name).add_argument("root", type=Path)
    d = sub.add_parser("driver")
    d.add_argument("root", type=Path)
    d.add_argument("state", choices=("load", "unload"))
    sub.add_parser("env").add_argument("root", type=Path)
    c = sub.add_parser("cluster", help="K simulated hosts in network namespaces, each with sshd (needs root)")
    c.add_argument("action", choices=("up", "down"))
    c.add_argument("root", type=Path)
    c.add_argument("--hosts", type=int, default=3)
    c.add_argument("--gpus", type=int, default=4)
    c.add_argument("--server-start", type=float, default=1.0, help="the stand-in server's load time (s)")
    c.add_argument("--release-delay", type=float, default=0.5)
    a = p.parse_args(argv)
    if a.cmd == "cluster":
        return _cluster(a)
    root = a.root.resolve()
    if a.cmd == "init":
        ledger.init_host(root, a.gpus, a.mib, a.name, a.release_delay, tuple(a.mig), a.base_mib)
        install_tools(root, nvml=not a.no_nvml)
        print(f"simulated host at {root}: {a.gpus} x {a.name} ({a.mib} MiB), release delay {a.release_delay}s")
    elif a.cmd == "hold":
        try:
            info = holder.hold(root, {g: a.mib for g in a.gpus}, name=a.name, on_term=a.on_term, user=a.user,
                               stuck=a.stuck, release_delay_s=a.release_delay, device_fds=not a.no_device_fds,
                               report_pid=a.report_pid, pin_child=a.pin_child)
        except ledger.OutOfMemory as exc:
            print(f"gpusim: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(info))
    elif a.cmd == "gpu":
        try:
            SimHost(root).configure_gpu(a.index, memory=a.memory)
        except ValueError as exc:
            print(f"gpusim: {exc}", file=sys.stderr)
            return 2
    elif a.cmd == "ls":
        print(json.dumps(ledger.snapshot(root).asdict(), indent=2))
    elif a.cmd == "reset":
        print(f"released {ledger.release_all(root)} allocation(s)")
    elif a.cmd == "driver":
        SimHost(root).set_driver(a.state == "load")
    elif a.cmd == "env":
        env = host_env(root)
        print(f"export PATH={shlex.quote(env['PATH'])}:\"$PATH\"")
        print(f"export LD_LIBRARY_PATH={shlex.quote(env['LD_LIBRARY_PATH'])}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
    return 0


def _cluster(a) -> int:
    from .cluster import ClusterError, SimCluster

    root = a.root.resolve()
    try:
        if a.action == "up":
            cluster = SimCluster.up(root, a.hosts, a.gpus, server_start_s=a.server_start,
                                    release_delay_s=a.release_delay)
            print(f"{len(cluster.nodes)} simulated hosts up: {', '.join(n.address for n in cluster.nodes)} "
                  f"({cluster.gpus} GPUs each); inventory: SPECOPS_CLUSTER={root / 'cluster.json'} "
                  f"pyinfra inventory/cluster_sim.py ...")
        else:
            problems = SimCluster.load(root).down()
            print("\n".join(problems) or "cluster down: every host stopped, namespaces and bridge removed")
            return 1 if problems else 0
    except (ClusterError, FileNotFoundError) as exc:
        print(f"gpusim cluster: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
