"""Reliability and security faults (issue 12), end to end: the real pyinfra CLI, deploy.py and inventory/sim.py
against a simulated host, each fault followed by a run that converges and one that changes nothing.

1 controller killed during a start; 2 corrupt or lying state/lease documents; 3 unreadable GPU memory; 4 PIDs
from another PID namespace; 5 a protected name holding 100 GB; 6 memory pinned by an unlisted descendant;
7 Ctrl-C; 8 leases of failed runs; 10 uploads under sudo (tests/test_cluster.py style, real sshd);
11 state directories other users can write; 12 --dry of a run that will fail; 13 the plan's exit code.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import PYINFRA, REPO, needs_root, pyinfra_argv, run_pyinfra, shipped
from gpusim import ledger
from gpusim.ledger import proc_start_time
from test_fault_matrix import assert_no_change, converge, idle, the_server
from test_gpusim import wait_for


def no_traceback(run):
    assert "Traceback" not in run.out and "Unexpected error" not in run.out, run


def server_dir(sim) -> Path:
    return sim.root / "servers" / "llm"


def lease(sim) -> Path:
    return sim.root / "servers" / ".specops-lock.json"


@pytest.fixture
def victim():
    """An unrelated local process (the test's own), that nothing specops does may signal."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def spawn_pyinfra(sim, *args, out: Path) -> subprocess.Popen:
    fh = open(out, "w")
    return subprocess.Popen(pyinfra_argv("sim.py", "deploy.py", args), cwd=REPO, env=sim.env(), stdout=fh,
                            stderr=subprocess.STDOUT)


def health_generate(port) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=2) as resp:
            return resp.status
    except OSError:
        return None


