"""What a host's GPUs hold right now: the ``GpuState`` fact, its data model and the nvidia-smi parsers."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from .errors import ProbeError
from .remote import guarded, python_script

NA_VALUES = {"[N/A]", "N/A", "[Not Supported]", "[Insufficient Permissions]", "[Unknown Error]", ""}


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    used_mib: int
    total_mib: int


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
    start: int | None = None  # /proc start time; None when the process vanished between driver and /proc reads
    group: tuple[GroupMember, ...] = ()

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


def _num(text: str) -> int | None:
    text = text.strip()
    if text in NA_VALUES:
        return None
    return int(float(text.split()[0]))  # tolerate "123 MiB" when units were not suppressed


def _rows(csv_text: str, width: int, name_col: int) -> list[list[str]]:
    rows = []
    for line in csv_text.splitlines():
        if not line.strip() or line.startswith("No running processes"):
            continue
        parts = [p.strip() for p in line.split(", ")]
        if len(parts) > width:  # only the name column may itself contain ", ": rejoin it
            tail = width - name_col - 1
            parts = parts[:name_col] + [", ".join(parts[name_col:len(parts) - tail])] + parts[len(parts) - tail:]
        if len(parts) != width:
            raise ProbeError(f"unexpected nvidia-smi line: {line!r}")
        rows.append(parts)
    return rows


def parse_gpu_csv(text: str) -> list[Gpu]:
    """``--query-gpu=index,uuid,name,memory.used,memory.total --format=csv,noheader,nounits``."""
    gpus = []
    for index, uuid, name, used, total in _rows(text, 5, name_col=2):
        gpus.append(Gpu(int(index), uuid, name, _num(used) or 0, _num(total) or 0))
    return gpus


def parse_apps_csv(text: str) -> list[dict]:
    """``--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid --format=csv,noheader,nounits``."""
    return [{"pid": int(pid), "name": name, "used_mib": _num(used), "gpu_uuid": uuid}
            for pid, name, used, uuid in _rows(text, 4, name_col=1)]


def parse_probe(doc: dict) -> GpuState:
    """Turn the probe's JSON document into a GpuState."""
    me = doc.get("me", {})
    base = dict(probe_uid=me.get("uid", -1), probe_user=me.get("user", "?"), probe_sid=me.get("sid", 0),
                errors=tuple(doc.get("errors", ())))
    source = doc.get("source", "none")
    if source == "none":
        return GpuState("none", **base)
    if source == "nvidia-smi":
        gpus = parse_gpu_csv(doc["gpus_csv"])
        apps = parse_apps_csv(doc["apps_csv"])
    else:
        gpus = [Gpu(g["index"], g["uuid"], g["name"], g["used_mib"], g["total_mib"]) for g in doc["gpus"]]
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
            sid=info.get("sid", 0), start=info.get("start"), group=members))
    return GpuState(source, tuple(gpus), tuple(processes), **base)


def probe_command(python: str = "python3", nvml: bool = True) -> StringCommand:
    """One round trip: the probe if the host has that Python, else a 'none' document saying why."""
    missing = json.dumps({"source": "none", "errors": [f"{python} not found on host"]})
    probe = python_script(python, "probe_gpu.py", *([] if nvml else ["--no-nvml"]))
    return guarded(python, probe, missing)


class GpuStateFact(FactBase):
    """
    GPUs and their compute processes, via pynvml with an nvidia-smi fallback, in one round trip.

    + python: the interpreter on the host that runs the probe (pynvml is used if it can import it)
    + nvml: set False to skip pynvml and read nvidia-smi only

    **Example:**

    .. code:: python

        state = host.get_fact(GpuStateFact, python="/opt/sglang/bin/python")
        if not state.available:
            print(state.error)
    """

    @staticmethod
    def default() -> GpuState:
        return GpuState("none", errors=("probe produced no output",))

    def command(self, python: str = "python3", nvml: bool = True):
        return probe_command(python, nvml)

    def process(self, output: list[str]) -> GpuState:
        try:
            return parse_probe(json.loads("\n".join(output)))
        except (ValueError, KeyError, TypeError, ProbeError) as exc:
            raise FactProcessError(f"unreadable GPU probe output: {exc}: {output[-3:]!r}") from exc
