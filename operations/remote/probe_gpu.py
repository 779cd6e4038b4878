"""Remote GPU probe: run on the target host as
``run.py probe_gpu [--no-nvml] [--wait JSON] [--devices GLOB] [--fd-holders]``.

Prints one JSON document. Standard library only; pynvml is used when the host's Python imports and initialises
it, else ``nvidia-smi`` CSV is read (both queries at once) and parsed here. Each GPU process is enriched from
/proc: user, cmdline, comm, process group, session and start time (so signals are guarded against PID reuse),
and the members of its process group (so a group is only signalled when every member may be).

``--wait`` makes the probe sample on the host until a condition holds (for ``stable_s`` over two samples) or
``budget_s`` runs out, so waiting for memory release costs one round trip per progress line, not per sample.
The controller re-checks every document it gets; the condition here only decides when to answer.

Memory the driver will not report (``[N/A]`` on GPUs such as GB10, ``[Insufficient Permissions]`` for MIG in an
unprivileged container, an NVML error) is ``null`` with the reason in ``memory_error``: never read as 0.
Each GPU process also says whether it holds a GPU device open (``gpu_fds``: true, false, or null when /proc does
not let us look; GLOB, default ``/dev/nvidia*``), so a PID the driver reports from another PID namespace is
never mistaken for the local process that has that number. ``--fd-holders`` lists every local process holding
such a device open (what pins memory the driver no longer lists).
"""
import fnmatch
import json
import os
import pwd
import subprocess
import sys
import time

from .common import StableWindow, masked, proc_stat

GPU_QUERY = "index,uuid,name,memory.used,memory.total"
APP_QUERY = "pid,process_name,used_gpu_memory,gpu_uuid"
NA_VALUES = {"[N/A]", "N/A", "[Not Supported]", "[Insufficient Permissions]", "[Unknown Error]", ""}
NVML_NA = 0xFFFFFFFFFFFFFFFF
MIB = 1024 * 1024


# ---- nvidia-smi CSV (--format=csv,noheader,nounits) -------------------------------------------------------
def csv_rows(text, width, name_col):
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No running processes"):
            continue
        parts = [p.strip() for p in line.split(", ")]
        if len(parts) > width:  # only the name column may itself contain ", ": rejoin it
            tail = width - name_col - 1
            parts = parts[:name_col] + [", ".join(parts[name_col:len(parts) - tail])] + parts[len(parts) - tail:]
        if len(parts) != width:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        rows.append(parts)
    return rows


def mib(text):
    text = text.strip()
    if text in NA_VALUES:
        return None
    return int(float(text.split()[0]))  # tolerate "123 MiB" when units were not suppressed


def parse_gpu_csv(text):
    gpus = []
    for i, uuid, name, used, total in csv_rows(text, 5, name_col=2):
        used_mib = mib(used)
        why = "" if used_mib is not None else f"nvidia-smi reports memory.used as {used.strip() or '(empty)'}"
        gpus.append({"index": int(i), "uuid": uuid, "name": name, "used_mib": used_mib, "total_mib": mib(total),
                     "memory_error": why})
    return gpus


def parse_apps_csv(text):
    return [{"pid": int(pid), "name": name, "used_mib": mib(used), "gpu_uuid": uuid}
            for pid, name, used, uuid in csv_rows(text, 4, name_col=1)]


