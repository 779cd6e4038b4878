"""The simulated driver's memory ledger.

Layout of a host directory (``gpusim init DIR``)::

    DIR/host.json              GPUs (index, uuid, name, total_mib, mig, base_mib, memory), driver version, release delay
    DIR/ledger/<pid>-<t>.json  one allocation per process: pid, its /proc start time, MiB per GPU, name
                               (and optionally report_pid, the PID the driver lists, and pin, a descendant's pid/start)
    DIR/dev/                   nvidia0..N-1, nvidiactl, nvidia-uvm: empty stand-ins for the device files that CUDA
                               processes hold open (the simulator never touches the machine's /dev)
    DIR/bin/                   nvidia-smi and gpusim-snapshot stand-ins (put first on PATH)
    DIR/lib/                   libnvidia-ml.so.1 stand-in (put on LD_LIBRARY_PATH)

An allocation counts as a running compute process while its PID is alive with the recorded start time (so a
reused PID is never mistaken for the holder). When the process dies its memory stays allocated, unlisted, for
the release delay, the way a real driver tears a CUDA context down; ``stuck`` allocations are never freed.
A *pinned* allocation (a descendant of the holder still has the device files open) stays allocated, unlisted,
while that descendant lives, and the release delay counts from the descendant's death.

A GPU's ``memory`` setting says whether its memory can be read: ``ok``, ``na`` (the driver does not report it, as
on a unified-memory GB10) or ``noperm`` (an unprivileged container on a MIG GPU). Only the reporting changes; the
ledger still books allocations and refuses what does not fit.
"""
from __future__ import annotations

# Startup cost matters: nvidia-smi and the NVML stand-in run this on every read, so it avoids dataclasses and
# pathlib (tens of milliseconds of imports each on a slow core) and works on os.path strings.
import contextlib
import fcntl
import json
import os
import time

DEFAULT_RELEASE_DELAY_S = 2.0
H200_MIB = 143771
MEMORY_MODES = ("ok", "na", "noperm")


class OutOfMemory(Exception):
    """Raised when an allocation does not fit; mirrors CUDA's 'out of memory'."""


class NoDriver(Exception):
    """The host directory has no (loaded) driver."""


class _Record:
    __slots__ = ()

    def __init__(self, *args):
        for name, value in zip(self.__slots__, args):
            setattr(self, name, value)

    def __eq__(self, other):
        return type(self) is type(other) and self.asdict() == other.asdict()

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"

    def asdict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class GpuRecord(_Record):
    __slots__ = ("index", "uuid", "name", "total_mib", "used_mib", "mig", "bus_id", "memory")  # memory: MEMORY_MODES


class ProcRecord(_Record):
    # used_mib None where the driver reports [N/A] (MIG); name None where no local process has that PID
    __slots__ = ("gpu_index", "pid", "used_mib", "name")


class Snapshot(_Record):
    __slots__ = ("driver", "cuda", "gpus", "procs")

    def asdict(self) -> dict:
        return {"driver": self.driver, "cuda": self.cuda, "gpus": [g.asdict() for g in self.gpus],
                "procs": [p.asdict() for p in self.procs]}


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def load_host(root) -> dict:
    try:
        host = json.loads(_read(os.path.join(root, "host.json")))
    except FileNotFoundError:
        raise NoDriver(f"no simulated host at {root}") from None
    if not host.get("driver_loaded", True):
        raise NoDriver("driver not loaded")
    return host


def save_host(root, host: dict) -> None:
    _atomic_write(os.path.join(root, "host.json"), host)


