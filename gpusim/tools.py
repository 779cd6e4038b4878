"""Per-host stand-in tools: DIR/bin/nvidia-smi, gpusim-snapshot, sglang-launch-server, sglang-bench-serving and
DIR/lib/libnvidia-ml.so.1."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

_WRAPPER = """#!/bin/sh
# gpusim stand-in, bound to one simulated host
GPUSIM_ROOT={root}; export GPUSIM_ROOT
PYTHONPATH={pkg}${{PYTHONPATH:+:$PYTHONPATH}}; export PYTHONPATH
exec {python} -S -c 'import sys; from gpusim import {module}; sys.exit({module}.{entry}(*{args}))' "$@"
"""


# name on DIR/bin, module, entry point, its arguments
TOOLS = (
    ("nvidia-smi", "smi", "main", "(sys.argv[1:],)"),
    ("gpusim-snapshot", "smi", "snapshot_main", "()"),
    ("sglang-launch-server", "sglang_server", "main", "(sys.argv[1:],)"),  # stands in for python -m sglang...
    ("sglang-bench-serving", "bench_serving", "main", "(sys.argv[1:],)"),  # ... and python -m sglang.bench_serving
)


def host_env(root: Path) -> dict[str, str]:
    """Environment additions that make a process see this simulated host (PATH and LD_LIBRARY_PATH prefixes)."""
    return {"PATH": str(root / "bin"), "LD_LIBRARY_PATH": str(root / "lib")}


def install_tools(root: Path, nvml: bool = True, seen_as: Path | None = None) -> None:
    """Write DIR/bin's wrappers (bound to ``seen_as``, default DIR: the path at which the host's own processes
    see DIR, e.g. a cluster host's bind mount) and, with ``nvml``, build DIR/lib/libnvidia-ml.so.1."""
    pkg = Path(__file__).resolve().parent.parent
    bindir = root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for name, module, entry, args in TOOLS:
        path = bindir / name
        path.write_text(_WRAPPER.format(root=shlex.quote(str((seen_as or root).resolve())), pkg=shlex.quote(str(pkg)),
                                        python=shlex.quote(sys.executable), module=module, entry=entry, args=args))
        path.chmod(0o755)
    if nvml:
        from .nvml_build import build_nvml
        build_nvml(root / "lib")
