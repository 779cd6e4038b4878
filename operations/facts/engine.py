"""The host's engine decides: before an old server is stopped, the host's own SGLang (the launcher's Python)
parses the command line specops will start, with its own parser and ``--config`` loader (``engine_check.py``).
A rejected flag fails the host with SGLang's own message; a version other than the bundled flag table's is said.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from operations.model.engines import sglang_args
from operations.model.config import ServerConfig
from operations.model.engines import SecretRef, engine_for
from operations.controller.remote import guarded, python_script


@dataclass(frozen=True)
class EngineCheck:
    python: str | None  # the interpreter asked; None: the launcher does not name one (nothing was asked)
    version: str | None = None
    ok: bool = True
    error: str | None = None

    @property
    def skipped(self) -> str | None:
        """Why nothing was asked (said in the plan, so a skipped check is never mistaken for a passed one)."""
        if self.python is None:
            return ("the host's SGLang was not asked to parse the command line: the launcher is not "
                    "`PYTHON -m MODULE` (set host data specops_engine_python to name its interpreter)")
        return None

    @property
    def skew(self) -> str | None:
        """A note when the host runs another SGLang than the flag table specops validated against."""
        if self.ok and self.version and self.version != sglang_args.SGLANG_VERSION:
            return (f"the host runs SGLang {self.version}; specops' flag table is {sglang_args.SGLANG_VERSION} "
                    f"(the host's parser accepted the command line; regenerate the table with "
                    f"scripts/sglang_table.py to validate against {self.version} before contact)")
        return None

    @property
    def notes(self) -> list[str]:
        """What the plan says of the check besides a refusal: a version skew, or that nothing was asked."""
        return [n for n in (self.skew, self.skipped) if n]

    @property
    def problem(self) -> str | None:
        if self.ok:
            return None
        version = f"SGLang {self.version}" if self.version else "SGLang"
        return f"the host's {version} ({self.python}) refuses the command line: {self.error}"


def engine_python(cfg: ServerConfig, on_host) -> str | None:
    """The interpreter the server is launched with: host data ``specops_engine_python``, else the launcher's own
    Python when it is ``PYTHON -m MODULE`` (SGLang's documented form); None for other launchers."""
    named = on_host.data.get("specops_engine_python")
    if named:
        return str(named)
    launcher = list(cfg.launcher)
    return launcher[0] if len(launcher) >= 3 and launcher[1] == "-m" else None


def check_input(cfg: ServerConfig, config_path: str) -> tuple[str, str]:
    """(the flags as JSON, the engine file) that the host's parser is given; secrets as a placeholder."""
    engine = engine_for(cfg.engine)
    argv = engine.launch_argv(cfg, config_path)[len(cfg.launcher):]
    flags = [f"{a.prefix}<secret>" if isinstance(a, SecretRef) else str(a) for a in argv]
    return json.dumps(flags), engine.engine_yaml(cfg) or ""


class EngineCheckFact(FactBase):
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
    doc = on_host.get_fact(EngineCheckFact, python=python, flags=flags, engine_yaml=engine_yaml)
    return EngineCheck(python, doc.get("version"), bool(doc.get("ok")), doc.get("error"))
