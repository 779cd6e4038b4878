import sys
"""Small builders for GpuState values used by the pure-logic tests."""
from operations.model.gpus import Gpu, GpuProcess, GpuState, GroupMember


def gpus(*used: int, total: int = 81559) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", mib, total) for i, mib in enumerate(used))


def proc(pid: int, gpu: int, mib: int | None, *, user: str = "root", uid: int = 0, name: str = "python3",
         cmdline: str | None = None, pgid: int | None = None, sid: int | None = None, start: int | None = 100,
         group: tuple = None, gpu_fds: bool | None = True) -> GpuProcess:
    pgid = pid if pgid is None else pgid
    group = (GroupMember(pid, uid, name),) if group is None else group
    return GpuProcess(pid, gpu, mib, name, user, uid, name, cmdline or f"{name} serve", pgid,
                      pid if sid is None else sid, start, group, gpu_fds)


def state(used: tuple[int, ...], *processes: GpuProcess, user: str = "root") -> GpuState:
    return GpuState("pynvml", gpus(*used), tuple(processes), 0 if user == "root" else 1000, user, 1)


def host_program(name: str, *args: str, python: str = sys.executable) -> list[str]:
    """argv that runs host program ``name`` exactly as specops does on a host (the bundle installed under
    $HOME/.cache/specops first): give it an env with HOME set to a test directory."""
    from operations.controller.remote import python_script

    return ["sh", "-c", python_script(python, name, *args, install=True).get_raw_value()]
