"""Files a config names that travel with it: SGLang's ``speculative-adaptive-config`` given as a path relative to the
config file is read on the controller, checked (``engines.adaptive``), uploaded into the server's directory with the
launch files, and its content made part of the config's version (a changed table restarts the server). An
absolute path names a file already on the host: it is passed on as it is, unread and unchecked."""
from __future__ import annotations

from pathlib import Path

from operations.errors import ConfigError, Issue
from operations.model.engines import adaptive
from operations.model.server_config import ShippedFile
from operations.remote.common import SHIPPED_FILES

# dest -> (the leaf in the server's directory, the checker of its text: (parsed, problems))
SHIPPABLE = {"speculative_adaptive_config": (SHIPPED_FILES["speculative_adaptive_config"], adaptive.parse)}


def ship(engine: str, args: dict, base: Path | None, read) -> tuple[tuple, list[Issue]]:
    """(the ShippedFile of every shippable argument, the issues found) for a config read from directory ``base``
    (None: built in Python, where a relative path has nothing to be relative to); ``read(path)`` returns a file's
    text or raises ConfigError (the config reader's limits: a regular UTF-8 file of at most 1 MiB)."""
    files, issues = [], []
    for dest, (leaf, check) in SHIPPABLE.items():
        value = args.get(dest)
        if engine != "sglang" or not isinstance(value, str) or value.startswith("/"):
            continue
        field = dest.replace("_", "-")
        if base is None:
            issues.append(Issue(field, f"{value!r} is relative: give an absolute path on the host, or load the "
                                       f"config from a file (a relative path is read beside it and uploaded)"))
            continue
        try:
            text = read(base / value)
        except FileNotFoundError:
            issues.append(Issue(field, f"{base / value}: no such file (a relative path is read beside the config)"))
            continue
        except ConfigError as exc:
            issues += [Issue(field, i.message) for i in exc.issues]
            continue
        except OSError as exc:
            issues.append(Issue(field, f"{base / value}: cannot be read: {exc.strerror or type(exc).__name__}"))
            continue
        issues += [Issue(field, f"{value}: {problem}") for problem in check(text)[1]]
        files.append(ShippedFile(dest, leaf, text))
    return tuple(files), issues
