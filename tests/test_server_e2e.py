"""server.running end to end: pyinfra CLI, deploy.py, inventory/sim.py and the SGLang-API stand-in."""
import os
import re
import signal
import socket
import stat
import subprocess

import pytest
import yaml

from conftest import REPO, free_port, needs_root, run_pyinfra
from gpusim.ledger import proc_start_time
from test_gpusim import wait_for


def converge(sim, config, *args):
    return run_pyinfra(sim, "--data", f"config={config}", *args)


def running(sim):
    (server,) = [s for s in sim.servers() if s.get("status") == "running"]
    assert proc_start_time(server["pid"]) == server["start"]
    return server


def server_log(sim) -> str:
    return (sim.root / "servers" / "llm" / "server.log").read_text()


def test_eagle3_converges_then_rerun_is_noop_then_switch_to_baseline(server_sim, configs):
    sim, eagle3, baseline = server_sim, configs["eagle3-llama3.1-8b"], configs["baseline-llama3.1-8b"]
    first = converge(sim, eagle3)
    assert first.rc == 0, first
    assert re.search(r"ready after \d+\.\ds: health_generate 200, generation ok, config confirmed, avg accept "
                     r"length 3\.\d\d", first.out), first
    pid = running(sim)["pid"]

    again = converge(sim, eagle3, "-v")
    assert again.rc == 0 and "healthy" in again.out and re.search(r"No changes", again.out), again
    assert running(sim)["pid"] == pid

    dry = converge(sim, baseline, "--dry", "--diff")
    assert dry.rc == 0, dry
    for line in ("~ speculative_algorithm: EAGLE3 -> (unset) (restart)",
                 "~ speculative_num_draft_tokens: 16 -> (unset) (restart)",
                 "~ min_accept_length: 2.0 -> (unset) (no restart)",
                 f"stop server llm (pid {pid}) through its supervisor",
                 "secrets.env: secrets file (mode 600), content never shown"):
        assert line in dry.out, dry
    assert re.search(r"- speculative-algorithm: EAGLE3", dry.out) and "engine.yaml" in dry.out, dry  # --diff
    assert "Will modify" in dry.out, dry
    assert running(sim)["pid"] == pid  # --dry changed nothing

    switched = converge(sim, baseline)
    assert switched.rc == 0 and "config confirmed" in switched.out, switched
    new = running(sim)
    assert new["pid"] != pid and proc_start_time(pid) is None
    assert "out of memory" not in server_log(sim)  # ordered: old server gone and memory released first
    assert "healthy" in converge(sim, baseline, "-v").out


def test_hand_made_drift_is_detected_and_replaced(server_sim, configs):
    sim, eagle3 = server_sim, configs["eagle3-llama3.1-8b"]
    assert converge(sim, eagle3).rc == 0
    ours = running(sim)
    os.killpg(ours["pgid"], signal.SIGTERM)  # someone restarts the server by hand, with other flags
    wait_for(lambda: proc_start_time(ours["pid"]) is None, what="server exit")
    wait_for(lambda: not sim.snapshot().procs and sim.used_mib()[0] == 0, what="memory release")
    argv = [str(sim.root / "bin" / "sglang-launch-server"), "--model-path", "meta-llama/Llama-3.1-8B-Instruct",
            "--port", str(configs["port"]), "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
            "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"]
    by_hand = subprocess.Popen(argv, env=sim.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        wait_for(lambda: any(p.pid == by_hand.pid for p in sim.snapshot().procs), what="hand-made server")
        dry = converge(sim, eagle3, "--dry")
        assert f"a server specops did not start answers on port {configs['port']} (hand-made drift)" in dry.out, dry
        assert "~ speculative_num_draft_tokens: 8 -> 16 (restart)" in dry.out, dry
        fixed = converge(sim, eagle3)
        assert fixed.rc == 0 and "config confirmed" in fixed.out, fixed
        assert by_hand.wait(timeout=30) is not None  # stopped by gpu.idle: it held the server's GPU
    finally:
        if by_hand.poll() is None:
            by_hand.kill()


@needs_root
def test_foreign_process_prevents_the_start(server_sim, configs):
    theirs = server_sim.hold([0], 100000, user="nobody")
    run = converge(server_sim, configs["eagle3-llama3.1-8b"])
    assert run.rc != 0 and "blocked: GPU 0 held by processes this operation may not stop" in run.out, run
    assert theirs.alive() and not (server_sim.root / "servers" / "llm" / "state.json").exists()


def test_forced_start_on_busy_gpu_fails_with_log_tail_then_recovers(server_sim, configs):
    hog = server_sim.hold([0], 100000)
    run = converge(server_sim, configs["eagle3-llama3.1-8b"], "--data", "force=true")
    assert run.rc != 0, run
    assert "server exited during start" in run.out and "torch.OutOfMemoryError: CUDA out of memory" in run.out, run
    assert f"pid {hog.pid} on GPU 0: 100000 MiB, user root" in run.out, run  # the GPU process table
    (state,) = server_sim.servers()
    assert state["status"] in ("failed", "stopped") and proc_start_time(state["pid"]) is None  # nothing stale
    again = converge(server_sim, configs["eagle3-llama3.1-8b"])  # the cause (hog) is ours: idle stops it
    assert again.rc == 0 and "config confirmed" in again.out and not hog.alive(), again


def test_never_ready_times_out_and_leaves_nothing_running(server_sim, configs, tmp_path):
    server_sim.configure(server_start_s=60)
    data = yaml.safe_load(configs["eagle3-llama3.1-8b"].read_text())
    data["specops"]["ready_timeout_s"] = 2
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(data))
    run = converge(server_sim, path)
    assert run.rc != 0 and "not ready before the deadline" in run.out, run
    (state,) = server_sim.servers()
    assert state["status"] == "stopped" and proc_start_time(state["pid"]) is None


