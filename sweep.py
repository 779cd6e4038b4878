"""The benchmark sweep: for each config and each concurrency, GPUs idle -> server running with the config ->
ready -> /server_info snapshot -> benchmark -> result on the controller; then the report.

    pyinfra -y inventory/sim.py sweep.py                                            # defaults below
    pyinfra -y inventory/sim.py sweep.py --data configs=baseline-llama3.1-8b,eagle3-llama3.1-8b \\
        --data concurrency=1,4,16,64 --data results=sweep-results
    pyinfra inventory/sim.py sweep.py --dry                                         # what is left to measure

Host data (or --data): ``configs`` (names or paths, comma-separated), ``concurrency`` (levels), ``results``
(controller folder), ``num_prompts`` (per level; default max(8, 4 x concurrency)), ``input_len``,
``output_len`` (tokens per request), ``timeout_s`` (per benchmark run, default 3600), ``grace_s``,
``deadline_s``, ``users`` (as for deploy.py); every value is checked before any host is contacted. Resumable: a
(config, level) whose result exists for the same config hash and workload is skipped, and a config with nothing
left is not even started. A config that fails (does not start, or a benchmark fails) does not stop the others;
the report lists what is missing and the run fails, and the next run fills it in.
"""
from pyinfra import host, inventory

from operations import multinode, server, sweep

from operations.model import hostdata

configs, levels, num_prompts, input_len, output_len, timeout_s, grace_s, deadline_s, users, _ = hostdata.gather(
    lambda: hostdata.patterns(host, "configs", "baseline-llama3.1-8b,eagle3-llama3.1-8b"),
    lambda: hostdata.integers(host, "concurrency", "1,2,4,8,16,32", low=1),
    lambda: hostdata.integer(host, "num_prompts", None, low=1),
    lambda: hostdata.integer(host, "input_len", 1024, low=1),
    lambda: hostdata.integer(host, "output_len", 512, low=1),
    lambda: hostdata.number(host, "timeout_s", 3600, low=1),
    lambda: hostdata.number(host, "grace_s", 10),
    lambda: hostdata.number(host, "deadline_s", 120),
    lambda: hostdata.patterns(host, "users"),
    lambda: hostdata.lock_wait_s(host),  # read by the host lock later, once the host has been contacted
)
results = str(host.data.get("results", "sweep-results"))
workload = dict(input_len=input_len, output_len=output_len)
target, _ = sweep.target_of(host, inventory)

for config in configs:
    server.check_inventory(config, inventory)  # every config's errors for every host, before anything runs

for config in configs:
    cfg = sweep.desired(config, host, inventory)
    todo = sweep.pending(results, target, cfg, [sweep.Workload.at(c, num_prompts, **workload) for c in levels])
    if not todo:
        continue  # every level measured already for this config: not even started
    options = dict(config=config, users=users, grace_s=grace_s, idle_deadline_s=deadline_s, _ignore_errors=True)
    if host.data.get("specops_group"):
        multinode.running(**options)
    else:
        server.running(name=f"sweep: server running with config {cfg.name}", **options)
    for w in todo:
        sweep.benchmarked(name=f"sweep: benchmark {cfg.name} at concurrency {w.concurrency}", config=config,
                          concurrency=w.concurrency, results=results, num_prompts=w.num_prompts, **workload,
                          timeout_s=timeout_s, _ignore_errors=True)

sweep.reported(name="sweep: report", results=results, configs=configs, concurrency=levels)
