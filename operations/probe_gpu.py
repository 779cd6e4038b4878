"""Remote GPU probe: run on the target host as ``python3 -c <this file> [--no-nvml]``; prints one JSON document.

Standard library only (pynvml is used when the host's Python has it). Sources, in order: pynvml, then
``nvidia-smi`` CSV (returned raw; the controller parses it). Each GPU process is enriched from /proc: user,
cmdline, comm, process group, session and start time (to guard signals against PID reuse), and the members of
its process group (so a group is only signalled when every member may be).
"""
import json
import os
import pwd
import subprocess
import sys

GPU_QUERY = "index,uuid,name,memory.used,memory.total"
APP_QUERY = "pid,process_name,used_gpu_memory,gpu_uuid"
NA = 0xFFFFFFFFFFFFFFFF
MIB = 1024 * 1024


def user_of(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def from_nvml():
    import pynvml

    pynvml.nvmlInit()
    try:
        gpus, apps = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            gpus.append({"index": i, "uuid": uuid, "name": pynvml.nvmlDeviceGetName(h),
                         "used_mib": mem.used // MIB, "total_mib": mem.total // MIB})
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                used = p.usedGpuMemory
                apps.append({"pid": p.pid, "gpu_uuid": uuid, "name": "",
                             "used_mib": None if used is None or used == NA else used // MIB})
        return {"source": "pynvml", "driver": pynvml.nvmlSystemGetDriverVersion(), "gpus": gpus, "apps": apps}
    finally:
        pynvml.nvmlShutdown()


def smi(query):
    out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError((out.stdout + out.stderr).strip() or f"nvidia-smi exited {out.returncode}")
    return out.stdout


def from_smi():
    gpus_csv = smi("--query-gpu=" + GPU_QUERY)
    apps_csv = smi("--query-compute-apps=" + APP_QUERY)
    return {"source": "nvidia-smi", "gpus_csv": gpus_csv, "apps_csv": apps_csv}


def stat_of(pid):
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    rest = stat[stat.rindex(")") + 2:].split()
    return {"state": rest[0], "ppid": int(rest[1]), "pgid": int(rest[2]), "sid": int(rest[3]), "start": int(rest[19])}


def proc_info(pid):
    try:
        info = stat_of(pid)
        uid = os.stat(f"/proc/{pid}").st_uid
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
        with open(f"/proc/{pid}/comm") as fh:
            comm = fh.read().strip()
    except (OSError, ValueError, IndexError):
        return None
    info.update(uid=uid, user=user_of(uid), comm=comm, argv=argv)
    return info


def group_members(pgids):
    members = {str(g): [] for g in pgids}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = stat_of(int(entry))
            uid = os.stat(f"/proc/{entry}").st_uid
            with open(f"/proc/{entry}/comm") as fh:
                comm = fh.read().strip()
        except (OSError, ValueError, IndexError):
            continue
        if str(st["pgid"]) in members:
            members[str(st["pgid"])].append({"pid": int(entry), "uid": uid, "comm": comm})
    return members


def app_pids(doc):
    if "apps" in doc:
        return {a["pid"] for a in doc["apps"]}
    pids = set()
    for line in doc["apps_csv"].splitlines():
        head = line.split(",", 1)[0].strip()
        if head.isdigit():
            pids.add(int(head))
    return pids


def main(argv):
    errors = []
    doc = None
    sources = [from_smi] if "--no-nvml" in argv else [from_nvml, from_smi]
    for source in sources:
        try:
            doc = source()
            break
        except Exception as exc:  # noqa: BLE001 - every failure is reported, then the next source is tried
            errors.append(f"{source.__name__[5:]}: {type(exc).__name__}: {exc}")
    if doc is None:
        doc = {"source": "none"}
    doc["errors"] = errors
    me = stat_of(os.getpid())
    doc["me"] = {"uid": os.getuid(), "user": user_of(os.getuid()), "pid": os.getpid(), "sid": me["sid"],
                 "pgid": me["pgid"]}
    if doc["source"] != "none":
        procs = {str(pid): proc_info(pid) for pid in sorted(app_pids(doc))}
        doc["procs"] = procs
        doc["groups"] = group_members({p["pgid"] for p in procs.values() if p})
    sys.stdout.write(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
