"""What a host's server is doing (``ServerStatus``, read from ``facts.server.Server``) and drift: the desired
config against what runs."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from operations.model.server_config import VERIFY_KEYS, ServerConfig
from operations.model.engines import engine_for, mismatches


@dataclass(frozen=True)
class ServerStatus:
    alive: bool = False  # the process specops started is running
    pid: int | None = None
    status: str = "absent"  # absent | starting | running | stopped | failed
    config_hash: str | None = None
    recorded: dict = field(default_factory=dict)  # masked args and verify settings it was started with
    health: int | None = None  # /health status code on the server's port (None: nothing listens)
    server_info: dict | None = None  # /server_info (or /get_server_info), masked on the host
    launch_sh: str | None = None
    engine_yaml: str | None = None  # the --config file the engine was started from
    shipped: dict = field(default_factory=dict)  # leaf -> content of the files the config shipped beside it
    unit_file: str | None = None
    error: str | None = None
    problem: str | None = None  # the server directory is unsafe, or its state.json corrupt (then set aside)

    @property
    def unsafe(self) -> bool:
        """The server directory sits in a tree another local user could write: nothing may be done there."""
        return bool(self.problem) and self.problem.startswith("unsafe")

    @property
    def foreign(self) -> bool:
        """Something answers on the port, but not the process specops started (e.g. restarted by hand)."""
        return not self.alive and self.health is not None


def parse_status(doc: dict) -> ServerStatus:
    if "error" in doc:
        return ServerStatus(error=doc["error"])
    state = doc.get("state") or {}
    return ServerStatus(alive=bool(doc.get("alive")), pid=state.get("pid"), status=state.get("status", "absent"),
                        config_hash=state.get("config_hash"), recorded=state.get("recorded") or {},
                        health=doc.get("health"), server_info=doc.get("server_info"), launch_sh=doc.get("launch_sh"),
                        engine_yaml=doc.get("engine_yaml"), shipped=doc.get("shipped") or {},
                        unit_file=doc.get("unit_file"), problem=doc.get("problem"))


@dataclass(frozen=True)
class FieldChange:
    field: str
    current: object
    desired: object
    restart: bool

    def __str__(self) -> str:
        return f"~ {self.field}: {_show(self.current)} -> {_show(self.desired)} ({'restart' if self.restart else 'no restart'})"


def _show(value) -> str:
    return "(unset)" if value is None else json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def recorded_view(cfg: ServerConfig, engine_version: str | None = None) -> dict:
    """What state.json remembers of a config: masked args, the verification settings, the GPUs and the engine
    version the host's own engine reported before the start."""
    return {"args": cfg.masked_args(), "verify": {k: getattr(cfg, k) for k in VERIFY_KEYS},
            "gpus": cfg.gpu_indices(), "engine": {"name": cfg.engine, "version": engine_version}}


def drift(cfg: ServerConfig, status: ServerStatus) -> list[FieldChange]:
    """Per-field changes from what runs (the live server's own report, else what specops recorded) to ``cfg``."""
    engine = engine_for(cfg.engine)
    desired = engine.desired_view(cfg)
    if status.server_info:
        current = engine.reported_view(cfg, status.server_info)
    elif status.recorded:  # what it was started with, resolved the same way
        masked = {k: v for k, v in status.recorded.get("args", {}).items() if v != "<secret>"}
        current = engine.desired_view(replace(cfg, args=masked), keys=list(desired))
    else:
        current = {}
    changes = [FieldChange(k, now, want, True) for k, now, want in mismatches(desired, current) if current]
    recorded_args = status.recorded.get("args", {})
    changes += [FieldChange(k, "<secret>", "<secret, changed>", True) for k in cfg.args
                if cfg.is_secret(k) and status.config_hash and status.config_hash != cfg.config_hash
                and k in recorded_args and not changes]
    verify = status.recorded.get("verify", {})
    changes += [FieldChange(k, verify.get(k), getattr(cfg, k), False) for k in VERIFY_KEYS
                if verify and verify.get(k) != getattr(cfg, k)]
    return changes
