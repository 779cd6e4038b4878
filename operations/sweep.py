"""Benchmark sweeps: ``sweep.benchmarked`` (one config at one concurrency, measured and collected to the controller)
and ``sweep.reported`` (the comparison table, CSV, plot and crossover), composed by ``sweep.py`` at the top level.

Results live on the controller, one JSON file per (target, config, concurrency):
``RESULTS/<host or group>/<config name>/c<N>.json``, written atomically, carrying the config snapshot (name,
hash, masked args), the server's own ``/server_info`` taken just before the run, the workload and the
runner's JSONL line. A level whose file has the same config hash and workload is done: re-runs skip it.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import FunctionCommand, operation

from operations.controller import interrupt, summary, supervisors
from operations.controller import lease as lock
from operations.controller import output as report
from operations.controller.remote import ask, host_python
from operations.controller.waiting import Deadline, ReadCost, RealClock, poll
from operations.model import hostdata, topology
from operations.model.server_config import ServerConfig
from operations.model.workload import Workload
from operations.model.server_state import recorded_view
from operations.reporting import tables as sweep_report

DEFAULT_RUNNER = ("-m", "sglang.bench_serving")  # after the host's Python


def desired(config, on_host, hosts) -> ServerConfig:
    """The config as this host runs it (the host's launcher; in a group, its rank's nnodes/node-rank/dist-init-addr):
    what the server's own config hash is compared with, and what results are keyed by."""
    return topology.for_rank(hostdata.config_for(config, on_host), topology.rank_of(on_host, hosts))


def target_of(on_host, hosts) -> tuple[str, bool]:
    """(results folder name, whether this host runs the benchmark): a group's rank 0 benchmarks for the group."""
    rank = topology.rank_of(on_host, hosts)
    if rank is None:
        return on_host.name, True
    return rank.group, rank.rank == 0


def result_path(results: str | os.PathLike, target: str, config_name: str, concurrency: int) -> Path:
    return Path(results) / target / config_name / f"c{concurrency}.json"


