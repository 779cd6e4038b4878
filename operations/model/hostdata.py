"""Typed readers for host data (inventory, group data, ``--data``) and checkers for operation arguments.

A bad value is a :class:`ConfigError` naming the host and the key, raised while the deploy file runs, so before
any host is contacted; never a traceback from a bare ``float()``, and never a value that parses but means
"wait forever" (``inf``) or "never time out" (``nan``: every comparison with it is false).

pyinfra's CLI hands ``--data`` values over already parsed: ``1`` is an int, ``true`` a bool, ``[0, 1]`` JSON,
anything else a string (``nan``, ``0,1``, ``root,alice``). Every list-valued value is split the same way: a
string on commas (``users=root,alice`` is two patterns, as ``gpus=0,1`` is two GPUs), a list passes through.

    number(host, key, default, *, low=0, finite=True)   float, finite and >= low
    integer(host, key, default, *, low=0)               int >= low
    integers(host, key, default, *, low=1)              a list of ints >= low (benchmark concurrency levels)
    indices(host, key, default=None)                    distinct GPU indices, or None (all GPUs)
    patterns(host, key, default=None)                   user/name patterns (or config names), or None
    flag(host, key, default=False)                      true/false, 1/0, yes/no, on/off
    lock_wait_s(host)                                   ``specops_lock_wait_s`` (default 300 s)
    gather(*readers)                                    run every reader, raise one error listing them all

The ``as_*`` functions check a value already in hand (an operation argument) the same way.
"""
from __future__ import annotations

import math
from dataclasses import replace

from operations.errors import Issue
from operations.errors import ConfigError
from operations.model.config import load
from operations.model.server_config import DEFAULT_LAUNCHER, ServerConfig

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _name(on_host) -> str:
    return getattr(on_host, "name", None) or "*"


def _refuse(on_host, key: str, message: str):
    raise ConfigError([Issue(key, message, _name(on_host))])


def split(value) -> list | None:
    """``"a,b"`` -> ``["a", "b"]`` (blanks dropped), a list or tuple -> a list, a scalar -> ``[scalar]``;
    None stays None (unset)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return [value]


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --- checkers: a value in hand ---------------------------------------------------------------------------------

def as_number(on_host, key: str, value, *, low=0, finite=True) -> float:
    """``value`` as a float (numbers, or strings that spell one) that is finite and >= ``low``."""
    wanted = f"must be a {'finite ' if finite else ''}number >= {low}, got {value!r}"
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            _refuse(on_host, key, wanted)
    elif _is_real(value):
        number = float(value)
    else:
        _refuse(on_host, key, wanted)
    if math.isnan(number) or (finite and math.isinf(number)) or number < low:
        _refuse(on_host, key, wanted)
    return number


def _int_or_none(value) -> int | None:
    if isinstance(value, str):
        value = value.strip()
        digits = value[1:] if value.startswith("-") else value
        return int(value) if digits.isascii() and digits.isdigit() else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def as_integer(on_host, key: str, value, *, low=0) -> int:
    number = _int_or_none(value)
    if number is None or number < low:
        _refuse(on_host, key, f"must be an integer >= {low}, got {value!r}")
    return number


def _integer_list(value, low: int) -> list[int] | None:
    """``1,2,4`` or ``[1, 2, 4]`` as integers >= low, or None when it is not such a (non-empty) list."""
    numbers = [_int_or_none(item) for item in split(value) or []]
    return numbers if numbers and all(n is not None and n >= low for n in numbers) else None


def as_integers(on_host, key: str, value, *, low=1) -> list[int]:
    numbers = _integer_list(value, low)
    if numbers is None:
        _refuse(on_host, key, f"must be comma-separated integers >= {low}, e.g. 1,2,4, got {value!r}")
    return numbers


def as_indices(on_host, key: str, value) -> list[int] | None:
    """GPU indices (``0,1``, ``[0, 1]``, ``0``); None stays None (all GPUs)."""
    if value is None:
        return None
    numbers = _integer_list(value, 0)
    if numbers is None or len(set(numbers)) != len(numbers):
        _refuse(on_host, key, f"{value!r}: use comma-separated distinct GPU indices (integers >= 0), e.g. 0,1")
    return numbers


def as_patterns(on_host, key: str, value) -> list[str] | None:
    """Names or fnmatch patterns (``root,alice`` or ``["root", "alice"]``); None stays None (the default)."""
    if value is None:
        return None
    items = split(value)
    if not items or not all(isinstance(item, str) and item for item in items):
        _refuse(on_host, key, f"must be comma-separated names or patterns, e.g. root,sglang, got {value!r}")
    return items


def as_flag(on_host, key: str, value) -> bool:
    """A yes/no: ``force=no`` is a string, and a string is true in Python; here it means False."""
    if isinstance(value, bool):
        return value
    spelled = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if spelled in _TRUE or spelled in _FALSE:
        return spelled in _TRUE
    _refuse(on_host, key, f"must be true or false (also 1/0, yes/no, on/off), got {value!r}")


def as_port(on_host, value, key: str = "port") -> int:
    """A TCP port 1-65535 (the CLI hands ``port=0`` over as 0 or "0"); 0 would match no server at all."""
    number = _int_or_none(value)
    if number is None or not 1 <= number <= 65535:
        _refuse(on_host, key, f"port must be an integer 1-65535, got {value!r}")
    return number


# --- readers: host data ------------------------------------------------------------------------------------------

def _get(on_host, key: str, default):
    value = on_host.data.get(key)
    return default if value is None else value


def number(on_host, key: str, default, *, low=0, finite=True) -> float:
    return as_number(on_host, key, _get(on_host, key, default), low=low, finite=finite)


def integer(on_host, key: str, default, *, low=0) -> int | None:
    value = _get(on_host, key, default)
    return None if value is None else as_integer(on_host, key, value, low=low)


def integers(on_host, key: str, default, *, low=1) -> list[int]:
    return as_integers(on_host, key, _get(on_host, key, default), low=low)


def indices(on_host, key: str, default=None) -> list[int] | None:
    return as_indices(on_host, key, _get(on_host, key, default))


def patterns(on_host, key: str, default=None) -> list[str] | None:
    return as_patterns(on_host, key, _get(on_host, key, default))


def flag(on_host, key: str, default=False) -> bool:
    return as_flag(on_host, key, _get(on_host, key, default))


def lock_wait_s(on_host) -> float:
    """How long a run waits for another run's host lease (host data ``specops_lock_wait_s``, default 300 s)."""
    return number(on_host, "specops_lock_wait_s", 300)


def gather(*readers):
    """The values of ``readers`` (callables), or one ConfigError listing every bad value, not just the first."""
    values, issues = [], []
    for read in readers:
        try:
            values.append(read())
        except ConfigError as exc:
            issues += exc.issues
            values.append(None)
    if issues:
        raise ConfigError(issues)
    return values


def config_for(config, on_host) -> ServerConfig:
    """A ServerConfig, or a config name/path loaded from configs/, as ``on_host`` runs it: host data
    ``specops_launchers`` ({engine: argv}) replaces the engine's default launcher."""
    cfg = config if isinstance(config, ServerConfig) else load(str(config))
    launchers = on_host.data.get("specops_launchers") or {}
    if cfg.engine in launchers and cfg.launcher == DEFAULT_LAUNCHER.get(cfg.engine):
        cfg = replace(cfg, launcher=tuple(launchers[cfg.engine]))
    return cfg
