"""A simulated host as an object, for tests, benchmarks and the demo: create it, start holders, clean up.

Every process it starts is remembered by PID and start time, and ``cleanup()`` stops exactly those.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from . import holder, ledger
from .tools import host_env, install_tools


@dataclass
class Holder:
    pid: int
    watcher: int
    start: int | None
    watcher_start: int | None = None
    report_pid: int | None = None  # the PID the driver lists instead of ``pid`` (hold(report_pid=...))
    pin_pid: int | None = None  # the unlisted descendant keeping the memory (hold(pin_child=True))
    pin_start: int | None = None

    def alive(self) -> bool:
        return self.start is not None and ledger.proc_start_time(self.pid) == self.start

    def pin_alive(self) -> bool:
        return self.pin_start is not None and ledger.proc_start_time(self.pin_pid) == self.pin_start


@dataclass
class SimHost:
    root: Path
    holders: list[Holder] = field(default_factory=list)
    # state directories servers of this host are started under (DIR/servers, as inventory/sim.py puts them; a test
    # that gives its run another specops_state_dir adds it, so cleanup() stops that server too)
    state_dirs: list[Path] = field(default_factory=list)

    @classmethod
    def create(cls, root: Path, gpus: int = 8, *, nvml: bool = True, **kwargs) -> "SimHost":
        ledger.init_host(Path(root), gpus, **kwargs)
        install_tools(Path(root), nvml=nvml)
        return cls(Path(root))

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """A process environment that sees this host's GPUs (and GPUSIM_ROOT for inventory/sim.py)."""
        env = dict(os.environ if base is None else base)
        add = host_env(self.root)
        env["PATH"] = f"{add['PATH']}:{env.get('PATH', '/usr/bin:/bin')}"
        env["LD_LIBRARY_PATH"] = add["LD_LIBRARY_PATH"]
        env["GPUSIM_ROOT"] = str(self.root)
        return env

    @property
    def device_glob(self) -> str:
        """The device-file pattern of this host (DIR/dev/nvidia*), what product code is given instead of /dev/nvidia*."""
        return str(self.root.resolve() / "dev" / "nvidia*")  # resolved, as readlink /proc/PID/fd/N shows it

    def hold(self, gpus, mib: int, **kwargs) -> Holder:
        """Start a holder (holder.hold's options: name, on_term, user, stuck, release_delay_s, device_fds,
        report_pid, pin_child); it is remembered for cleanup()."""
        info = holder.hold(self.root, {g: mib for g in gpus}, **kwargs)
        h = Holder(info["pid"], info["watcher"], ledger.proc_start_time(info["pid"]),
                   ledger.proc_start_time(info["watcher"]), kwargs.get("report_pid"),
                   info.get("pin_pid"), info.get("pin_start"))
        self.holders.append(h)
        return h

    def snapshot(self) -> ledger.Snapshot:
        return ledger.snapshot(self.root)

    def used_mib(self) -> dict[int, int]:
        return {g.index: g.used_mib for g in self.snapshot().gpus}

    def set_driver(self, loaded: bool) -> None:
        self.configure(driver_loaded=loaded)

    def configure(self, **settings) -> None:
        """Update host.json settings, e.g. server_start_s, accept_length, release_delay_s."""
        host = json.loads((self.root / "host.json").read_text())
        host.update(settings)
        ledger.save_host(self.root, host)

    def configure_gpu(self, index: int, **settings) -> None:
        """Update one GPU's host.json entry, e.g. ``memory="na"`` (ledger.MEMORY_MODES)."""
        if "memory" in settings and settings["memory"] not in ledger.MEMORY_MODES:
            raise ValueError(f"memory must be one of {ledger.MEMORY_MODES}")
        host = json.loads((self.root / "host.json").read_text())
        gpu = next((g for g in host["gpus"] if g["index"] == index), None)
        if gpu is None:
            raise ValueError(f"no GPU {index} on this host")
        gpu.update(settings)
        ledger.save_host(self.root, host)

    def servers(self) -> list[dict]:
        """state.json of every server started on this host (under DIR/servers and ``state_dirs``)."""
        out = []
        dirs = [self.root / "servers", *self.state_dirs]
        for path in [p for d in dirs for p in sorted(Path(d).glob("*/state.json"))]:
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(path.read_text()))
        return out

    def cleanup(self) -> None:
        """SIGKILL the holders, their pinning children and watchers this object started, by PID, if they are still
        those processes; likewise the servers started on this host (recorded with their start time in state.json)."""
        for server in self.servers():
            pid = server.get("pid")
            if pid and ledger.proc_start_time(pid) == server.get("start"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(server.get("pgid") or pid, signal.SIGKILL)
        for h in self.holders:
            if h.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(h.pid, signal.SIGKILL)
        for h in self.holders:
            if h.pin_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(h.pin_pid, signal.SIGKILL)
        for h in self.holders:
            if h.watcher_start is not None and ledger.proc_start_time(h.watcher) == h.watcher_start:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(h.watcher, signal.SIGKILL)
        self.holders.clear()
