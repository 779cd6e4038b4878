"""``python -m gpusim``: create a simulated GPU host and put memory-holding processes on it.

    python -m gpusim init DIR [--gpus 8] [--mib 143771] [--release-delay 2] [--mig 3] [--no-nvml]
    python -m gpusim hold DIR --gpus 0,1 --mib 70000 [--on-term exit|ignore] [--user nobody]
                               [--name nvidia-persistenced] [--stuck] [--release-delay S]
    python -m gpusim ls DIR          # the ledger as JSON
    python -m gpusim reset DIR       # free every allocation (the simulator's GPU reset)
    python -m gpusim driver DIR load|unload
    python -m gpusim env DIR         # shell exports that make this host's GPUs visible

``init`` writes DIR/bin/nvidia-smi and DIR/bin/gpusim-snapshot (bound to DIR and this Python) and, unless
--no-nvml, builds DIR/lib/libnvidia-ml.so.1 with gcc. Put DIR/bin first on PATH and DIR/lib on LD_LIBRARY_PATH.
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
    for name in ("ls", "reset"):
        sub.add_parser(name).add_argument("root", type=Path)
    d = sub.add_parser("driver")
    d.add_argument("root", type=Path)
    d.add_argument("state", choices=("load", "unload"))
    sub.add_parser("env").add_argument("root", type=Path)
    a = p.parse_args(argv)
    root = a.root.resolve()
    if a.cmd == "init":
        ledger.init_host(root, a.gpus, a.mib, a.name, a.release_delay, tuple(a.mig), a.base_mib)
        install_tools(root, nvml=not a.no_nvml)
        print(f"simulated host at {root}: {a.gpus} x {a.name} ({a.mib} MiB), release delay {a.release_delay}s")
    elif a.cmd == "hold":
        try:
            info = holder.hold(root, {g: a.mib for g in a.gpus}, name=a.name, on_term=a.on_term, user=a.user,
                               stuck=a.stuck, release_delay_s=a.release_delay)
        except ledger.OutOfMemory as exc:
            print(f"gpusim: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(info))
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


if __name__ == "__main__":
    sys.exit(main())
