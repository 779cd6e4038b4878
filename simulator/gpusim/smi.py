"""Stand-in ``nvidia-smi``: the query forms and the default table, in the real tool's output formats."""
from __future__ import annotations

import os
import sys
import time

from . import ledger

NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.\n")
NA = "[N/A]"
NOT_FOUND = "[Not Found]"
# What --query-gpu prints for memory.* when the driver does not report it (unified-memory GB10) or the caller may
# not read it (unprivileged container on a MIG GPU), and what the default table shows in its Memory-Usage column.
MEMORY_TOKEN = {"na": NA, "noperm": "[Insufficient Permissions]"}
MEMORY_CELL = {"na": "Not Supported", "noperm": "N/A"}
NVML_MEMORY_RC = {"ok": 0, "na": 3, "noperm": 4}  # NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION


def _memory(g: ledger.GpuRecord, mib: int) -> str:
    return MEMORY_TOKEN.get(g.memory) or str(mib)


def _gpu_fields(g: ledger.GpuRecord, snap: ledger.Snapshot) -> dict[str, tuple[str, str]]:
    """field -> (value, unit) for --query-gpu."""
    return {
        "index": (str(g.index), ""),
        "uuid": (g.uuid, ""),
        "name": (g.name, ""),
        "gpu_name": (g.name, ""),
        "pci.bus_id": (g.bus_id, ""),
        "gpu_bus_id": (g.bus_id, ""),
        "driver_version": (snap.driver, ""),
        "count": (str(len(snap.gpus)), ""),
        "memory.total": (_memory(g, g.total_mib), "MiB"),
        "memory.used": (_memory(g, g.used_mib), "MiB"),
        "memory.free": (_memory(g, g.total_mib - g.used_mib), "MiB"),
        "memory.reserved": (_memory(g, 0), "MiB"),
        "mig.mode.current": ("Enabled" if g.mig else "Disabled", ""),
        "utilization.gpu": (NA if g.mig else ("100" if g.used_mib > 1024 else "0"), "%"),
        "temperature.gpu": ("31", ""),
        "persistence_mode": ("Enabled", ""),
    }


def _app_fields(p: ledger.ProcRecord, g: ledger.GpuRecord) -> dict[str, tuple[str, str]]:
    mem = NA if p.used_mib is None else str(p.used_mib)
    name = NOT_FOUND if p.name is None else p.name
    return {
        "pid": (str(p.pid), ""),
        "process_name": (name, ""),
        "name": (name, ""),
        "used_gpu_memory": (mem, "MiB"),
        "used_memory": (mem, "MiB"),
        "gpu_uuid": (g.uuid, ""),
        "gpu_bus_id": (g.bus_id, ""),
        "gpu_name": (g.name, ""),
        "timestamp": (time.strftime("%Y/%m/%d %H:%M:%S.000"), ""),
    }


def _csv(rows: list[dict], fields: list[str], fmt: set[str], out) -> int:
    if rows:
        unknown = [f for f in fields if f not in rows[0]]
        if unknown:
            out.write(f'Field "{unknown[0]}" is not a valid field to query.\n\n')
            return 2
    if "noheader" not in fmt:
        out.write(", ".join(
            f"{f} [{rows[0][f][1]}]" if rows and rows[0][f][1] and "nounits" not in fmt else f
            for f in fields) + "\n")
    for row in rows:
        vals = []
        for f in fields:
            value, unit = row[f]
            # a bracketed token ([N/A], [Insufficient Permissions]) stands alone; the header keeps the unit
            vals.append(value if not unit or "nounits" in fmt or value.startswith("[") else f"{value} {unit}")
        out.write(", ".join(vals) + "\n")
    return 0


def _table(snap: ledger.Snapshot, out) -> None:
    w = out.write
    w(time.strftime("%a %b %d %H:%M:%S %Y") + "\n")
    w("+-----------------------------------------------------------------------------------------+\n")
    cuda = f"{snap.cuda // 1000}.{snap.cuda % 1000 // 10}"
    w(f"| NVIDIA-SMI {snap.driver:<23}Driver Version: {snap.driver:<15}CUDA Version: {cuda:<9}|\n")
    w("|-----------------------------------------+------------------------+----------------------+\n")
    w("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n")
    w("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n")
    w("|                                         |                        |               MIG M. |\n")
    w("|=========================================+========================+======================|\n")
    for g in snap.gpus:
        mem = _memory_cell(g)
        util = "N/A" if g.mig else ("100%" if g.used_mib > 1024 else "0%")
        w(f"| {g.index:>3}  {g.name[:20]:<20}           On  | {g.bus_id:>18} Off | {'0':>20} |\n")
        w(f"| N/A   31C    P0             75W /  700W | {mem:>22} | {util:>7}      Default |\n")
        w(f"|                                         |                        | {'Enabled' if g.mig else 'Disabled':>20} |\n")
        w("+-----------------------------------------+------------------------+----------------------+\n")
    w("\n+-----------------------------------------------------------------------------------------+\n")
    w("| Processes:                                                                              |\n")
    w("|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |\n")
    w("|        ID   ID                                                               Usage      |\n")
    w("|=========================================================================================|\n")
    if not snap.procs:
        w("|  No running processes found                                                             |\n")
    for p in snap.procs:
        mem = "N/A" if p.used_mib is None else f"{p.used_mib}MiB"
        name = NOT_FOUND if p.name is None else p.name
        w(f"| {p.gpu_index:>4}   N/A  N/A  {p.pid:>9}      C   {name[:40]:<40} {mem:>10} |\n")
    w("+-----------------------------------------------------------------------------------------+\n")


