"""The main job: the speculative server running with config X (its GPUs made idle first).

    pyinfra -y inventory/sim.py deploy.py                                   # config eagle3-llama3.1-8b
    pyinfra -y inventory/sim.py deploy.py --data config=baseline-llama3.1-8b
    pyinfra inventory/sim.py deploy.py --data config=baseline-llama3.1-8b --dry --diff   # what would change
    pyinfra -y inventory/sim.py deploy.py --data config=none                # only: every GPU idle

Host data (or --data): ``config`` (name in configs/, a path, or ``none``), ``gpus`` (for config=none),
``grace_s``, ``deadline_s``, ``users`` (comma-separated patterns), ``force`` (start without gpu.idle first);
hosts with ``specops_group`` serve one model together (``multinode.running``), the others each run their own
(``server.running``). Every value is checked here (``operations.model.hostdata``), before any host is contacted.
"""
from pyinfra import host, inventory

from operations import gpu, multinode, server

from operations.model import hostdata

config = host.data.get("config", "eagle3-llama3.1-8b")
idle_only = config in (None, "", "none")
grace_s, deadline_s, users, force, gpus, _ = hostdata.gather(
    lambda: hostdata.number(host, "grace_s", 10),
    lambda: hostdata.number(host, "deadline_s", 60 if idle_only else 120),
    lambda: hostdata.patterns(host, "users"),
    lambda: hostdata.flag(host, "force", False),
    lambda: hostdata.indices(host, "gpus") if idle_only else None,
    lambda: hostdata.lock_wait_s(host),  # read by the host lock later, once the host has been contacted
)
if idle_only:
    gpu.idle(name="GPUs idle", gpus=gpus, users=users, grace_s=grace_s, deadline_s=deadline_s)
else:
    server.check_inventory(config, inventory)  # every host's config errors at once, before anything runs
    options = dict(
        config=config,
        users=users,
        grace_s=grace_s,
        idle_deadline_s=deadline_s,
        idle=not force,  # force=true: start without making the GPUs idle first
    )
    if host.data.get("specops_group"):
        multinode.running(**options)
    else:
        server.running(name=f"server running with config {config}", **options)