def test_low_accept_length_fails_verification(server_sim, configs):
    server_sim.configure(accept_length=1.3)
    run = converge(server_sim, configs["eagle3-llama3.1-8b"])
    assert run.rc != 0 and "avg accept length 1.30 < min_accept_length 2.0" in run.out, run


def test_secret_never_in_output_diffs_logs_or_readable_files(server_sim, configs, tmp_path):
    secret = "sk-live-Qz81xT2"
    data = yaml.safe_load(configs["eagle3-llama3.1-8b"].read_text())
    data["api-key"] = "${SPECOPS_TEST_KEY}"
    path = tmp_path / "keyed.yaml"
    path.write_text(yaml.safe_dump(data))
    os.environ["SPECOPS_TEST_KEY"] = secret
    try:
        outputs = [converge(server_sim, path, "--dry", "--diff", "-vv"), converge(server_sim, path, "-vv", "--diff")]
        data["api-key"] = secret + "-rotated"
        path.write_text(yaml.safe_dump(data))
        outputs.append(converge(server_sim, path, "--dry", "--diff", "-vv"))
    finally:
        del os.environ["SPECOPS_TEST_KEY"]
    assert outputs[1].rc == 0 and "config confirmed" in outputs[1].out, outputs[1]  # authenticated checks work
    for run in outputs:
        assert secret not in run.out
    directory = server_sim.root / "servers" / "llm"
    for f in directory.iterdir():
        mode = f.stat().st_mode
        assert not mode & (stat.S_IRWXG | stat.S_IRWXO), f  # nothing readable by others
        if f.name != "secrets.env":
            assert secret not in f.read_text(), f
    assert secret in (directory / "secrets.env").read_text()
    assert not (directory.stat().st_mode & stat.S_IRWXO)


def test_shell_metacharacters_in_config_strings_reach_the_server_verbatim(server_sim, configs, tmp_path):
    nasty = "llama$(touch PWNED)`touch PWNED`'\";|&"
    data = yaml.safe_load(configs["baseline-llama3.1-8b"].read_text())
    data["model-path"] = nasty
    data["served-model-name"] = nasty
    path = tmp_path / "nasty.yaml"
    path.write_text(yaml.safe_dump(data))
    run = converge(server_sim, path)
    assert run.rc == 0 and "config confirmed" in run.out, run  # the server reports model_path == nasty
    assert not list(REPO.glob("PWNED")) and not list(tmp_path.rglob("PWNED")) and not list(
        server_sim.root.rglob("PWNED"))


def test_port_taken_by_a_non_gpu_process_is_reported_not_crashed_into(server_sim, configs):
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("0.0.0.0", configs["port"]))
        taken.listen()
        run = converge(server_sim, configs["baseline-llama3.1-8b"])
    assert run.rc != 0, run
    assert f"port {configs['port']} is already in use by pid {os.getpid()}" in run.out, run
    assert not (server_sim.root / "servers" / "llm" / "server.log").exists()


def test_verification_only_change_needs_no_restart(server_sim, configs, tmp_path):
    assert converge(server_sim, configs["eagle3-llama3.1-8b"]).rc == 0
    pid = running(server_sim)["pid"]
    data = yaml.safe_load(configs["eagle3-llama3.1-8b"].read_text())
    data["specops"]["min_accept_length"] = 2.5
    path = tmp_path / "stricter.yaml"
    path.write_text(yaml.safe_dump(data))
    run = converge(server_sim, path, "-v")
    assert run.rc == 0 and "healthy; ~ min_accept_length: 2.0 -> 2.5 (no restart)" in run.out, run
    assert running(server_sim)["pid"] == pid
