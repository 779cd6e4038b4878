"""The simulated host's ``sglang`` (gpusim/engine/README.md). ``__version__`` is the host's ``sglang_version``
(``$GPUSIM_ROOT/host.json``, default 0.5.23)."""
import json as _json
import os as _os
import sys as _sys
from pathlib import Path as _Path

_checkout = str(_Path(__file__).resolve().parents[3])  # the directory holding gpusim (a checkout or site-packages)
if _checkout not in _sys.path:
    _sys.path.append(_checkout)


def _version() -> str:
    root = _os.environ.get("GPUSIM_ROOT")
    try:
        host = _json.loads(_Path(root, "host.json").read_text()) if root else {}
    except (OSError, ValueError):
        host = {}
    return str(host.get("sglang_version") or "0.5.23")


__version__ = _version()
