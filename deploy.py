"""The main job: make the GPUs idle (later: start the speculative server with config X).

    pyinfra -y inventory/sim.py deploy.py                  # converge
    pyinfra inventory/sim.py deploy.py --dry               # show the stop plan, change nothing
    pyinfra -y inventory/sim.py deploy.py --data gpus=0,1 --data grace_s=5

Host data (or --data) read here: ``gpus`` (comma list or list), ``grace_s``, ``deadline_s``, ``users``.
"""
from pyinfra import host

from operations import gpu


def _indices(value):
    if value is None or isinstance(value, list):
        return value
    return [int(x) for x in str(value).split(",") if x.strip()]


gpu.idle(
    name="GPUs idle",
    gpus=_indices(host.data.get("gpus")),
    users=host.data.get("users"),
    grace_s=float(host.data.get("grace_s", 10)),
    deadline_s=float(host.data.get("deadline_s", 60)),
)