def host_programs_for(directory: Path) -> list[int]:
    """PIDs of specops host programs still working on ``directory`` (e.g. a readiness wait orphaned by a killed
    controller): only observed, never signalled."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(directory).encode() in argv and b"wait" in argv:
            pids.append(int(entry))
    return pids


# --- 1. only a completed verification marks a server verified; every no-op re-checks the live facts ---------

def test_1_controller_killed_during_start_leaves_no_verified_server_and_the_rerun_verifies(
        server_sim, configs, tmp_path):
    sim = server_sim
    sim.configure(server_start_s=1.5, accept_length=1.2)  # below the config's min_accept_length 2.0
    run = spawn_pyinfra(sim, "--data", f"config={configs['eagle3-llama3.1-8b']}", out=tmp_path / "killed.out")
    state = server_dir(sim) / "state.json"
    wait_for(lambda: state.exists() and json.loads(state.read_text()).get("status") == "starting", 60,
             "the server launched")
    run.send_signal(signal.SIGKILL)  # the controller is lost while the server loads
    run.wait()
    wait_for(lambda: health_generate(configs["port"]) == 200, 30, "the server up")
    wait_for(lambda: not host_programs_for(server_dir(sim)), 30, "the orphaned readiness wait to end")
    assert json.loads(state.read_text())["status"] == "starting"  # a host-side wait proves nothing
    again = converge(sim, configs["eagle3-llama3.1-8b"])
    assert again.rc != 0 and "speculation underperforms" in again.out, again
    assert "avg accept length 1.20 < min_accept_length 2.0" in again.out, again
    assert "lock: took over the lease" in again.out, again  # the killed run's lease
    assert all(s.get("status") != "running" for s in sim.servers())
    sim.configure(accept_length=3.0)
    fixed = converge(sim, configs["eagle3-llama3.1-8b"])
    assert fixed.rc == 0 and "config confirmed" in fixed.out, fixed
    assert the_server(sim)["status"] == "running" and the_server(sim).get("verified_at")
    assert_no_change(converge(sim, configs["eagle3-llama3.1-8b"]))


def test_1_a_converged_server_whose_accept_length_drops_fails_the_noop_and_is_not_restarted(server_sim, configs):
    sim = server_sim
    first = converge(sim, configs["eagle3-llama3.1-8b"])
    assert first.rc == 0, first
    pid = the_server(sim)["pid"]
    sim.configure(accept_length=1.2)  # the live server now reports a running average below the threshold
    low = converge(sim, configs["eagle3-llama3.1-8b"])
    assert low.rc != 0, low
    assert "its average accept length is 1.20 < min_accept_length 2.0" in low.out and "not restarting" in low.out
    assert the_server(sim)["pid"] == pid and proc_start_time(pid) is not None
    no_traceback(low)
    sim.configure(accept_length=3.0)
    assert_no_change(converge(sim, configs["eagle3-llama3.1-8b"]))


# --- 2. never signal without a verified pid + start time; corrupt documents are named and set aside ---------

@pytest.mark.parametrize("doc", ["without_start", "dead_pid_with_pgid"])
def test_2_a_state_that_names_a_pid_without_its_start_time_never_signals_it(server_sim, configs, victim, doc):
    sim = server_sim
    server_dir(sim).mkdir(parents=True, mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    state = ({"status": "running", "pid": victim.pid, "pgid": victim.pid} if doc == "without_start" else
             {"status": "running", "pid": dead.pid, "start": None, "pgid": os.getpgid(victim.pid)})
    (server_dir(sim) / "state.json").write_text(json.dumps(state))
    stopped = run_pyinfra(sim, f"port={configs['port']}", deploy="operations.server.stopped")
    assert stopped.rc == 0 and victim.poll() is None, stopped
    run = converge(sim, configs["baseline-llama3.1-8b"])
    assert run.rc == 0 and "config confirmed" in run.out, run
    assert victim.poll() is None  # the process the document named is untouched
    assert_no_change(converge(sim, configs["baseline-llama3.1-8b"]))


CORRUPT_STATES = {"null": "null", "list": "[]", "no_status": "{}", "pid_string": '{"status": "running", "pid": "12"}',
                  "not_json": "{oops", "start_nan": '{"status": "running", "pid": 1, "start": NaN}'}


@pytest.mark.parametrize("name", sorted(CORRUPT_STATES))
def test_2_a_corrupt_state_json_is_named_set_aside_and_the_host_converges(server_sim, configs, name):
    sim = server_sim
    server_dir(sim).mkdir(parents=True, mode=0o700)
    (server_dir(sim) / "state.json").write_text(CORRUPT_STATES[name])
    run = converge(sim, configs["baseline-llama3.1-8b"])
    no_traceback(run)
    assert run.rc == 0 and "config confirmed" in run.out, run
    assert re.search(r"state\.json: .* set aside as .*state\.json\.corrupt-", run.out), run
    (aside,) = server_dir(sim).glob("state.json.corrupt-*")
    assert aside.read_text() == CORRUPT_STATES[name]  # kept for inspection
    assert_no_change(converge(sim, configs["baseline-llama3.1-8b"]))


@pytest.mark.parametrize("doc", ["null", "[]", '{"id": 1, "expires_at": 5}', '{"id": "x", "expires_at": NaN}',
                                 '{"id": "x"}'])
def test_2_a_corrupt_lease_is_named_set_aside_and_binds_nobody(server_sim, configs, doc):
    sim = server_sim
    lease(sim).parent.mkdir(parents=True, mode=0o700)
    lease(sim).write_text(doc)
    run = converge(sim, configs["baseline-llama3.1-8b"], "--data", "specops_lock_wait_s=0")
    no_traceback(run)
    assert run.rc == 0 and "config confirmed" in run.out, run
    assert "the host lease" in run.out and "was unreadable" in run.out and "set aside as" in run.out, run
    assert list(lease(sim).parent.glob(".specops-lock.json.corrupt-*"))
    assert not lease(sim).exists()  # released after the run
    assert_no_change(converge(sim, configs["baseline-llama3.1-8b"]))


# --- 3. unreadable GPU memory is never idle -----------------------------------------------------------------

@pytest.mark.parametrize("memory,nvml,reason", [
    ("na", False, "nvidia-smi reports memory.used as [N/A]"),
    ("noperm", False, "nvidia-smi reports memory.used as [Insufficient Permissions]"),
    ("na", True, "pynvml nvmlDeviceGetMemoryInfo: Not Supported"),
    ("noperm", True, "pynvml nvmlDeviceGetMemoryInfo: Insufficient Permissions"),
])
def test_3_unreadable_memory_is_a_verdict_of_its_own_and_nothing_is_signalled(tmp_path, memory, nvml, reason):
    from gpusim.host import SimHost

    sim = SimHost.create(tmp_path / "host", 4, nvml=nvml, release_delay_s=0.2)
    try:
        job = sim.hold([1], 4000)
        sim.configure_gpu(1, memory=memory)
        dry = idle(sim, "--dry")
        assert dry.rc == 1 and "will fail: gpu.idle: unreadable: the memory use of GPU 1 cannot be read" in dry.out
        assert reason in dry.out, dry
        run = idle(sim)
        assert run.rc != 0 and f"GPU 1: {reason}" in run.out and "Nothing was signalled" in run.out, run
        assert job.alive()
        sim.configure_gpu(1, memory="ok")  # e.g. run where the memory is readable
        fixed = idle(sim)
        assert fixed.rc == 0 and not job.alive(), fixed
        assert_no_change(idle(sim))
    finally:
        sim.cleanup()


# --- 4. a PID the driver reports from another PID namespace is never signalled -----------------------------

def test_4_a_driver_pid_that_maps_to_an_unrelated_local_process_is_never_signalled(sim, victim):
    job = sim.hold([0], 5000, report_pid=victim.pid)
    dry = idle(sim, "--dry")
    assert dry.rc == 1 and f"stop pid {victim.pid}" not in dry.out, dry
    assert f"refuse pid {victim.pid}" in dry.out and "holds no GPU device open" in dry.out, dry
    run = idle(sim)
    assert run.rc != 0 and "blocked" in run.out and "Nothing was signalled" in run.out, run
    assert victim.poll() is None and job.alive()
    os.kill(job.pid, signal.SIGKILL)  # the job ends where it runs
    wait_for(lambda: not job.alive(), 10, "the job gone")
    converged = idle(sim, "--data", "deadline_s=20")
    assert converged.rc == 0, converged
    assert_no_change(idle(sim))


def test_4_pid_1_of_this_namespace_and_a_pid_not_found_here_are_refused_in_the_plan(sim):
    sim.hold([0], 5000, report_pid=1)
    sim.hold([1], 5000, report_pid=4194000 if not os.path.exists("/proc/4194000") else 4193999)
    dry = idle(sim, "--dry")
    assert dry.rc == 1, dry
    assert "stop pid 1 " not in dry.out and "refuse pid 1 " in dry.out, dry
    assert "not visible in this PID namespace ([Not Found])" in dry.out, dry


# --- 5. a protected name is tolerated only up to protected_max_mib ------------------------------------------

def test_5_a_process_named_like_a_daemon_holding_100_gb_blocks_the_start_and_is_never_signalled(server_sim, configs):
    sim = server_sim
    fake = sim.hold([0], 100000, name="nvidia-persistenced")
    run = converge(sim, configs["eagle3-llama3.1-8b"])
    assert run.rc != 0, run
    assert "protected daemon holding 100000 MiB, above protected_max_mib=1024" in run.out, run
    assert fake.alive() and not (sim.root / "timeline.jsonl").exists()  # no OOM start was attempted
    os.kill(fake.pid, signal.SIGKILL)
    wait_for(lambda: not fake.alive(), 10, "the fake daemon gone")
    fixed = converge(sim, configs["eagle3-llama3.1-8b"])
    assert fixed.rc == 0 and "config confirmed" in fixed.out, fixed
    assert_no_change(converge(sim, configs["eagle3-llama3.1-8b"]))


# --- 6. needs-reset names live processes that still hold a GPU device open ---------------------------------

def test_6_needs_reset_names_the_unlisted_descendant_that_pins_the_memory(sim):
    job = sim.hold([2], 30000, pin_child=True)
    run = idle(sim, "--data", "deadline_s=2", "--data", "grace_s=0.5")
    assert run.rc != 0 and "needs-reset" in run.out, run
    assert "live processes holding a GPU device open" in run.out and f"pid {job.pin_pid} " in run.out, run
    os.kill(job.pin_pid, signal.SIGKILL)  # the operator ends it
    wait_for(lambda: proc_start_time(job.pin_pid) is None, 10, "the pinning child gone")
    assert idle(sim, "--data", "deadline_s=20").rc == 0
    assert_no_change(idle(sim))


# --- 7. Ctrl-C stops signalling and starts, releases the lease, exits non-zero ------------------------------

def test_7_ctrl_c_stops_before_the_kill_releases_the_lease_and_exits_non_zero(sim, tmp_path):
    stubborn = sim.hold([1], 2000, on_term="ignore")
    out = tmp_path / "interrupted.out"
    run = spawn_pyinfra(sim, "--data", "config=none", "--data", "grace_s=5", "--data", "deadline_s=30", out=out)
    wait_for(lambda: lease(sim).exists(), 60, "the run to take the lease")
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=30) != 0, out.read_text()
    text = out.read_text()
    assert "interrupted (Ctrl-C)" in text and "Exiting upon user request!" not in text, text
    assert stubborn.alive(), text  # the SIGKILL after grace_s was never sent
    assert not lease(sim).exists(), text
    fixed = idle(sim, "--data", "grace_s=0.5")
    assert fixed.rc == 0 and not stubborn.alive(), fixed
    assert_no_change(idle(sim, "--data", "grace_s=0.5"))


# --- 8. a failed run releases its lease; another controller's lease is diagnosable in one line --------------

def test_8_a_failed_run_releases_its_lease(sim):
    sim.hold([2], 60000, stuck=True)
    run = idle(sim, "--data", "deadline_s=1", "--data", "grace_s=0.2")
    assert run.rc != 0 and "needs-reset" in run.out, run
    assert not lease(sim).exists(), run
    ledger.release_all(sim.root)
    assert_no_change(idle(sim))


def test_8_a_lease_held_from_another_controller_is_explained_in_one_line(sim):
    sim.hold([1], 2000)
    lease(sim).parent.mkdir(parents=True, mode=0o700)
    lease(sim).write_text(json.dumps({"id": "other-run", "controller": "ci-runner-7", "pid": 4242, "pid_start": 1,
                                      "user": "deploy", "what": "server llm -> config x",
                                      "acquired_at": time.time(), "expires_at": time.time() + 600}))
    run = idle(sim, "--data", "specops_lock_wait_s=0")
    assert run.rc != 0, run
    (line,) = [l for l in run.out.splitlines() if "another specops run holds this host" in l]
    assert "deploy@ci-runner-7 pid 4242" in line and "held from controller ci-runner-7" in line, line
    assert f"or remove {lease(sim)}" in line, line
    lease(sim).unlink()  # that run is gone: its operator removes the lease
    assert idle(sim).rc == 0
    assert_no_change(idle(sim))


# --- 11. a state directory other users could write is refused ----------------------------------------------

def test_11_a_world_writable_state_tree_is_refused_before_anything_changes(server_sim, configs, tmp_path):
    sim = server_sim
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: any local user could swap what is inside
    args = ("--data", f"specops_state_dir={shared}/specops")
    sim.state_dirs.append(shared / "specops")  # the fixture's cleanup stops the server started there
    run = converge(sim, configs["baseline-llama3.1-8b"], *args)
    assert run.rc != 0 and f"{shared} is writable by group and others (mode 777)" in run.out, run
    assert not (sim.root / "timeline.jsonl").exists()
    no_traceback(run)
    shared.chmod(0o755)
    assert converge(sim, configs["baseline-llama3.1-8b"], *args).rc == 0
    assert_no_change(converge(sim, configs["baseline-llama3.1-8b"], *args))


def test_11_a_symlinked_server_directory_and_planted_temp_symlinks_are_never_written_through(
        server_sim, configs, tmp_path):
    sim = server_sim
    target = tmp_path / "elsewhere"
    target.mkdir()
    (sim.root / "servers").mkdir(mode=0o700)
    server_dir(sim).symlink_to(target)
    run = converge(sim, configs["baseline-llama3.1-8b"])
    assert run.rc != 0 and "not a directory (a symlink)" in run.out, run
    assert list(target.iterdir()) == []
    server_dir(sim).unlink()
    assert converge(sim, configs["baseline-llama3.1-8b"]).rc == 0
    victim_file = tmp_path / "victim"
    victim_file.write_text("precious")
    (server_dir(sim) / ".state.json.tmp").symlink_to(victim_file)  # a leftover name pointing elsewhere
    stopped = run_pyinfra(sim, f"port={configs['port']}", deploy="operations.server.stopped")
    assert stopped.rc == 0, stopped
    assert victim_file.read_text() == "precious"
    assert converge(sim, configs["baseline-llama3.1-8b"]).rc == 0
    assert_no_change(converge(sim, configs["baseline-llama3.1-8b"]))


@needs_root
def test_11_a_state_dir_owned_by_another_user_is_refused(server_sim, configs, tmp_path):
    sim = server_sim
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)  # nobody
    run = converge(sim, configs["baseline-llama3.1-8b"], "--data", f"specops_state_dir={theirs}")
    assert run.rc != 0 and f"{theirs} is owned by uid 65534" in run.out, run
    assert not (sim.root / "timeline.jsonl").exists()


# --- 12. --dry of a run that will fail says so and exits 1 --------------------------------------------------

def test_12_dry_run_of_a_start_without_a_driver_fails_and_names_the_reason(server_sim, configs):
    sim = server_sim
    assert converge(sim, configs["baseline-llama3.1-8b"]).rc == 0
    sim.set_driver(False)
    dry = converge(sim, configs["eagle3-llama3.1-8b"], "--dry")
    assert dry.rc == 1, dry
    assert "will fail: server.running llm: cannot read GPUs" in dry.out, dry
    assert "WOULD FAIL @local" in dry.out, dry
    run = converge(sim, configs["eagle3-llama3.1-8b"])
    assert run.rc != 0 and "the running server was left as it was" in run.out, run
    assert the_server(sim)["status"] == "running"  # the old server was not stopped for a start that cannot work
    sim.set_driver(True)
    assert converge(sim, configs["eagle3-llama3.1-8b"]).rc == 0
    assert_no_change(converge(sim, configs["eagle3-llama3.1-8b"]))


@needs_root
def test_12_dry_run_of_a_blocked_start_fails_with_the_verdict_and_signals_nothing(server_sim, configs):
    theirs = server_sim.hold([0], 50000, user="nobody")
    dry = converge(server_sim, configs["eagle3-llama3.1-8b"], "--dry")
    assert dry.rc == 1, dry
    verdict = "blocked: GPU 0 held by processes this operation may not stop"
    assert f"will fail: server.running llm: gpu.idle would refuse GPU 0: {verdict}" in dry.out, dry
    assert f"WOULD FAIL @local: server.running llm: gpu.idle would refuse GPU 0: {verdict}" in dry.out, dry
    assert theirs.alive() and not (server_sim.root / "servers" / "llm").exists()


@needs_root
def test_12_dry_run_of_a_blocked_idle_fails(sim):
    sim.hold([1], 2000, user="nobody")
    dry = idle(sim, "--dry")
    assert dry.rc == 1 and "will fail: gpu.idle: blocked" in dry.out, dry


# --- 13. python -m operations.plan: 0 converged, 2 changes pending, 1 would fail ---------------------------

def plan(sim, *args):
    proc = subprocess.run([sys.executable, "-m", "operations.plan", "inventory/sim.py", "deploy.py", *args],
                          cwd=REPO, env=sim.env(), capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_13_plan_exit_codes_converged_pending_failing(server_sim, configs):
    sim = server_sim
    config = f"config={configs['baseline-llama3.1-8b']}"
    code, out = plan(sim, "--data", config)
    assert code == 2 and "specops plan: changes pending (exit 2)" in out, out
    assert "~ @local: server running with config" in out, out
    assert not (sim.root / "timeline.jsonl").exists()  # a plan changes nothing
    assert converge(sim, configs["baseline-llama3.1-8b"]).rc == 0
    code, out = plan(sim, "--data", config)
    assert code == 0 and "specops plan: converged (exit 0)" in out, out
    sim.set_driver(False)
    code, out = plan(sim, "--data", f"config={configs['eagle3-llama3.1-8b']}")
    assert code == 1 and "! @local: server.running llm: cannot read GPUs" in out, out
    sim.set_driver(True)
    code, out = plan(sim, "--data", "config=no-such-config")
    assert code == 1 and "the dry run failed (the error is printed above)" in out and "no config" in out, out
    code, out = plan(sim, "-y", "--data", config)
    assert code == 1 and "drop -y" in out


# --- 10. under sudo, secrets never pass through a file other users can read or pre-create -------------------

@needs_root
@pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd") or not os.path.exists("/usr/bin/sudo"),
                    reason="needs OpenSSH's sshd and sudo (scripts/test.sh installs them)")
def test_10_sudo_uploads_never_write_through_a_predictable_temp_file(make_cluster, tmp_path):
    from pyinfra.api.util import sha1_hash

    from conftest import cluster_env

    cluster = make_cluster(1, server_start_s=0.3)
    data = shipped("baseline-llama3.1-8b")
    data["api-key"] = "${SPECOPS_SUDO_TEST_KEY}"
    data["specops"]["ready_timeout_s"] = 30
    config = tmp_path / "keyed.yaml"
    config.write_text(yaml.safe_dump(data))
    key = "sk-sudo-test-9c2e71d0"
    secrets = f"{cluster.node_root}/servers/llm/secrets.env"
    # what pyinfra 3.10 would upload to first: a name every local user can compute, pre-created by one of them
    trap = Path(f"/tmp/pyinfra-{sha1_hash(secrets)}")
    trap.write_text("trap")
    os.chown(trap, 65534, 65534)
    trap.chmod(0o666)
    try:
        env = {**cluster_env(cluster), "SPECOPS_SUDO_TEST_KEY": key}
        argv = [PYINFRA, "-y", "--sudo", str(REPO / "inventory" / "cluster_sim.py"), "deploy.py",
                "--data", f"config={config}"]
        run = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
        out = run.stdout + run.stderr
        assert run.returncode == 0 and "config confirmed" in out, out
        assert trap.exists() and trap.read_text() == "trap"  # never written through (nor removed after a cp)
        assert key not in out
        assert not list(Path("/tmp").glob("pyinfra-specops-upload-*"))  # the private upload dir is removed
        state = cluster.server_state(0)
        assert state["status"] == "running"
        again = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
        assert again.returncode == 0 and "No changes" in again.stdout + again.stderr, again.stdout + again.stderr
    finally:
        trap.unlink()


# --- the host programs' own guards, without a run -----------------------------------------------------------

def test_2_a_document_nested_too_deep_is_corrupt_not_a_crash(tmp_path):
    from operations.remote.common import read_doc

    path = tmp_path / "state.json"
    path.write_text("[" * 200000)
    assert read_doc(str(path), {}) == (None, "unreadable JSON (RecursionError)")


def test_11_directories_specops_creates_under_umask_002_pass_its_own_check(tmp_path):
    from operations.remote.common import private_dir, unsafe_tree

    old = os.umask(0o002)
    try:
        assert private_dir(str(tmp_path / "a" / "b" / "llm")) is None
    finally:
        os.umask(old)
    assert unsafe_tree(str(tmp_path / "a" / "b" / "llm")) is None
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [(), ("--serial",), ("--no-wait",)])
def test_12_a_predicted_failure_that_clears_before_execution_does_not_fail_the_run(sim, tmp_path, mode):
    """Without -y pyinfra prepares, asks, then executes: what was foreseen while preparing (no driver) is withdrawn
    once execution starts, in every run mode, so the real outcome decides the exit code."""
    sim.hold([1], 2000)
    sim.set_driver(False)
    out = tmp_path / "interactive.out"
    with open(out, "w") as fh:
        run = subprocess.Popen([PYINFRA, *mode, str(REPO / "inventory" / "sim.py"), "deploy.py", "--data",
                                "config=none"], cwd=REPO, env=sim.env(), stdin=subprocess.PIPE, stdout=fh,
                               stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: "Press enter to execute" in out.read_text(), 60, "the confirmation prompt")
        assert "will fail: gpu.idle: cannot read GPUs" in out.read_text()
        sim.set_driver(True)  # fixed between the plan and the go-ahead
        run.communicate("\n", timeout=60)
    text = out.read_text()
    assert run.returncode == 0 and "idle: GPU 0,1,2,3 idle after" in text, text
    assert_no_change(idle(sim))
