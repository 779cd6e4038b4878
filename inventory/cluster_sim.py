"""The simulated cluster: K GPU hosts on this machine, each a network namespace with its own sshd, reached
over real SSH (pyinfra's ssh connector, key auth, checked host keys).

Bring it up first (as root), then deploy; the hosts are replicas unless given a multi-node group:

    sudo .venv/bin/python -m gpusim cluster up .gpusim/cluster --hosts 3 --gpus 4
    pyinfra -y inventory/cluster_sim.py deploy.py                                  # a server on every host
    pyinfra -y inventory/cluster_sim.py deploy.py --parallel 2 ...                 # rolling, 2 at a time
    pyinfra -y inventory/cluster_sim.py deploy.py --data specops_group=llama --data config=PATH   # one model
    sudo .venv/bin/python -m gpusim cluster down .gpusim/cluster

It reads ``$SPECOPS_CLUSTER`` (default ``.gpusim/cluster/cluster.json``), which ``cluster up`` writes: each
host's address, SSH key and known_hosts, and the same paths on every host (the simulator's bin/lib and server
state, bind-mounted per host), as real nodes of one image would have.
"""
import json
import os
from pathlib import Path

_path = Path(os.environ.get("SPECOPS_CLUSTER",
                            Path(__file__).resolve().parent.parent / ".gpusim" / "cluster" / "cluster.json"))
if not _path.exists():
    raise SystemExit(f"no simulated cluster at {_path}: run `sudo .venv/bin/python -m gpusim cluster up "
                     f"{_path.parent}` first (or set SPECOPS_CLUSTER)")

nodes = [(name, data) for name, data in json.loads(_path.read_text())["hosts"]]
