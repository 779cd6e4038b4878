"""The main job: the speculative server running with config X (its GPUs made idle first).

    pyinfra -y inventory/sim.py deploy.py                                   # config eagle3-llama3.1-8b
    pyinfra -y inventory/sim.py deploy.py --data config=baseline-llama3.1-8b
    pyinfra inventory/sim.py deploy.py --data config=baseline-llama3.1-8b --dry --diff   # what would change
    pyinfra -y inventory/sim.py deploy.py --data config=none                # only: every GPU idle

Host data (or --data): ``config`` (name in configs/, a path, or ``none``), ``gpus`` (for config=none),
``grace_s``, ``deadline_s``, ``users``, ``force`` (start without gpu.idle first); hosts with ``specops_group``
serve one model together (``multinode.running``), the others each run their own (``server.running``).
"""
from pyinfra import host, inventory

from operations import gpu, multinode, server
from operations.config import Issue
from operations.errors import ConfigError


def _indices(value):
    if value is None or isinstance(value, list):
        return value
    try:
        return [int(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        raise ConfigError([Issue("gpus", f"{value!r}: use comma-separated GPU indices, e.g. 0,1", host.name)]) from None


config = host.data.get("config", "eagle3-llama3.1-8b")
if config in (None, "", "none"):
    gpu.idle(
        name="GPUs idle",
        gpus=_indices(host.data.get("gpus")),
        users=host.data.get("users"),
        grace_s=float(host.data.get("grace_s", 10)),
        deadline_s=float(host.data.get("deadline_s", 60)),
    )
else:
    server.check_inventory(config, inventory)  # every host's config errors at once, before anything runs
    options = dict(
        config=config,
        users=host.data.get("users"),
        grace_s=float(host.data.get("grace_s", 10)),
        idle_deadline_s=float(host.data.get("deadline_s", 120)),
        idle=not host.data.get("force", False),  # force=true: start without making the GPUs idle first
    )
    if host.data.get("specops_group"):
        multinode.running(**options)
    else:
        server.running(name=f"server running with config {config}", **options)
