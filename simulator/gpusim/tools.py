"""Per-host stand-in tools: DIR/bin/python (the host's Python, with the stand-in ``sglang`` distribution of
gpusim/engine), nvidia-smi, gpusim-snapshot, sglang-launch-server, sglang-bench-serving and
DIR/lib/libnvidia-ml.so.1; and :func:`host_data`, the pyinfra host data that points specops at them."""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

_WRAPPER = """#!/bin/sh
# gpusim stand-in, bound to one simulated host
GPUSIM_ROOT={root}; export GPUSIM_ROOT
PYTHONPATH={pkg}${{PYTHONPATH:+:$PYTHONPATH}}; export PYTHONPATH
exec {python}{flags} -c 'import sys; from gpusim import {module}; sys.exit({module}.{entry}(*{args}))' "$@"
"""

_PYTHON = """#!/bin/sh
# gpusim: the Python of one simulated host, whose site has SGLang (the stand-in of gpusim/engine/sglang):
# python -m sglang.launch_server ..., python -c 'import sglang; ...' work as on a real GPU host
GPUSIM_ROOT={root}; export GPUSIM_ROOT
PYTHONPATH={engine}${{PYTHONPATH:+:$PYTHONPATH}}; export PYTHONPATH
exec {python} "$@"
"""

ENGINE_DIR = Path(__file__).resolve().parent / "engine"  # holds the stand-in ``sglang`` package

# name on DIR/bin, module, entry point, its arguments, interpreter flags (-S: no site, a faster start, where the
# tool needs nothing from site-packages; the server reads YAML, so it keeps its site)
TOOLS = (
    ("nvidia-smi", "smi", "main", "(sys.argv[1:],)", " -S"),
    ("gpusim-snapshot", "smi", "snapshot_main", "()", " -S"),
    ("sglang-launch-server", "sglang_server", "main", "(sys.argv[1:],)", ""),  # older inventories; see bin/python
    ("sglang-bench-serving", "bench_serving", "main", "(sys.argv[1:],)", " -S"),  # python -m sglang.bench_serving
)

STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def host_env(root: Path) -> dict[str, str]:
    """Environment additions that make a process see this simulated host (PATH and LD_LIBRARY_PATH prefixes)."""
    return {"PATH": str(root / "bin"), "LD_LIBRARY_PATH": str(root / "lib")}


def host_data(root, path: str | None = None) -> dict:
    """The pyinfra host data of the simulated host whose directory its processes see at ``root``: its
    ``_env`` (``root/bin`` first on PATH, then ``path``, default this process's PATH; ``root/lib`` as
    LD_LIBRARY_PATH), the probe's Python, the state directory, the GPU device files, the SGLang launcher
    (``root/bin/python -m sglang.launch_server``, as on a real host) and the benchmark client. One shape for
    inventory/sim.py, gpusim/cluster.py and the wheel test."""
    root = str(root)
    tail = os.environ.get("PATH", "/usr/bin:/bin") if path is None else path
    return {
        "_env": {"PATH": f"{root}/bin:{tail}", "LD_LIBRARY_PATH": f"{root}/lib"},
        "specops_python": sys.executable,
        "specops_state_dir": f"{root}/servers",
        "specops_gpu_devices": f"{root}/dev/nvidia*",  # what its simulated CUDA processes hold open
        "specops_launchers": {"sglang": [f"{root}/bin/python", "-m", "sglang.launch_server"]},
        "specops_bench_runner": [f"{root}/bin/sglang-bench-serving"],
    }


def install_tools(root: Path, nvml: bool = True, seen_as: Path | None = None) -> None:
    """Write DIR/bin's wrappers (bound to ``seen_as``, default DIR: the path at which the host's own processes
    see DIR, e.g. a cluster host's bind mount) and, with ``nvml``, build DIR/lib/libnvidia-ml.so.1."""
    pkg = Path(__file__).resolve().parent.parent
    bound = shlex.quote(str((seen_as or root).resolve()))
    bindir = root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for name, module, entry, args, flags in TOOLS:
        path = bindir / name
        path.write_text(_WRAPPER.format(root=bound, pkg=shlex.quote(str(pkg)), python=shlex.quote(sys.executable),
                                        flags=flags, module=module, entry=entry, args=args))
        path.chmod(0o755)
    python = bindir / "python"
    python.write_text(_PYTHON.format(root=bound, engine=shlex.quote(str(ENGINE_DIR)),
                                     python=shlex.quote(sys.executable)))
    python.chmod(0o755)
    if nvml:
        from .nvml_build import build_nvml
        build_nvml(root / "lib")
