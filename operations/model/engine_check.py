"""What the host's own engine says of the command line specops will start (``facts.engine.EngineParse``)."""
from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass

from operations.model.server_config import ServerConfig
from operations.model.engines import SecretRef, engine_for, sglang_args


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


def check_input(cfg: ServerConfig, config_path: str) -> tuple[str, str]:
    """(the flags as JSON, the engine file) that the host's parser is given; secrets as a placeholder."""
    engine = engine_for(cfg.engine)
    # as the server is started: the files the config ships beside engine.yaml
    cfg = cfg.placed(posixpath.dirname(config_path)) if config_path else cfg
    argv = engine.launch_argv(cfg, config_path)[len(cfg.launcher):]
    flags = [f"{a.prefix}<secret>" if isinstance(a, SecretRef) else str(a) for a in argv]
    return json.dumps(flags), engine.engine_yaml(cfg) or ""


def cache_key(python: str, flags: str, engine_yaml: str) -> str:
    """The name under which the host keeps its engine's verdict on this command line (``engine_cache``)."""
    return hashlib.sha256(json.dumps([python, flags, engine_yaml]).encode()).hexdigest()[:24]
