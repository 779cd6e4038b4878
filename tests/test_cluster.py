"""Multi-host convergence over real SSH: simulated hosts in network namespaces, each with its own sshd, PID
namespace and GPUs; pyinfra's ssh connector; deploy.py with inventory/cluster_sim.py."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpusim.ledger import proc_start_time
from conftest import REPO, changed, shipped, cluster_env, needs_root, pyinfra_argv, run_cluster
from test_gpusim import wait_for

pytestmark = [needs_root, pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"),
                                             reason="needs OpenSSH's sshd (scripts/test.sh installs it)")]


@pytest.fixture
def group_config(tmp_path):
    """A model tensor-parallel over three 4-GPU hosts (nnodes, node_rank, dist_init_addr come from the group)."""
    data = shipped("eagle3-llama3.1-70b-2node")
    data["tp-size"] = 12
    data["specops"]["ready_timeout_s"] = 30
    path = tmp_path / "llama70b-3node.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def ledger(cluster, i) -> dict:
    """Host i's GPU ledger, read inside the host (its PIDs are the host's own)."""
    out = cluster.exec(i, [sys.executable, "-m", "gpusim", "ls", cluster.node_root], check=True)
    return json.loads(out.stdout)


def live_server(cluster, i) -> dict:
    state = cluster.server_state(i)
    assert state.get("status") == "running", state
    assert state["pid"] in {inner for inner, _ in cluster.processes(i).values()}, f"host {i}: pid {state['pid']} gone"
    return state


def test_cluster_up_gives_each_host_its_own_network_processes_and_gpus_and_down_removes_all(make_cluster):
    cluster = make_cluster(2)
    addresses = [cluster.exec(i, ["ip", "-o", "-4", "addr", "show", "eth0"]).stdout for i in range(2)]
    assert [n.address in a for n, a in zip(cluster.nodes, addresses)] == [True, True]
    # own PID namespace: the host's init is its PID 1, and it sees only its own processes
    assert 1 in {inner for inner, _ in cluster.processes(0).values()}
    assert set(cluster.processes(0)).isdisjoint(cluster.processes(1))
    # own GPUs: a hold on host 0 is not on host 1
    cluster.exec(0, [sys.executable, "-m", "gpusim", "hold", cluster.node_root, "--gpus", "1", "--mib", "5000"],
                 check=True)
    assert ledger(cluster, 0)["gpus"][1]["used_mib"] == 5000
    assert ledger(cluster, 1)["gpus"][1]["used_mib"] == 0
    outer = {p: proc_start_time(p) for p in [n.pid for n in cluster.nodes] + list(cluster.processes(0))}
    assert cluster.down() == []
    assert not [p for p, start in outer.items() if proc_start_time(p) == start]
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [n.netns for n in cluster.nodes if n.netns in names]
    assert subprocess.run(["ip", "link", "show", cluster.bridge], capture_output=True).returncode != 0
    cluster.nodes.clear()  # nothing left for the fixture's teardown


def test_multinode_group_converges_rerun_is_noop_and_a_dead_rank_restarts_the_group(make_cluster, group_config):
    cluster = make_cluster(3, server_start_s=0.5)
    args = ("--data", "specops_group=llama70b", "--data", f"config={group_config}")
    first = run_cluster(cluster, *args)
    assert first.rc == 0, first
    leader = cluster.nodes[0].address
    states = [live_server(cluster, i) for i in range(3)]
    for rank, state in enumerate(states):
        recorded = state["recorded"]["args"]
        assert (recorded["nnodes"], recorded["node_rank"], recorded["dist_init_addr"]) == (3, rank, f"{leader}:20000")
        assert [g["used_mib"] > 0 for g in ledger(cluster, rank)["gpus"]] == [True] * 4  # 12 GPUs = 3 x 4
    launches = [[e for e in cluster.timeline(i) if e["event"] == "launch"] for i in range(3)]
    assert launches[0][-1]["t"] < min(launches[1][-1]["t"], launches[2][-1]["t"])  # rank 0 first
    assert "rank 0 (" in first.out and "ready after" in first.out

    again = run_cluster(cluster, *args)
    assert again.rc == 0 and changed(again) == 0, again
    assert [cluster.server_state(i)["pid"] for i in range(3)] == [s["pid"] for s in states]

    cluster.kill(2, states[2]["pid"])
    restart = run_cluster(cluster, *args)
    assert restart.rc == 0, restart
    assert re.search(rf"rank 2 \({re.escape(cluster.nodes[2].address)}\): pid {states[2]['pid']} exited", restart.out)
    after = [live_server(cluster, i) for i in range(3)]
    assert all(a["pid"] != b["pid"] or a["start"] != b["start"] for a, b in zip(after, states))  # whole group
    assert run_cluster(cluster, *args).out.count("ready after") == 0  # converged again: nothing to verify


def down_intervals(cluster, i) -> list[tuple[float, float]]:
    """When host i served nothing: from a server's SIGTERM to the next server's readiness."""
    out, down_since = [], None
    for event in cluster.timeline(i):
        if event["event"] == "term" and down_since is None:
            down_since = event["t"]
        elif event["event"] == "ready" and down_since is not None:
            out.append((down_since, event["t"]))
            down_since = None
    return out + ([(down_since, float("inf"))] if down_since is not None else [])


def most_down_at_once(intervals) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def test_rolling_switch_of_four_replicas_in_batches_of_two(make_cluster):
    cluster = make_cluster(4, server_start_s=0.5)
    assert run_cluster(cluster).rc == 0  # EAGLE-3 everywhere, all at once
    switch = run_cluster(cluster, "--parallel", "2", "--data", "config=baseline-llama3.1-8b")
    assert switch.rc == 0, switch
    intervals = [iv for i in range(4) for iv in down_intervals(cluster, i)]
    assert len(intervals) == 4
    assert most_down_at_once(intervals) <= 2, intervals
    assert most_down_at_once(intervals) >= 1
    # batches: the second pair went down only after the first pair was ready again
    ends = sorted(intervals)
    assert max(b for _, b in ends[:2]) <= min(a for a, _ in ends[2:]), ends
    hashes = {live_server(cluster, i)["config_hash"] for i in range(4)}
    assert len(hashes) == 1


def test_a_failed_batch_stops_the_rollout_and_names_the_hosts(make_cluster):
    cluster = make_cluster(4, server_start_s=0.3)
    assert run_cluster(cluster).rc == 0
    before = [live_server(cluster, i) for i in range(4)]
    for i in range(3):  # memory on GPU 0 of three hosts that the driver never frees: gpu.idle ends in needs-reset
        cluster.exec(i, [sys.executable, "-m", "gpusim", "hold", cluster.node_root, "--gpus", "0", "--mib", "2000",
                         "--stuck"], check=True)
    run = run_cluster(cluster, "--parallel", "2", "--data", "config=baseline-llama3.1-8b",
                      "--data", "deadline_s=2", "--data", "grace_s=0.5")
    assert run.rc != 0, run
    gated = re.findall(r"\[(\S+)\] server.running: rollout stopped: an earlier batch failed on ([^;]+);", run.out)
    assert len(gated) == 2, run  # the whole second batch, whichever hosts it held
    for name, failed in gated:
        i = [n.address for n in cluster.nodes].index(name)
        assert cluster.server_state(i)["pid"] == before[i]["pid"]  # untouched: still the old server
        assert live_server(cluster, i)["config_hash"] == before[i]["config_hash"]
        assert failed.split(", ") and name not in failed
        assert f"FAILED {name}" in run.out
    reset = re.findall(r"\[(\S+)\] gpu.idle: needs-reset: .* GPU 0: 2000 MiB still allocated", run.out)
    assert reset and all(f"FAILED {name}" in run.out for name in reset)


def test_a_blocked_host_fails_before_its_old_server_is_stopped(make_cluster):
    cluster = make_cluster(2, server_start_s=0.3)
    assert run_cluster(cluster).rc == 0
    before = [live_server(cluster, i) for i in range(2)]
    cluster.exec(0, [sys.executable, "-m", "gpusim", "hold", cluster.node_root, "--gpus", "0", "--mib", "2000",
                     "--user", "nobody"], check=True)  # another user's job on host 0's server GPU
    run = run_cluster(cluster, "--data", "config=baseline-llama3.1-8b")
    assert run.rc != 0, run
    name = cluster.nodes[0].address
    assert re.search(rf"\[{re.escape(name)}\] server.running llm: gpu.idle would refuse GPU 0: blocked", run.out), run
    assert f"FAILED {name}" in run.out
    assert live_server(cluster, 0)["pid"] == before[0]["pid"]  # still serving the old config
    assert live_server(cluster, 1)["config_hash"] != before[1]["config_hash"]  # the other host switched


def test_sshd_outage_mid_run_fails_that_host_only_and_the_summary_names_it(make_cluster):
    cluster = make_cluster(3, server_start_s=0.3)
    assert run_cluster(cluster).rc == 0
    old = cluster.server_state(2)
    cluster.configure(server_start_s=3.0)
    argv = pyinfra_argv("cluster_sim.py", "deploy.py", ("--data", "config=baseline-llama3.1-8b"))
    proc = subprocess.Popen(argv, cwd=REPO, env=cluster_env(cluster), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        # once host 2 is loading the new server, its sshd (listener and sessions) goes away
        wait_for(lambda: cluster.server_state(2).get("pid") not in (None, old["pid"]), 60, "host 2 starting")
        assert cluster.stop_sshd(2)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    host2 = cluster.nodes[2].address
    assert proc.returncode != 0, out
    assert f"FAILED {host2}" in out, out
    for i in (0, 1):
        assert live_server(cluster, i)["config_hash"] != old["config_hash"]  # switched
    # next run: host 2 is unreachable; the others are already converged, and the summary says so
    cluster.configure(server_start_s=0.3)
    again = run_cluster(cluster, "--data", "config=baseline-llama3.1-8b")
    assert again.rc != 0
    assert f"UNREACHABLE {host2}" in again.out and "converged: 2 host(s)" in again.out, again
    assert changed(again) == 0, again


def test_sweep_over_ssh_measures_each_replica_and_releases_each_host_lease(make_cluster, tmp_path):
    cluster = make_cluster(2, gpus=2, server_start_s=0.3)
    results = tmp_path / "results"
    args = ["--data", "configs=baseline-llama3.1-8b,eagle3-llama3.1-8b", "--data", "concurrency=1,4",
            "--data", "num_prompts=8", "--data", "input_len=32", "--data", "output_len=16",
            "--data", f"results={results}"]
    first = run_cluster(cluster, *args, deploy="sweep.py", timeout=300)
    assert first.rc == 0, first
    for node in cluster.nodes:
        files = sorted(p.relative_to(results / node.address).as_posix()
                       for p in (results / node.address).glob("*/c*.json"))
        assert files == ["baseline-llama3.1-8b/c1.json", "baseline-llama3.1-8b/c4.json",
                         "eagle3-llama3.1-8b/c1.json", "eagle3-llama3.1-8b/c4.json"], files
        doc = json.loads((results / node.address / "eagle3-llama3.1-8b" / "c4.json").read_text())
        assert doc["host"] == node.address and doc["result"]["completed"] == 8
        assert "speculation helps at every measured level (up to c=4)" in \
            (results / node.address / "REPORT.md").read_text()  # the stand-in's model: 1.36x at c=4
    for i in range(2):  # each host's lease was released over SSH at the end of the run
        out = cluster.exec(i, ["ls", "-a", f"{cluster.node_root}/servers"]).stdout
        assert ".specops-lock.json\n" not in out and ".specops-lock.json.flock" in out, out
    again = run_cluster(cluster, *args, deploy="sweep.py")
    assert again.rc == 0 and changed(again) == 0, again


def test_sweep_on_a_multinode_group_benchmarks_from_rank_0_under_the_group_name(make_cluster, tmp_path):
    cluster = make_cluster(2, gpus=8, server_start_s=0.3)
    results = tmp_path / "results"
    args = ["--data", "specops_group=llama", "--data", "configs=eagle3-llama3.1-70b-2node", "--data",
            "concurrency=1,4", "--data", "num_prompts=8", "--data", "input_len=32", "--data", "output_len=16",
            "--data", f"results={results}"]
    first = run_cluster(cluster, *args, deploy="sweep.py", timeout=300)
    assert first.rc == 0, first
    assert sorted(p.relative_to(results).as_posix() for p in results.glob("*/*/c*.json")) == \
        ["llama/eagle3-llama3.1-70b-2node/c1.json", "llama/eagle3-llama3.1-70b-2node/c4.json"]
    doc = json.loads((results / "llama" / "eagle3-llama3.1-70b-2node" / "c1.json").read_text())
    leader = cluster.nodes[0].address
    assert doc["host"] == leader and doc["server_info"]["nnodes"] == 2 and doc["server_info"]["node_rank"] == 0
    assert doc["config"]["hash"] == cluster.server_state(0)["config_hash"]  # rank 0's own config
    again = run_cluster(cluster, *args, deploy="sweep.py")
    assert again.rc == 0 and changed(again) == 0, again


def test_a_switch_over_ssh_is_one_streamed_host_program_and_a_converged_rerun_one_command(make_cluster):
    """Round trips, counted from the host's sshd log: a switch is the read (GPUs, server and the kept engine
    verdict at once), the engine's parse when this config was never judged here, the lease with the server
    directory, one SFTP upload and the transition, whose channel also carries the verified mark and, the run's
    last operation here, the lease's release; a converged rerun is the read alone. The progress lines arrive
    while it runs, the server is marked verified by the controller's reply, and no lease is left behind."""
    cluster = make_cluster(1, server_start_s=0.3)
    log = Path(cluster.nodes[0].root, "sshd.log")

    def converge(config):
        before = log.read_text().count("Starting session:")
        run = run_cluster(cluster, "--data", f"config={config}")
        assert not Path(cluster.nodes[0].root, "servers", ".specops-lock.json").exists(), run
        return run, log.read_text().count("Starting session:") - before

    first, n = converge("eagle3-llama3.1-8b")
    assert first.rc == 0 and n == 5, (n, first)  # a fresh start: its config's first parse by the host's SGLang
    eagle3 = live_server(cluster, 0)["config_hash"]
    switch, n = converge("baseline-llama3.1-8b")
    assert switch.rc == 0 and n == 5, (n, switch)
    assert re.search(r"server\.running: \[\s*[\d.]+s\] stopped by SIGTERM", switch.out), switch
    assert re.search(r"server\.running: \[\s*[\d.]+s\] GPU memory released after", switch.out), switch
    state = live_server(cluster, 0)  # a start records a fresh state: verified_at is this start's mark
    assert state["config_hash"] != eagle3 and state.get("verified_at"), state
    back, n = converge("eagle3-llama3.1-8b")
    assert back.rc == 0 and n == 4, (n, back)  # judged before: the host kept its engine's verdict
    assert "config confirmed" in back.out and live_server(cluster, 0).get("verified_at"), back
    again, n = converge("eagle3-llama3.1-8b")
    assert again.rc == 0 and n == 1 and changed(again) == 0, (n, again)
