"""Two specops runs at once on one host: the host lease (operations/controller/lease.py, operations/remote/lease.py)."""
import getpass
import json
import os
import signal
import stat
import subprocess

from conftest import REPO, pyinfra_argv
from factories import host_program
from test_gpusim import wait_for


def lease_file(sim):
    return sim.root / "servers" / ".specops-lock.json"


def start(sim, *args) -> subprocess.Popen:
    return subprocess.Popen(pyinfra_argv("sim.py", "deploy.py", args), cwd=REPO, env=sim.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout=120):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def events(sim) -> list[dict]:
    return [json.loads(line) for line in (sim.root / "timeline.jsonl").read_text().splitlines()]


def second_during_first(sim, first_config, *second_args):
    """Start a deploy and, once it holds the host lease, a second one; the lease then, both (rc, output)."""
    first = start(sim, "--data", f"config={first_config}")
    try:
        wait_for(lambda: lease_file(sim).exists(), timeout=60)
        lease = {**json.loads(lease_file(sim).read_text()), "mode": stat.S_IMODE(lease_file(sim).stat().st_mode)}
        second = finish(start(sim, *second_args))
    finally:
        done = finish(first)
    return lease, done, second


def test_second_deploy_waits_for_the_first_then_converges(server_sim, configs):
    sim = server_sim
    sim.configure(server_start_s=2.0)
    lease, (rc1, out1), (rc2, out2) = second_during_first(sim, configs["baseline-llama3.1-8b"],
                                                          "--data", f"config={configs['eagle3-llama3.1-8b']}")
    assert "baseline-llama3.1-8b" in lease["what"] and lease["mode"] == 0o600, lease
    assert rc1 == 0, out1
    assert rc2 == 0, out2
    holder = f"{getpass.getuser()}@{lease['controller']} pid {lease['pid']} (server llm -> config baseline-llama3.1-8b)"
    assert f"lock: waiting for another specops run: {holder}" in out2 and "lock: acquired after" in out2, out2
    # the first run's server was verified ready before the second one stopped it: no interleaving
    seq = [e["event"] for e in events(sim)]
    assert seq == ["launch", "ready", "term", "exit", "launch", "ready"], seq
    state = json.loads((sim.root / "servers" / "llm" / "state.json").read_text())
    assert state["status"] == "running" and state["recorded"]["args"]["speculative_algorithm"] == "EAGLE3"
    assert not lease_file(sim).exists()  # released at the end of the second run


def test_second_deploy_that_may_not_wait_fails_clearly_and_changes_nothing(server_sim, configs):
    sim = server_sim
    sim.configure(server_start_s=2.0)
    baseline = configs["baseline-llama3.1-8b"]
    _, (rc1, out1), (rc2, out2) = second_during_first(sim, baseline, "--data", f"config={configs['eagle3-llama3.1-8b']}",
                                                      "--data", "specops_lock_wait_s=0")
    assert rc1 == 0, out1
    assert rc2 != 0, out2
    assert "another specops run holds this host" in out2 and "nothing changed here" in out2, out2
    assert "FAILED @local" in out2, out2
    assert [e["event"] for e in events(sim)] == ["launch", "ready"]  # the first run's server, untouched
    rc, out = finish(start(sim, "--data", f"config={baseline}"))
    assert rc == 0 and "No changes" in out, out


def test_lease_of_a_killed_run_is_broken_by_the_next_run_from_the_same_controller(server_sim, configs):
    sim = server_sim
    sim.configure(server_start_s=2.0)
    eagle3 = configs["eagle3-llama3.1-8b"]
    first = start(sim, "--data", f"config={configs['baseline-llama3.1-8b']}")
    try:
        wait_for(lambda: lease_file(sim).exists(), timeout=60)
    finally:
        first.send_signal(signal.SIGKILL)  # the controller dies mid-run (a process this test started)
        finish(first)
    assert json.loads(lease_file(sim).read_text())["pid"] == first.pid  # left behind
    rc, out = finish(start(sim, "--data", f"config={eagle3}", "--data", "specops_lock_wait_s=0"))
    assert rc == 0, out
    assert f"lock: took over the lease of {getpass.getuser()}@" in out and "its run has ended" in out, out
    rc, out = finish(start(sim, "--data", f"config={eagle3}"))
    assert rc == 0 and "No changes" in out, out


def host_lock(tmp_path, *args):
    out = subprocess.run(host_program("lease.py", *args), capture_output=True, text=True, timeout=30,
                         env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_host_lease_rules(tmp_path):
    path = str(tmp_path / "state" / ".specops-lock.json")
    a, b = {"id": "a", "pid": 1}, {"id": "b", "pid": 2}
    assert host_lock(tmp_path, "acquire", path, json.dumps(a), "60") == {"acquired": True, "took_over": None,
                                                                       "fresh": True}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    refused = host_lock(tmp_path, "acquire", path, json.dumps(b), "60")
    assert refused["acquired"] is False and refused["holder"]["id"] == "a"
    renewed = host_lock(tmp_path, "acquire", path, json.dumps(a), "0")  # the holder renews (here: to expire now)
    assert renewed["acquired"] is True and renewed["fresh"] is False
    took = host_lock(tmp_path, "acquire", path, json.dumps(b), "60")
    assert took["acquired"] is True and took["took_over"]["id"] == "a" and took["took_over"]["why"] == "expired"
    assert host_lock(tmp_path, "release", path, "a")["released"] is False  # only the holder releases
    broken = host_lock(tmp_path, "acquire", path, json.dumps(a), "60", "b")
    assert broken["took_over"]["why"] == "broken"
    assert host_lock(tmp_path, "release", path, "a") == {"released": True}
    assert not os.path.exists(path)
