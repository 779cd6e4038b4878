"""The host's engine decides: before an old server is stopped, the host's own SGLang (the launcher's Python)
parses the command line specops will start, with its own parser and ``--config`` loader (``engine_check.py``).
A rejected flag fails the host with SGLang's own message; a version other than the bundled flag table's is said.
"""
from __future__ import annotations

import json

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from operations.controller import supervisors
from operations.controller.remote import guarded, host_python, python_script
from operations.errors import ConfigError, Issue
from operations.model import hostdata
from operations.model.server_config import ServerConfig
from operations.model.engine_check import EngineCheck, cache_key, check_input


def engine_python(cfg: ServerConfig, on_host) -> str | None:
    """The interpreter the server is launched with: host data ``specops_engine_python``, else the launcher's own
    Python when it is ``PYTHON -m MODULE`` (SGLang's documented form); None for other launchers."""
    named = on_host.data.get("specops_engine_python")
    if named:
        return str(named)
    launcher = list(cfg.launcher)
    return launcher[0] if len(launcher) >= 3 and launcher[1] == "-m" else None


class EngineParse(FactBase):
    """
    What the host's own SGLang says of a command line: ``version``, ``ok`` and its parser's ``error`` (a JSON
    document). Give ``config`` (a name in configs/ or a path) to check the command line ``server.running`` would
    start on this host, or ``python``, ``flags`` and ``engine_yaml`` to check exactly those.

    + config: the config whose command line is checked (default: host data ``config``)
    + python: the engine's interpreter on the host (default: the config's launcher Python, or host data
      ``specops_engine_python``)
    + flags: the command line's flags (a list, or its JSON; secrets replaced)
    + engine_yaml: the ``--config`` file's content

    **Example:** ``pyinfra inventory/sim.py fact operations.facts.engine.EngineParse config=eagle3-llama3.1-8b``
    """

    def command(self, config: str | None = None, python: str | None = None, flags: str | None = None,
                engine_yaml: str | None = None):
        if flags is None:
            python, flags, engine_yaml = _from_config(config, python)
        elif not isinstance(flags, str):  # the CLI hands ``flags=[...]`` over as a list
            flags = json.dumps(list(flags))
        missing = json.dumps({"ok": False, "version": None, "error": f"{python} not found on the host"})
        key = cache_key(python, flags, engine_yaml or "")  # the host keeps the verdict for observe
        return guarded(python, python_script(python, "engine_check.py", flags, engine_yaml, key, install=True), missing)

    def process(self, output: list[str]) -> dict:
        try:
            doc = json.loads(output[-1])
        except (ValueError, IndexError) as exc:
            raise FactProcessError(f"unreadable engine check: {exc}") from exc
        return doc if isinstance(doc, dict) else {"ok": False, "error": "unreadable engine check"}


def _from_config(config, python):
    from pyinfra import host  # the host this fact is read on (the CLI and operations both set it)

    config = config or host.data.get("config")
    if not config:
        raise ConfigError([Issue("config", "EngineParse needs config=NAME (or python=, flags= and engine_yaml=)",
                                 host.name)])
    cfg = hostdata.config_for(config, host)
    python = python or engine_python(cfg, host)
    if python is None:
        raise ConfigError([Issue("launcher", f"{cfg.launcher}: not `PYTHON -m MODULE`; give python=", host.name)])
    yaml_path = supervisors.for_host("llm", None, None, host_python(None, host), host).path("engine.yaml")
    return (python, *check_input(cfg, yaml_path))


def engine_key(cfg: ServerConfig, config_path: str, on_host) -> str | None:
    """The key of the host's kept verdict on the command line ``cfg`` starts (``HostView(engine_key=...)``), or
    None when the host's engine is not asked."""
    python = engine_python(cfg, on_host) if cfg.engine == "sglang" else None
    return None if python is None else cache_key(python, *check_input(cfg, config_path))


def check_engine(cfg: ServerConfig, config_path: str, on_host, kept: dict | None = None) -> EngineCheck:
    """Ask the host's engine (SGLang only: vLLM's turn is its own issue); no interpreter named: nothing asked.
    ``kept``: the verdict the host kept from an earlier check of this command line by the same, unchanged engine
    (``HostView``'s ``engine``), used instead of parsing again."""
    python = engine_python(cfg, on_host) if cfg.engine == "sglang" else None
    if python is None:
        return EngineCheck(None)
    if isinstance(kept, dict) and isinstance(kept.get("ok"), bool):
        doc = kept
    else:
        flags, engine_yaml = check_input(cfg, config_path)
        doc = on_host.get_fact(EngineParse, python=python, flags=flags, engine_yaml=engine_yaml)
    return EngineCheck(python, doc.get("version"), bool(doc.get("ok")), doc.get("error"))
