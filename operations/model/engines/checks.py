"""Rules every engine applies: ports, API keys an HTTP header can carry, GPU placement, integer bounds."""
from __future__ import annotations

from operations.errors import Issue
from operations.model.server_config import API_KEYS, ServerConfig


def port_issues(cfg: ServerConfig, key: str) -> list[Issue]:
    value = cfg.args.get(key)
    if value is None:
        return []
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        return [Issue(key, f"port must be an integer 1-65535, got {value!r}")]
    return []


_HEADER_PROBLEMS = {"\n": "a newline (LF)", "\r": "a carriage return (CR)", "\0": "a NUL character"}
_NOT_IN_HEADER = ", which an HTTP header value cannot carry"


def header_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent in an HTTP header (``Authorization: Bearer <key>``), or None. RFC 7230 allows
    visible ASCII, space and tab; obs-text (bytes >= 0x80) is obsolete, so non-ASCII is refused too, and trailing
    whitespace is stripped by the receiver. Never quotes the value: it is a secret."""
    for ch in value:
        if ch in _HEADER_PROBLEMS:
            return f"contains {_HEADER_PROBLEMS[ch]}{_NOT_IN_HEADER}"
        if ord(ch) > 0x7E:
            kind = "a non-ASCII character" if ord(ch) > 0x7F else "a control character (DEL)"
            return f"contains {kind}{_NOT_IN_HEADER}"
        if ord(ch) < 0x20 and ch != "\t":
            return f"contains a control character (0x{ord(ch):02x}){_NOT_IN_HEADER}"
    if value[-1:] in (" ", "\t"):
        return "ends with a space or tab, which HTTP strips from a header value (the key sent would differ)"
    return None


def api_key_issues(cfg: ServerConfig) -> list[Issue]:
    """API keys are sent as HTTP header values by every client (our readiness checks, the benchmark): one that
    cannot be is refused here, not found 30 s later as "not ready"."""
    issues = []
    for dest in sorted(set(API_KEYS) & set(cfg.args)):
        value = cfg.args[dest]
        problem = header_problem(value) if isinstance(value, str) else None
        if problem:
            issues.append(Issue(dest.replace("_", "-"), f"{problem}; not shown, as it is a secret"))
    return issues


def placement_issues(cfg: ServerConfig) -> list[Issue]:
    if "CUDA_VISIBLE_DEVICES" in cfg.env:
        return [Issue("specops.env.CUDA_VISIBLE_DEVICES", "set by specops from the GPUs the config declares: use "
                                                          "specops.gpus (or base-gpu-id) instead")]
    return []


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def int_at_least(cfg, key, low) -> list[Issue]:
    """Range check only: a non-integer is already reported by the flag table's type check."""
    v = cfg.args.get(key)
    if is_int(v) and v < low:
        return [Issue(key.replace("_", "-"), f"must be an integer >= {low}, got {v!r}")]
    return []
