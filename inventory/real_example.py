"""Example inventory for real GPU nodes (copy and edit; nothing here is simulated).

Two groups:

- ``llama70b``: two 8-GPU nodes serving one model together (``multinode.running``): same ``specops_group``;
  ranks follow this list (or set ``specops_rank`` on each); rank 0's ``specops_dist_host`` is the address the
  other ranks reach it at (its fast-fabric IP), port ``specops_dist_port``.
- ``replicas``: independent nodes, each running its own server (``server.running``); roll them out a few at a
  time with ``pyinfra inventory/real_example.py deploy.py --limit replicas --parallel 2``.

``specops_python`` should be the serving venv's interpreter (it has pynvml and SGLang); the default launcher is
``<specops_python> -m sglang.launch_server``. Secrets come from the controller's environment (``${HF_TOKEN}`` in a
config), never from this file.

    pyinfra inventory/real_example.py deploy.py --limit llama70b --data config=eagle3-llama3.1-70b-2node --dry --diff
"""

_common = {
    "ssh_user": "ubuntu",
    "_sudo": True,
    "specops_python": "/opt/sglang/.venv/bin/python",
    "specops_supervisor": "systemd",
    "gpu_count": 8,
}

llama70b = [
    ("gpu-a01.example.internal", {**_common, "specops_group": "llama70b", "specops_dist_host": "10.10.0.11",
                                  "specops_dist_port": 20000}),
    ("gpu-a02.example.internal", {**_common, "specops_group": "llama70b"}),
]

replicas = [
    (f"gpu-b{i:02d}.example.internal", {**_common, "config": "eagle3-llama3.1-8b"}) for i in range(1, 5)
]
