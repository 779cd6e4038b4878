"""The embedded default: one simulated GPU host on this machine (pyinfra's @local connector).

The simulated host lives in ``$GPUSIM_ROOT`` (default ``.gpusim/host`` in the repository; ``python -m gpusim init``
creates it). Only this inventory knows it is simulated: it puts the stand-in ``nvidia-smi`` first on PATH and the
stand-in ``libnvidia-ml.so.1`` on LD_LIBRARY_PATH, runs the probe with this Python (which has pynvml), launches
SGLang as real hosts do, ``DIR/bin/python -m sglang.launch_server`` (the host's Python, whose ``sglang`` is the
SGLang-API stand-in; and its benchmark client for ``python3 -m sglang.bench_serving``), keeps server state under
the simulated host's directory, and names its GPU device files (``DIR/dev/nvidia*``, what its simulated CUDA
processes hold open, as real ones hold /dev/nvidia*).
"""
import os
import sys
from pathlib import Path

_repo = Path(__file__).resolve().parent.parent
for _path in (_repo, _repo / "simulator"):  # pyinfra puts its working directory on sys.path, not this checkout
    if str(_path) not in sys.path:
        sys.path.append(str(_path))
from gpusim.tools import host_data as _host_data  # noqa: E402  (the simulator's own description of its host)

_root = Path(os.environ.get("GPUSIM_ROOT", _repo / ".gpusim" / "host")).resolve()

# _env, specops_python, specops_state_dir, specops_gpu_devices (DIR/dev/nvidia*), specops_launchers
# ({"sglang": [DIR/bin/python, -m, sglang.launch_server]}) and specops_bench_runner
sim = [("@local", _host_data(_root))]
