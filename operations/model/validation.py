"""Every check of what a user declares, before any host is touched: specops' settings, the engine's rules (flags,
types, speculative settings, ports, GPUs against the host), and where a server lives (name, state directory,
supervisor). Each returns a list of ``Issue``; callers raise them together as one ``ConfigError``."""
from __future__ import annotations

import math
import re

from operations.errors import Issue
from operations.model.engines import engine_for
from operations.model.server_config import HostContext, ServerConfig

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./-]*$")
SUPERVISORS = ("process", "systemd")


def validate(cfg: ServerConfig, ctx: HostContext = HostContext()) -> list[Issue]:
    """The engine's rules for ``cfg`` on the host ``ctx`` describes."""
    return engine_for(cfg.engine).validate(cfg, ctx)


def server_place_issues(name, state_dir: str, supervisor: str, host: str = "*") -> list[Issue]:
    """Where a server lives: its name and state directory (written into systemd units, which have their own
    quoting rules) and the supervisor kind."""
    issues = []
    if not NAME.match(str(name)):
        issues.append(Issue("name", f"{name!r}: use letters, digits, '.', '_' or '-'", host))
    if not SAFE_PATH.match(str(state_dir)):
        issues.append(Issue("state_dir", f"{state_dir!r}: use an absolute path of letters, digits and / . _ - only",
                            host))
    if supervisor not in SUPERVISORS:
        issues.append(Issue("supervisor", f"must be 'process' or 'systemd' (host data specops_supervisor), "
                                          f"got {supervisor!r}", host))
    return issues


def _is_number(value) -> bool:
    """A finite int or float (YAML's ``.nan`` and ``.inf`` are floats too, and would make a wait never end)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def specops_value_issues(meta: dict) -> list[Issue]:
    """Types of the specops section's values (a wrong one would otherwise surface as a traceback, or worse)."""
    issues = []

    def bad(key, message):
        issues.append(Issue(f"specops.{key}", message))

    for key, low, optional in (("ready_timeout_s", 0, False), ("stop_grace_s", 0, False),
                               ("min_accept_length", 0, True)):
        if key not in meta or (optional and meta[key] is None):
            continue
        value = meta[key]
        if not _is_number(value) or value < low or (key == "ready_timeout_s" and value == 0):
            bad(key, f"must be a finite number {'>' if key == 'ready_timeout_s' else '>='} {low}, got {value!r}")
    for key in ("prompt", "name"):
        if key in meta and not (isinstance(meta[key], str) and meta[key]):
            bad(key, f"must be a non-empty string, got {meta[key]!r}")
    env = meta.get("env")
    if env is not None and not isinstance(env, dict):
        bad("env", f"must be a mapping of NAME: value, got {type(env).__name__}")
    elif env:
        for k, v in env.items():
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                bad(f"env.{k}", f"must be a string or a number, got {type(v).__name__}")  # no value: may be secret
    launcher = meta.get("launcher")
    if launcher is not None and not (
            (isinstance(launcher, str) and launcher.split())
            or (isinstance(launcher, list) and launcher and all(isinstance(a, str) and a for a in launcher))):
        bad("launcher", f"must be a command: a string or a non-empty list of strings, got {launcher!r}")
    secret_fields = meta.get("secret_fields")
    if secret_fields is not None and not (isinstance(secret_fields, list)
                                          and all(isinstance(f, str) for f in secret_fields)):
        bad("secret_fields", f"must be a list of field names, got {secret_fields!r}")
    gpus = meta.get("gpus")
    if gpus is not None and not (isinstance(gpus, list) and gpus and all(_is_number(g) and int(g) == g and g >= 0
                                                                         for g in gpus)
                                 and len(set(gpus)) == len(gpus)):
        bad("gpus", f"must be a list of distinct GPU indices (integers >= 0), got {gpus!r}")
    return issues
