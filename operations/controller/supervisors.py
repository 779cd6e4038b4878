"""Where a server's files go and how it is started and stopped: a plain process supervisor or systemd."""
from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

from pyinfra.api import StringCommand

from operations.errors import ConfigError

from operations.model.server_config import ServerConfig
from operations.model.engines import SecretRef, engine_for
from operations.controller.remote import python_script
from operations.model.render import render
from operations.model.validation import server_place_issues

DEFAULT_STATE_DIR = "/var/lib/specops"


@dataclass(frozen=True)
class ServerFile:
    path: str
    content: str
    mode: str  # octal, e.g. "700"
    secret: bool = False  # never printed or diffed


def _argv_for_shell(arg) -> str:
    if isinstance(arg, SecretRef):  # expanded from secrets.env at launch; never rendered into the script
        return (shlex.quote(arg.prefix) if arg.prefix else "") + f'"${{{arg.variable}}}"'

    return shlex.quote(str(arg))


def secrets_env(cfg: ServerConfig) -> str:
    lines = [f"{SecretRef(k).variable}={shlex.quote(str(v))}" for k, v in sorted(cfg.args.items())
             if cfg.is_secret(k) and v is not None]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(cfg.env.items()) if cfg.is_secret(k)]
    return "\n".join(lines) + ("\n" if lines else "")


def launch_env(cfg: ServerConfig) -> dict:
    """The server's public environment: the config's own, and CUDA_VISIBLE_DEVICES = the GPUs it declares (so
    the server runs on exactly those, whatever else the host's GPU 0 holds)."""
    env = {k: v for k, v in sorted(cfg.env.items()) if not cfg.is_secret(k)}
    # nvidia-smi and NVML number GPUs in PCI bus order; CUDA's default order is fastest first, which on a host of
    # mixed GPUs would put the server on other GPUs than the ones idled and checked
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, cfg.gpu_indices())), **env}


@dataclass(frozen=True)
class Supervisor:
    """Files and commands for one named server under ``state_dir``."""

    name: str
    state_dir: str
    python: str = "python3"

    @property
    def directory(self) -> str:
        return posixpath.join(self.state_dir, self.name)

    def path(self, leaf: str) -> str:
        return posixpath.join(self.directory, leaf)

    unit = None  # systemd unit name, when systemd supervises

    def files(self, cfg: ServerConfig) -> list[ServerFile]:
        engine, placed = engine_for(cfg.engine), cfg.placed(self.directory)  # shipped files: in this directory
        engine_yaml = engine.engine_yaml(placed)
        argv = engine.launch_argv(placed, self.path("engine.yaml") if engine_yaml is not None else None)
        script = render("launch.sh.j2", name=self.name, config_hash=cfg.config_hash, env_file=self.path("secrets.env"),
                        env=launch_env(cfg), argv=argv, shell_arg=_argv_for_shell)
        engine_file = [ServerFile(self.path("engine.yaml"), engine_yaml, "600")] if engine_yaml is not None else []
        shipped = [ServerFile(self.path(f.leaf), f.content, "600") for f in cfg.shipped]
        return [*engine_file, *shipped, ServerFile(self.path("launch.sh"), script, "700"),
                ServerFile(self.path("secrets.env"), secrets_env(cfg), "600", secret=True)]

    def ctl(self, *args: str, program: str = "server_ctl.py") -> StringCommand:
        return python_script(self.python, program, *args)

    def stop(self, grace_s: float) -> list[StringCommand]:
        return [self.ctl("stop", self.directory, str(grace_s))]

    def start(self, cfg: ServerConfig) -> list[StringCommand]:
        return [self.ctl("start", self.directory, cfg.config_hash, str(cfg.port))]


@dataclass(frozen=True)
class SystemdSupervisor(Supervisor):
    unit_dir: str = "/etc/systemd/system"

    @property
    def unit(self) -> str:
        return f"specops-{self.name}.service"

    def files(self, cfg: ServerConfig) -> list[ServerFile]:
        unit = render("server.service.j2", name=self.name, config_hash=cfg.config_hash,
                      launch_script=self.path("launch.sh"), env_file=None, log_file=self.path("server.log"),
                      stop_timeout_s=int(cfg.stop_grace_s))
        return super().files(cfg) + [ServerFile(posixpath.join(self.unit_dir, self.unit), unit, "644")]

    def stop(self, grace_s: float) -> list[StringCommand]:
        return [self.ctl("stop", self.directory, str(grace_s), self.unit)]

    def start(self, cfg: ServerConfig) -> list[StringCommand]:
        return [StringCommand("systemctl", "daemon-reload"),
                StringCommand("systemctl", "start", shlex.quote(self.unit)),
                self.ctl("record", self.directory, cfg.config_hash, self.unit)]


def supervisor_for(kind: str, name: str, state_dir: str, python: str) -> Supervisor:
    """The supervisor ``kind`` for server ``name`` under ``state_dir``; a ConfigError listing what is invalid."""
    issues = server_place_issues(name, state_dir, kind)
    if issues:
        raise ConfigError(issues)
    return (SystemdSupervisor if kind == "systemd" else Supervisor)(name, state_dir, python)


def for_host(name: str, supervisor: str | None, state_dir: str | None, python: str, on_host) -> Supervisor:
    """The supervisor of server ``name`` on ``on_host``: the arguments, else host data ``specops_supervisor`` and
    ``specops_state_dir``, else a plain process under /var/lib/specops."""
    kind = supervisor or on_host.data.get("specops_supervisor") or "process"
    state_dir = state_dir or on_host.data.get("specops_state_dir") or DEFAULT_STATE_DIR
    issues = server_place_issues(name, state_dir, kind, on_host.name)
    if issues:
        raise ConfigError(issues)
    return supervisor_for(kind, name, state_dir, python)