def done(path: Path, cfg: ServerConfig, workload: Workload) -> bool:
    """A result for this config (same hash) and workload exists."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return doc.get("config", {}).get("hash") == cfg.config_hash and doc.get("workload") == workload.as_dict()


def pending(results, target: str, cfg: ServerConfig, workloads: list[Workload]) -> list[Workload]:
    return [w for w in workloads if not done(result_path(results, target, cfg.name, w.concurrency), cfg, w)]


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@operation()
def benchmarked(config, concurrency: int, results: str = "sweep-results", num_prompts: int | None = None,
                input_len: int = 1024, output_len: int = 512, server_name: str = "llm", state_dir: str | None = None,
                runner=None, timeout_s: float = 3600.0, progress_s: float = 10.0, python: str | None = None):
    """
    Benchmark the running server (config X) at one concurrency and collect the result to the controller.

    + config: the ServerConfig or config name the server runs (``server.running`` before this makes it so)
    + concurrency: ``--max-concurrency`` of the run
    + results: controller folder of results (``RESULTS/<host or group>/<config>/c<N>.json``)
    + num_prompts: requests in the run (default max(8, 4 x concurrency)); input_len, output_len: tokens each
    + server_name, state_dir: the server, as for ``server.running``
    + runner: argv of the benchmark client (host data ``specops_bench_runner``; default
      ``<host python> -m sglang.bench_serving``); it gets SGLang's documented flags and ``--output-file``
    + timeout_s: the run is stopped and this host fails after this long; progress_s: progress line interval
    + python: interpreter on the host for the checks (host data ``specops_python``)

    A result with the same config hash and workload already collected: no change. Otherwise the runner is
    started detached on the host (a dropped connection or a re-run attaches to it rather than starting a
    second), after checking that the server runs this config and taking its ``/server_info``. The API
    key reaches the runner as ``OPENAI_API_KEY`` from the server's 0600 secrets file, never on a command line.
    In a multi-node group only rank 0 runs it.

    **Example:**

    .. code:: python

        server.running(config="eagle3-llama3.1-8b")
        sweep.benchmarked(config="eagle3-llama3.1-8b", concurrency=16, results="sweep-results")
    """
    python = host_python(python)
    cfg = desired(config, host, state.inventory)
    workload = Workload.at(concurrency, num_prompts, input_len, output_len, on_host=host)
    target, runs_here = target_of(host, state.inventory)
    if not runs_here:
        host.noop(f"benchmark {cfg.name} c={concurrency}: rank 0 of group {target} runs it")
        return
    path = result_path(results, target, cfg.name, concurrency)
    if done(path, cfg, workload):
        host.noop(f"benchmark {cfg.name} c={concurrency}: result already collected ({path})")
        return
    sup = supervisors.for_host(server_name, None, state_dir, python, host)
    runner = list(runner or host.data.get("specops_bench_runner") or (python, *DEFAULT_RUNNER))
    weights = str(cfg.args.get("model_path") or cfg.args.get("model") or "")
    served = cfg.args.get("served_model_name")
    served = str((served[0] if isinstance(served, (list, tuple)) else served) or weights)
    backend = "vllm" if cfg.engine == "vllm" else "sglang"  # vLLM: its OpenAI API, by the served name
    argv = runner + workload.runner_args(cfg.port, served, weights, backend)
    if report.print_plan_now():
        report.log(host, f"sweep.benchmarked: {cfg.name} ({cfg.config_hash}) at concurrency {concurrency}: "
                         f"{workload.num_prompts} prompts, {input_len} in / {output_len} out -> {path}")
    summary.watch(state)
    yield lock.acquired(f"sweep.benchmarked {cfg.name} c={concurrency}", timeout_s + 600, python)
    yield FunctionCommand(_run, (cfg, sup, argv, workload, path, target, timeout_s, progress_s), {})


@interrupt.stops_on_interrupt
def _run(state, host, cfg: ServerConfig, sup, argv, workload: Workload, path: Path, target: str, timeout_s: float,
         progress_s: float) -> bool:
    key = hashlib.sha256(json.dumps([argv, cfg.config_hash]).encode()).hexdigest()[:16]
    name = f"{cfg.name}-c{workload.concurrency}"
    label = f"sweep.benchmarked {cfg.name} c={workload.concurrency}"
    opts = {"key": key, "argv": argv, "port": cfg.port, "config_hash": cfg.config_hash}

    def read(budget: float) -> dict:  # the host waits up to ``budget`` for the benchmark, then reports
        interrupt.check(f"waiting for benchmark {name} (it goes on on the host; the next run attaches to it)")
        doc = _ctl(host, sup, name, {**opts, "budget_s": budget})
        for note in doc.get("notes") or ():
            report.log(host, f"{label}: {note}", fg="yellow")
        return doc

    def finished(doc: dict) -> bool:
        return "error" in doc or bool(doc.get("done"))

    def progress(doc: dict) -> None:
        if not finished(doc):
            report.log(host, f"{label}: running {doc.get('elapsed_s', 0):.0f} s: {doc.get('last_line', '')[:120]}")

    # the first read may wait a whole chunk too (a host-side wait has no overhead worth learning first)
    outcome = poll(read, finished, Deadline(RealClock(), timeout_s), interval=0.0, chunk=progress_s,
                   on_read=progress, cost=ReadCost(worst=0.0))
    doc = outcome.value
    if not outcome.done:
        _ctl(host, sup, name, {**opts, "stop": True})
        doc = {"error": f"still running after {timeout_s:.0f} s: stopped", "log_tail": [doc.get("last_line", "")]}
    result = doc.get("result")
    if "error" in doc or doc.get("rc") != 0 or not result:
        why = doc.get("error") or f"the runner exited with {doc.get('rc')}" + ("" if result else ", no result line")
        tail = [f"    {line}" for line in doc.get("log_tail", [])[-15:]]
        report.error(host, "\n".join([f"{label}: failed: {why}", "  last lines of the benchmark log:", *tail]))
        return False
    record = {"target": target, "host": host.name, "collected_at": time.time(),
              "config": {"name": cfg.name, "hash": cfg.config_hash, "speculative": cfg.speculative,
                         **recorded_view(cfg)},
              "workload": workload.as_dict(), "runner": argv, "server_info": doc.get("server_info"),
              "result": result}
    write_atomic(path, json.dumps(record, indent=1, sort_keys=True, default=str))
    report.log(host, f"{label}: {sweep_report.describe(result)} -> {path}", fg="green")
    return True


def _ctl(host, sup, name: str, opts: dict) -> dict:
    return ask(host, sup.ctl("bench", sup.directory, name, json.dumps(opts), program="bench_ctl.py"),
               lambda why: {"error": f"bench_ctl: {why}"})


@operation()
def reported(results: str = "sweep-results", configs=None, concurrency=None, require_all: bool = True):
    """
    Write the sweep report for this host's (or group's) results: ``REPORT.md`` (a table per config and
    concurrency: output tok/s, TTFT, ITL, accept length; speed-up against the baseline; the crossover
    concurrency where speculation stops helping), ``results.csv`` and ``throughput.png`` (throughput against
    concurrency, one line per config), all under ``RESULTS/<target>/``; the table is printed too.

    + results: the folder ``sweep.benchmarked`` writes to
    + configs, concurrency: the cells expected (names/ServerConfigs and levels); missing ones are listed
    + require_all: fail this host when an expected cell has no result (a config that did not start, a
      benchmark that failed); a re-run of the sweep fills them in

    **Example:**

    .. code:: python

        sweep.reported(results="sweep-results", configs=["baseline-llama3.1-8b", "eagle3-llama3.1-8b"],
                       concurrency=[1, 4, 16, 64])
    """
    summary.watch(state)
    target, runs_here = target_of(host, state.inventory)
    if not runs_here:
        host.noop(f"sweep report: rank 0 of group {target} writes it")
        return
    cfgs = [desired(c, host, state.inventory) for c in configs or []]
    expected = [(c.name, c.config_hash, int(n)) for c in cfgs for n in concurrency or []]
    folder = Path(results) / target
    records = sweep_report.load(folder)
    if not missing(records, expected) and sweep_report.unchanged(folder, records):
        host.noop(f"sweep report {folder}: up to date ({len(records)} results)")
        return
    yield FunctionCommand(_report, (folder, expected, require_all), {})


def missing(records: list[dict], expected: list[tuple]) -> list[str]:
    """The expected (config name, config hash, concurrency) cells without a result of that config hash
    (a result measured under an older version of the config does not count), as ``name c=N``."""
    have = {(r["config"]["name"], r["config"]["hash"], r["workload"]["concurrency"]) for r in records}
    return [f"{name} c={n}" for name, config_hash, n in expected if (name, config_hash, n) not in have]


def _report(state, host, folder: Path, expected: list, require_all: bool) -> bool:
    records = sweep_report.load(folder)
    written = sweep_report.write(folder, records)
    for line in sweep_report.markdown(records).splitlines():
        report.log(host, f"  {line}")
    report.log(host, f"sweep report: {', '.join(str(p) for p in written)}", fg="green")
    gaps = missing(records, expected)
    if gaps and require_all:
        report.error(host, f"sweep report: no result for {', '.join(gaps)} (failed above); "
                           f"run the sweep again to fill them in")
        return False
    return True