def init_host(root, gpus: int = 8, total_mib: int = H200_MIB, name: str = "NVIDIA H200",
              release_delay_s: float = DEFAULT_RELEASE_DELAY_S, mig: tuple = (), base_mib: int = 0) -> dict:
    os.makedirs(os.path.join(root, "ledger"), exist_ok=True)
    seed = int.from_bytes(os.urandom(4), "big")
    host = {
        "driver": "550.54.15",
        "cuda": 12040,
        "driver_loaded": True,
        "release_delay_s": release_delay_s,
        "gpus": [
            {"index": i, "uuid": f"GPU-{seed:08x}-{i:04x}-4a1e-9b3c-{i:012x}", "name": name,
             "total_mib": total_mib, "mig": i in mig, "base_mib": base_mib,
             "bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0"}
            for i in range(gpus)
        ],
    }
    save_host(root, host)
    _make_devices(root, gpus)
    return host


def device_paths(root, gpus) -> list:
    """The device files a CUDA process on ``gpus`` holds open, in the order CUDA opens them."""
    dev = os.path.join(root, "dev")
    return [os.path.join(dev, "nvidiactl"), os.path.join(dev, "nvidia-uvm")] + \
        [os.path.join(dev, f"nvidia{i}") for i in sorted(gpus)]


def _make_devices(root, gpus: int) -> None:
    """DIR/dev: plain empty files, world read-writable like the real nodes, one per GPU (stale extra ones removed)."""
    dev = os.path.join(root, "dev")
    os.makedirs(dev, exist_ok=True)
    wanted = device_paths(root, range(gpus))
    for name in os.listdir(dev):
        if name.startswith("nvidia") and name[6:].isdigit() and os.path.join(dev, name) not in wanted:
            os.unlink(os.path.join(dev, name))
    for path in wanted:
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o666))
        os.chmod(path, 0o666)  # not subject to the umask


