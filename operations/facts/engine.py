"""The host's engine decides: before an old server is stopped, the host's own SGLang (the launcher's Python)
parses the command line specops will start, with its own parser and ``--config`` loader (``engine_check.py``).
A rejected flag fails the host with SGLang's own message; a version other than the bundled flag table's is said.
"""
from __future__ import annotations

import json

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from operations.controller.remote import guarded, python_script
from operations.model.server_config import ServerConfig
from operations.model.engine_check import EngineCheck, check_input


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
    What the host's own SGLang says of a command line: ``version``, ``ok`` and its parser's ``error``.

    + python: the engine's interpreter on the host
    + flags: the command line's flags (JSON list, secrets replaced)
    + engine_yaml: the ``--config`` file's content
    """

    def command(self, python: str, flags: str, engine_yaml: str):
        missing = json.dumps({"ok": False, "version": None, "error": f"{python} not found on the host"})
        return guarded(python, python_script(python, "engine_check.py", flags, engine_yaml), missing)

    def process(self, output: list[str]) -> dict:
        try:
            doc = json.loads(output[-1])
        except (ValueError, IndexError) as exc:
            raise FactProcessError(f"unreadable engine check: {exc}") from exc
        return doc if isinstance(doc, dict) else {"ok": False, "error": "unreadable engine check"}


def check_engine(cfg: ServerConfig, config_path: str, on_host) -> EngineCheck:
    """Ask the host's engine (SGLang only: vLLM's turn is its own issue); no interpreter named: nothing asked."""
    python = engine_python(cfg, on_host) if cfg.engine == "sglang" else None
    if python is None:
        return EngineCheck(None)
    flags, engine_yaml = check_input(cfg, config_path)
    doc = on_host.get_fact(EngineParse, python=python, flags=flags, engine_yaml=engine_yaml)
    return EngineCheck(python, doc.get("version"), bool(doc.get("ok")), doc.get("error"))
