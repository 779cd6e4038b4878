"""What a host's GPUs hold: the data model read from the GPU probe's JSON document (``facts.gpu.Gpus``)."""
from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_DEVICES = "/dev/nvidia*"  # what a CUDA process holds open (nvidia<N>, nvidiactl, nvidia-uvm)


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    used_mib: int | None  # None: the driver would not say (see memory_error); never taken as 0
    total_mib: int | None
    memory_error: str = ""

    @property
    def readable(self) -> bool:
        return self.used_mib is not None


@dataclass(frozen=True)
class GroupMember:
    pid: int
    uid: int
    comm: str


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on one GPU (a process on two GPUs appears twice, as in nvidia-smi)."""

    pid: int
    gpu_index: int
    used_mib: int | None  # None where the driver says [N/A] (MIG, some containers)
    name: str
    user: str = "?"
    uid: int = -1
    comm: str = ""
    cmdline: str = ""
    pgid: int = 0
    sid: int = 0
    start: int | None = None  # /proc start time; None: no such pid here (exited, or another PID namespace's)
    group: tuple[GroupMember, ...] = ()
    gpu_fds: bool | None = None  # holds a GPU device open here; None: /proc did not let us look

    @property
    def label(self) -> str:
        return self.cmdline or self.name or self.comm


@dataclass(frozen=True)
class GpuState:
    """Result of the GPU probe. ``available`` is False when no driver/GPU could be read (see ``error``)."""

    source: str  # "pynvml" | "nvidia-smi" | "none"
    gpus: tuple[Gpu, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    probe_uid: int = -1
    probe_user: str = "?"
    probe_sid: int = 0
    errors: tuple[str, ...] = field(default=())
    settled: bool = False  # the probe saw its --wait condition hold for the stable window
    waited_s: float = 0.0  # how long the probe sampled on the host before answering
    fd_holders: tuple[GpuProcess, ...] = ()  # local processes with a GPU device open (probe --fd-holders)

    @property
    def available(self) -> bool:
        return self.source != "none" and bool(self.gpus)

    @property
    def error(self) -> str:
        if self.source != "none" and not self.gpus:
            return "no GPUs found"
        return "; ".join(self.errors) or "no GPU driver found"

    def gpu(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def on_gpu(self, index: int) -> list[GpuProcess]:
        return [p for p in self.processes if p.gpu_index == index]


def parse_probe(doc: dict) -> GpuState:
    """Turn the probe's JSON document into a GpuState."""
    me = doc.get("me", {})
    base = dict(probe_uid=me.get("uid", -1), probe_user=me.get("user", "?"), probe_sid=me.get("sid", 0),
                errors=tuple(doc.get("errors", ())))
    source = doc.get("source", "none")
    if source == "none":
        return GpuState("none", **base)
    gpus = [Gpu(g["index"], g["uuid"], g["name"], g["used_mib"], g["total_mib"], g.get("memory_error") or "")
            for g in doc["gpus"]]
    apps = doc["apps"]
    index_of = {g.uuid: g.index for g in gpus}
    procs_info = doc.get("procs", {})
    groups = doc.get("groups", {})
    processes = []
    for app in apps:
        info = procs_info.get(str(app["pid"])) or {}
        members = tuple(GroupMember(m["pid"], m["uid"], m["comm"]) for m in groups.get(str(info.get("pgid")), ()))
        processes.append(GpuProcess(
            pid=app["pid"], gpu_index=index_of.get(app["gpu_uuid"], -1), used_mib=app["used_mib"],
            name=app["name"] or info.get("comm", ""), user=info.get("user", "?"), uid=info.get("uid", -1),
            comm=info.get("comm", ""), cmdline=" ".join(info.get("argv", ())), pgid=info.get("pgid", 0),
            sid=info.get("sid", 0), start=info.get("start"), group=members, gpu_fds=info.get("gpu_fds")))
    holders = tuple(GpuProcess(pid=h["pid"], gpu_index=-1, used_mib=None, name=h.get("comm", ""),
                               user=h.get("user", "?"), uid=h.get("uid", -1), comm=h.get("comm", ""),
                               cmdline=" ".join(h.get("argv", ())), start=h.get("start"), gpu_fds=True)
                    for h in doc.get("fd_holders") or ())
    return GpuState(source, tuple(gpus), tuple(processes), settled=bool(doc.get("settled")),
                    waited_s=float(doc.get("waited_s", 0.0)), fd_holders=holders, **base)


def process_table(state: GpuState) -> list[str]:
    """The GPU memory and process table, one line each, for error messages."""
    if not state.available:
        return [f"GPUs unreadable: {state.error}"]
    lines = [f"GPU {g.index}: {g.used_mib}/{g.total_mib} MiB used" if g.readable else
             f"GPU {g.index}: memory use unreadable ({g.memory_error})" for g in state.gpus]
    lines += [f"  pid {p.pid} on GPU {p.gpu_index}: {'?' if p.used_mib is None else p.used_mib} MiB, user {p.user}, "
              f"{p.label}" for p in state.processes]
    return lines
