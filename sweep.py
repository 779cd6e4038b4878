"""The benchmark sweep: for each config and each concurrency, GPUs idle -> server running with the config ->
ready -> /get_server_info snapshot -> benchmark -> result on the controller; then the report.

    pyinfra -y inventory/sim.py sweep.py                                            # defaults below
    pyinfra -y inventory/sim.py sweep.py --data configs=baseline-llama3.1-8b,eagle3-llama3.1-8b \\
        --data concurrency=1,4,16,64 --data results=sweep-results
    pyinfra inventory/sim.py sweep.py --dry                                         # what is left to measure

Host data (or --data): ``configs`` (names or paths, comma-separated), ``concurrency`` (levels), ``results``
(controller folder), ``num_prompts`` (per level; default max(8, 4 x concurrency)), ``input_len``,
``output_len`` (tokens per request), ``grace_s``, ``deadline_s``, ``users`` (as for deploy.py). Resumable: a
(config, level) whose result exists for the same config hash and workload is skipped, and a config with nothing
left is not even started. A config that fails (does not start, or a benchmark fails) does not stop the others;
the report lists what is missing and the run fails, and the next run fills it in.
"""
from pyinfra import host, inventory

from operations import multinode, server, sweep


def _list(value, kind=str):
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [kind(str(x).strip()) for x in items if str(x).strip()]


configs = _list(host.data.get("configs", "baseline-llama3.1-8b,eagle3-llama3.1-8b"))
levels = _list(host.data.get("concurrency", "1,2,4,8,16,32"), int)
results = str(host.data.get("results", "sweep-results"))
workload = dict(input_len=int(host.data.get("input_len", 1024)), output_len=int(host.data.get("output_len", 512)))
num_prompts = host.data.get("num_prompts")
target, _ = sweep.target_of(host, inventory)

for config in configs:
    server.check_inventory(config, inventory)  # every config's errors for every host, before anything runs

for config in configs:
    cfg = sweep.desired(config, host, inventory)
    todo = sweep.pending(results, target, cfg, [sweep.Workload.at(c, int(num_prompts) if num_prompts else None,
                                                                  **workload) for c in levels])
    if not todo:
        continue  # every level measured already for this config: not even started
    options = dict(config=config, users=host.data.get("users"), grace_s=float(host.data.get("grace_s", 10)),
                   idle_deadline_s=float(host.data.get("deadline_s", 120)), _ignore_errors=True)
    if host.data.get("specops_group"):
        multinode.running(**options)
    else:
        server.running(name=f"sweep: server running with config {cfg.name}", **options)
    for w in todo:
        sweep.benchmarked(name=f"sweep: benchmark {cfg.name} at concurrency {w.concurrency}", config=config,
                          concurrency=w.concurrency, results=results, num_prompts=w.num_prompts, **workload,
                          _ignore_errors=True)

sweep.reported(name="sweep: report", results=results, configs=configs, concurrency=levels)