# ---- sources: each returns a sampler giving {"gpus": [...], "apps": [...]} -------------------------------
def nvml_source():
    import pynvml

    pynvml.nvmlInit()
    driver = pynvml.nvmlSystemGetDriverVersion()

    def sample():
        gpus, apps = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                used, total, why = mem.used // MIB, mem.total // MIB, ""
            except pynvml.NVMLError as exc:  # e.g. Not Supported (GB10), No Permission (MIG, unprivileged)
                used, total, why = None, None, f"pynvml nvmlDeviceGetMemoryInfo: {exc}"
            gpus.append({"index": i, "uuid": uuid, "name": pynvml.nvmlDeviceGetName(h),
                         "used_mib": used, "total_mib": total, "memory_error": why})
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                used = p.usedGpuMemory
                apps.append({"pid": p.pid, "gpu_uuid": uuid, "name": "",
                             "used_mib": None if used is None or used == NVML_NA else used // MIB})
        return {"gpus": gpus, "apps": apps}

    return "pynvml", driver, sample


def smi_source():
    def sample():
        procs = [subprocess.Popen(["nvidia-smi", query, "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for query in
                 ("--query-gpu=" + GPU_QUERY, "--query-compute-apps=" + APP_QUERY)]
        outs = [p.communicate(timeout=60)[0] for p in procs]
        for p, out in zip(procs, outs):
            if p.returncode != 0:
                raise RuntimeError(out.strip() or f"nvidia-smi exited {p.returncode}")
        return {"gpus": parse_gpu_csv(outs[0]), "apps": parse_apps_csv(outs[1])}

    sample()  # fail here, so the error is reported as this source's
    return "nvidia-smi", None, sample


# ---- waiting on the host ------------------------------------------------------------------------------------
def satisfied(doc, cond):
    """``absent``: none of these pids on a GPU. ``idle``: chosen GPUs hold only tolerated pids and memory."""
    absent = set(cond.get("absent", ()))
    if any(a["pid"] in absent for a in doc["apps"]):
        return False
    if not cond.get("idle"):
        return True
    chosen = set(cond["gpus"])
    tolerated = set(cond.get("tolerated_pids", ()))
    uuids = {g["uuid"] for g in doc["gpus"] if g["index"] in chosen}
    if any(a["gpu_uuid"] in uuids and a["pid"] not in tolerated for a in doc["apps"]):
        return False
    allow = cond.get("tolerated_mib", {})
    return all(g["used_mib"] is not None and g["used_mib"] - allow.get(str(g["index"]), 0) <= cond["threshold_mib"]
               for g in doc["gpus"] if g["index"] in chosen)


def intruders(doc, cond):
    """Processes on the chosen GPUs that the condition neither waits to go (``absent``) nor tolerates."""
    known = set(cond.get("absent", ())) | set(cond.get("tolerated_pids", ()))
    uuids = {g["uuid"] for g in doc["gpus"] if g["index"] in set(cond.get("gpus", ()))}
    return [a["pid"] for a in doc["apps"] if a["gpu_uuid"] in uuids and a["pid"] not in known]


def wait(sample, doc, cond):
    """Sample until ``cond`` holds (``satisfied``), its budget is spent, or (``stop_on_intruders``) a process
    nobody planned for holds a chosen GPU: waiting cannot free that one, so the caller hears at once."""
    end = time.monotonic() + cond["budget_s"]
    window = StableWindow(cond.get("stable_s", 0), need=2 if cond.get("idle") else 1)
    cost = 0.0
    while True:
        if window.update(satisfied(doc, cond), time.monotonic()):
            return doc, True
        if cond.get("stop_on_intruders") and intruders(doc, cond):
            return doc, False
        pause = cond.get("interval_s", 0.02)
        if time.monotonic() + pause + cost > end:
            return doc, False
        time.sleep(pause)
        t0 = time.monotonic()
        doc = sample()
        cost = max(cost, time.monotonic() - t0)


# ---- /proc enrichment -------------------------------------------------------------------------------------
def user_of(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def holds_device(pid, pattern):
    """True if pid has a GPU device (``pattern``) open, False if not, None if /proc does not let us look."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    except OSError:
        return None
    for fd in fds:
        try:
            if fnmatch.fnmatchcase(os.readlink(f"/proc/{pid}/fd/{fd}"), pattern):
                return True
        except OSError:
            continue
    return False


def fd_holders(pattern):
    """Every local process holding a GPU device open (what still pins memory the driver no longer lists)."""
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        pid = int(entry)
        if pid == os.getpid() or holds_device(pid, pattern) is not True:
            continue
        info = proc_info(pid, pattern)
        if info:
            out.append({"pid": pid, "user": info["user"], "uid": info["uid"], "comm": info["comm"],
                        "argv": info["argv"], "start": info["start"]})
    return out


def proc_info(pid, pattern="/dev/nvidia*"):
    try:
        info = proc_stat(pid)
        if info is None:
            return None
        uid = os.stat(f"/proc/{pid}").st_uid
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
        with open(f"/proc/{pid}/comm") as fh:
            comm = fh.read().strip()
    except (OSError, ValueError, IndexError):
        return None
    info.update(uid=uid, user=user_of(uid), comm=comm, argv=masked(argv), gpu_fds=holds_device(pid, pattern))
    return info


def group_members(pgids):
    members = {str(g): [] for g in pgids}
    if not members:
        return members
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = proc_stat(int(entry))
            if st is None or str(st["pgid"]) not in members:
                continue
            uid = os.stat(f"/proc/{entry}").st_uid
            with open(f"/proc/{entry}/comm") as fh:
                comm = fh.read().strip()
        except (OSError, ValueError, IndexError):
            continue
        members[str(st["pgid"])].append({"pid": int(entry), "uid": uid, "comm": comm})
    return members


def main(argv):
    cond = json.loads(argv[argv.index("--wait") + 1]) if "--wait" in argv else None
    devices = argv[argv.index("--devices") + 1] if "--devices" in argv else "/dev/nvidia*"
    doc = probe(cond, devices, nvml="--no-nvml" not in argv, holders="--fd-holders" in argv)
    sys.stdout.write(json.dumps(doc) + "\n")


def probe(cond=None, devices="/dev/nvidia*", nvml=True, holders=False):
    """The probe's document (what ``main`` prints); other host programs (observe, transition) call it too."""
    sources = [nvml_source, smi_source] if nvml else [smi_source]
    labels = {nvml_source: "pynvml", smi_source: "nvidia-smi"}
    errors, doc = [], {"source": "none"}
    for source in sources:
        try:
            label, driver, sample = source()
            doc = sample()
        except Exception as exc:  # noqa: BLE001 - every failure is reported, then the next source is tried
            errors.append(f"{labels[source]}: {type(exc).__name__}: {exc}")
            continue
        doc.update(source=label, driver=driver, settled=False)
        if cond:
            t0 = time.monotonic()
            sampled, settled = wait(sample, doc, cond)
            doc.update(sampled, settled=settled, waited_s=round(time.monotonic() - t0, 4))
        break
    doc["errors"] = errors
    me = proc_stat(os.getpid())
    doc["me"] = {"uid": os.getuid(), "user": user_of(os.getuid()), "pid": os.getpid(), "sid": me["sid"],
                 "pgid": me["pgid"]}
    if doc["source"] != "none":
        procs = {str(pid): proc_info(pid, devices) for pid in sorted({a["pid"] for a in doc["apps"]})}
        if None in procs.values():  # gone from /proc: exited since the driver listed it, or another namespace's?
            time.sleep(0.05)        # ask the driver again: one that exited is no longer listed
            try:
                again = sample()
            except Exception:  # noqa: BLE001 - keep the first reading
                again = None
            if again is not None:
                listed = {a["pid"] for a in again["apps"]}
                doc["apps"] = [a for a in doc["apps"] if procs[str(a["pid"])] is not None or a["pid"] in listed]
                procs = {k: v for k, v in procs.items() if v is not None or int(k) in listed}
        doc["procs"] = procs
        doc["groups"] = group_members({p["pgid"] for p in procs.values() if p})
    if holders:
        doc["fd_holders"] = fd_holders(devices)
    return doc


if __name__ == "__main__":
    main(sys.argv[1:])
