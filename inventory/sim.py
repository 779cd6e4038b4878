"""The embedded default: one simulated GPU host on this machine (pyinfra's @local connector).

The simulated host lives in ``$GPUSIM_ROOT`` (default ``.gpusim/host`` in the repository; ``python -m gpusim init``
creates it). Only this inventory knows it is simulated: it puts the stand-in ``nvidia-smi`` first on PATH and the
stand-in ``libnvidia-ml.so.1`` on LD_LIBRARY_PATH, runs the probe with this Python (which has pynvml), launches
the SGLang-API stand-in where real hosts run ``python3 -m sglang.launch_server`` (and its benchmark client
for ``python3 -m sglang.bench_serving``), keeps server state under the simulated host's directory, and names its
GPU device files (``DIR/dev/nvidia*``, what its simulated CUDA processes hold open, as real ones hold /dev/nvidia*).
"""
import os
import sys
from pathlib import Path

_root = Path(os.environ.get("GPUSIM_ROOT", Path(__file__).resolve().parent.parent / ".gpusim" / "host")).resolve()
_env = {
    "PATH": f"{_root / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    "LD_LIBRARY_PATH": str(_root / "lib"),
}

sim = [("@local", {
    "_env": _env,
    "specops_python": sys.executable,
    "specops_state_dir": str(_root / "servers"),
    "specops_gpu_devices": str(_root / "dev" / "nvidia*"),  # what its simulated CUDA processes hold open
    "specops_launchers": {"sglang": [str(_root / "bin" / "sglang-launch-server")]},
    "specops_bench_runner": [str(_root / "bin" / "sglang-bench-serving")],
})]