def _memory_cell(g: ledger.GpuRecord) -> str:
    """The Memory-Usage cell: 'Not Supported' left-aligned (GB10), 'N/A' right-aligned (MIG without permission)."""
    if g.memory == "na":
        return f"{MEMORY_CELL['na']:<22}"
    if g.memory == "noperm":
        return f"{MEMORY_CELL['noperm']:>22}"
    return f"{g.used_mib}MiB / {g.total_mib:>6}MiB"


def _parse_args(argv: list[str]) -> dict:
    opts: dict = {"ids": None}
    it = iter(argv)
    for arg in it:
        key, _, val = arg.partition("=")
        if key in ("--query-gpu", "--query-compute-apps", "--format") and not val:
            val = next(it, "")
        if key in ("-i", "--id"):
            opts["ids"] = {int(x) for x in (val or next(it, "")).split(",")}
        elif key in ("--query-gpu", "--query-compute-apps", "--format"):
            opts[key] = [v.strip() for v in val.split(",") if v.strip()]
        elif key in ("-L", "--list-gpus"):
            opts["list"] = True
        else:
            opts.setdefault("unknown", arg)
    return opts


def main(argv: list[str], out=sys.stdout, err=sys.stderr) -> int:
    root = os.environ.get("GPUSIM_ROOT", "")
    try:
        snap = ledger.snapshot(root)
    except ledger.NoDriver:
        out.write(NO_DRIVER)
        return 9
    opts = _parse_args(argv)
    if "unknown" in opts:
        err.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
        return 2
    if not snap.gpus:
        out.write("No devices were found\n")
        return 6
    gpus = [g for g in snap.gpus if opts["ids"] is None or g.index in opts["ids"]]
    fmt = set(opts.get("--format", []))
    if "--query-gpu" in opts:
        return _csv([_gpu_fields(g, snap) for g in gpus], opts["--query-gpu"], fmt, out)
    if "--query-compute-apps" in opts:
        by_index = {g.index: g for g in gpus}
        rows = [_app_fields(p, by_index[p.gpu_index]) for p in snap.procs if p.gpu_index in by_index]
        if not rows:  # validate field names even with no processes, as the real tool does
            probe = _app_fields(ledger.ProcRecord(0, 0, 0, ""), snap.gpus[0])
            bad = [f for f in opts["--query-compute-apps"] if f not in probe]
            if bad:
                out.write(f'Field "{bad[0]}" is not a valid field to query.\n\n')
                return 2
        return _csv(rows, opts["--query-compute-apps"], fmt, out)
    if opts.get("list"):
        for g in gpus:
            out.write(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n")
        return 0
    shown = {g.index for g in gpus}
    _table(ledger.Snapshot(snap.driver, snap.cuda, gpus, [p for p in snap.procs if p.gpu_index in shown]), out)
    return 0


def snapshot_main(out=sys.stdout) -> int:
    """``gpusim-snapshot``: the ledger in the tab-separated form the libnvidia-ml stand-in reads."""
    try:
        snap = ledger.snapshot(os.environ.get("GPUSIM_ROOT", ""))
    except ledger.NoDriver as exc:
        sys.stderr.write(f"{exc}\n")
        return 9
    mib = 1024 * 1024
    out.write(f"driver\t{snap.driver}\t{snap.cuda}\n")
    for g in snap.gpus:  # the last field: what nvmlDeviceGetMemoryInfo returns (an NVML return code)
        out.write(f"gpu\t{g.index}\t{g.uuid}\t{g.name}\t{g.total_mib * mib}\t{g.used_mib * mib}\t{int(g.mig)}"
                  f"\t{NVML_MEMORY_RC.get(g.memory, 0)}\n")
    for p in snap.procs:  # an empty name: no local process has that PID (NVML answers NOT_FOUND)
        used = "NA" if p.used_mib is None else p.used_mib * mib
        out.write(f"proc\t{p.gpu_index}\t{p.pid}\t{used}\t{p.name or ''}\n")
    return 0