def open_devices(root, gpus) -> list:
    """Open the device files for ``gpus`` (read-write, as CUDA does); the caller keeps the fds for its lifetime."""
    fds = []
    try:
        for path in device_paths(root, gpus):
            fds.append(os.open(path, os.O_RDWR))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _atomic_write(path: str, obj: dict) -> None:
    head, tail = os.path.split(path)
    tmp = os.path.join(head, f".{tail}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(json.dumps(obj))
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(root):
    """Serialise ledger writers (allocations must not oversubscribe a GPU)."""
    with open(os.path.join(root, ".lock"), "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def proc_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie PID; None if it is gone."""
    try:
        stat = _read(f"/proc/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # comm may contain spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _entries(root):
    folder = os.path.join(root, "ledger")
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(folder, name)
        try:
            yield path, json.loads(_read(path))
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # removed or being replaced under us


def allocate(root, pid: int, mib_by_gpu: dict, name: str, *, stuck: bool = False,
             release_delay_s: float | None = None, report_pid: int | None = None) -> str:
    """Record that live process ``pid`` holds memory; raises OutOfMemory if any GPU lacks room.

    ``report_pid``: the PID the driver lists instead (a driver seen from another PID namespace reports PIDs that
    mean nothing, or something else, here); liveness and release still follow ``pid`` and its start time."""
    start = proc_start_time(pid)
    if start is None:
        raise ProcessLookupError(pid)
    with locked(root):
        snap = snapshot(root)
        gpus = {g.index: g for g in snap.gpus}
        for idx, mib in mib_by_gpu.items():
            if idx not in gpus:
                raise ValueError(f"no GPU {idx} on this host")
            free = gpus[idx].total_mib - gpus[idx].used_mib
            if mib > free:
                raise OutOfMemory(
                    f"CUDA out of memory. Tried to allocate {mib} MiB on GPU {idx} "
                    f"({gpus[idx].total_mib} MiB total, {free} MiB free)")
        entry = {"pid": pid, "start": start, "gpus": {str(k): v for k, v in mib_by_gpu.items()},
                 "name": name, "stuck": stuck, "release_delay_s": release_delay_s, "dead_at": None}
        if report_pid is not None:
            entry["report_pid"] = report_pid
        path = os.path.join(root, "ledger", f"{pid}-{start}.json")
        _atomic_write(path, entry)
        return path


def make_stuck(root, pid: int) -> int:
    """The fault "this process's memory will never be freed" injected into a live holder (e.g. a running
    server whose CUDA context the driver will fail to tear down); returns how many allocations it marked."""
    marked = 0
    with locked(root):
        for path, entry in list(_entries(root)):
            if entry.get("pid") == pid:
                _atomic_write(path, {**entry, "stuck": True})
                marked += 1
    return marked


def set_pin(path: str, pid: int, start: int) -> None:
    """Record the holder's unlisted descendant that keeps the device files (and so the memory) after it dies.

    Recorded before anyone is told the holder's PID; any death mark made before that is undone, since the
    countdown only starts once the descendant is gone too."""
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        entry = json.loads(_read(path))
        entry["pin"] = {"pid": pid, "start": start}
        entry["dead_at"] = None
        _atomic_write(path, entry)


def _pinned(entry: dict) -> bool:
    pin = entry.get("pin")
    return bool(pin) and proc_start_time(pin["pid"]) == pin["start"]


def local_name(pid: int) -> str | None:
    """The name a tool on this host shows for ``pid``: its cmdline's first argument, else its comm; None if no
    such process (as nvidia-smi resolves names locally, whatever PID namespace the driver reported it from)."""
    try:
        arg0 = _read(f"/proc/{pid}/cmdline").split("\0")[0]
        return arg0 or _read(f"/proc/{pid}/comm").strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def mark_dead(path: str, when: float) -> None:
    """Record the moment the holder died (the driver starts tearing its context down)."""
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        entry = json.loads(_read(path))
        if entry.get("dead_at") is None:
            entry["dead_at"] = when
            _atomic_write(path, entry)


def release_after_death(root, path: str) -> None:
    """The holder of ``path`` just died: record when, wait out its release delay (never, if stuck), then free it."""
    mark_dead(path, time.time())
    try:
        entry = json.loads(_read(path))
    except (FileNotFoundError, json.JSONDecodeError):
        return
    if entry.get("stuck"):
        return
    delay = entry.get("release_delay_s")
    time.sleep(load_host(root)["release_delay_s"] if delay is None else delay)
    snapshot(root)  # reading past the delay frees the entry


def snapshot(root, now: float | None = None) -> Snapshot:
    """What the driver reports right now: used memory per GPU and live compute processes."""
    host = load_host(root)
    now = time.time() if now is None else now
    gpus = [GpuRecord(g["index"], g["uuid"], g["name"], g["total_mib"], g.get("base_mib", 0),
                      g.get("mig", False), g.get("bus_id", ""), g.get("memory", "ok")) for g in host["gpus"]]
    by_index = {g.index: g for g in gpus}
    snap = Snapshot(host["driver"], host["cuda"], gpus, [])
    for path, entry in _entries(root):
        alive = entry["dead_at"] is None and proc_start_time(entry["pid"]) == entry["start"]
        if not alive and not _pinned(entry):
            dead_at = entry["dead_at"]
            if dead_at is None:  # died without its watcher noticing (watcher killed too): count from now
                mark_dead(path, now)
                dead_at = now
            delay = entry.get("release_delay_s")
            delay = host["release_delay_s"] if delay is None else delay
            if not entry["stuck"] and now >= dead_at + delay:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
        for idx, mib in entry["gpus"].items():
            gpu = by_index.get(int(idx))
            if gpu is None:
                continue
            gpu.used_mib += mib
            if alive:
                pid, name = _listed(entry)
                snap.procs.append(ProcRecord(gpu.index, pid, None if gpu.mig else mib, name))
    return snap


def _listed(entry: dict) -> tuple:
    """(pid, name) as the driver lists the entry: its own, or the reported PID with the name resolved locally."""
    pid = entry.get("report_pid")
    return (entry["pid"], entry["name"]) if pid is None else (pid, local_name(pid))


def release_all(root) -> int:
    """Drop every allocation (the simulator's 'GPU reset'); returns how many were dropped."""
    n = 0
    with locked(root):
        for path, _ in _entries(root):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                n += 1
    return n
