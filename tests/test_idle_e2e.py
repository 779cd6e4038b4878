"""gpu.idle end to end: the real pyinfra CLI, deploy.py and inventory/sim.py against a simulated host."""
import re

from conftest import needs_root, run_pyinfra as _run_pyinfra


def run_pyinfra(sim, *args):
    """deploy.py with config=none: the main job reduced to "every GPU idle"."""
    return _run_pyinfra(sim, "--data", "config=none", *args)


def test_idle_gpus_make_no_change_twice(sim):
    for _ in range(2):
        run = run_pyinfra(sim, "-v")
        assert run.rc == 0, run
        assert "already idle (0 MiB used, via pynvml)" in run.out, run
        assert re.search(r"GPUs idle\s+1\s+-\s+-\s+1", run.out), run  # Success '-', No Change 1


def test_busy_gpus_converge_then_rerun_is_noop(sim):
    h = sim.hold([0, 1], 70000)
    run = run_pyinfra(sim)
    assert run.rc == 0, run
    assert "idle: GPU 0,1,2,3 idle after" in run.out and f"pid {h.pid} stopped by SIGTERM" in run.out, run
    assert not h.alive() and sim.used_mib() == {0: 0, 1: 0, 2: 0, 3: 0}
    again = run_pyinfra(sim, "-v")
    assert again.rc == 0 and "already idle" in again.out, again
    assert re.search(r"GPUs idle\s+1\s+-\s+-\s+1", again.out), again


def test_term_ignoring_holder_needs_kill_and_output_says_so(sim):
    polite = sim.hold([0], 1000)
    stubborn = sim.hold([1], 2000, on_term="ignore")
    run = run_pyinfra(sim, "--data", "grace_s=0.5")
    assert run.rc == 0, run
    m = re.search(rf"pid {stubborn.pid} \(python3 -m gpusim.holder .*\) ignored SIGTERM for (\d\.\d)s: sending SIGKILL",
                  run.out)
    assert m and float(m.group(1)) >= 0.5, run
    assert f"pid {polite.pid} stopped by SIGTERM, pid {stubborn.pid} needed SIGKILL" in run.out, run
    assert not polite.alive() and not stubborn.alive()


@needs_root
def test_protected_daemon_and_other_users_job_survive(sim):
    daemon = sim.hold([0], 300, name="nvidia-persistenced")
    theirs = sim.hold([3], 5000, user="nobody")
    ours = sim.hold([0, 1], 9000)
    run = run_pyinfra(sim, "--data", "gpus=0,1,2")  # GPU 3 is someone else's: not ours to free
    assert run.rc == 0, run
    assert "leave pid %d" % daemon.pid in run.out and "protected daemon" in run.out, run
    assert not ours.alive() and daemon.alive() and theirs.alive()
    blocked = run_pyinfra(sim)  # all GPUs: the other user's job blocks, and is not touched
    assert blocked.rc != 0, blocked
    assert f"blocked: GPU 3 held by processes this operation may not stop: pid {theirs.pid} on GPU 3 " \
           f"(user nobody" in blocked.out, blocked
    assert "Nothing was signalled" in blocked.out
    assert daemon.alive() and theirs.alive() and sim.used_mib()[3] == 5000


def test_stuck_memory_fails_within_deadline_with_verdict(sim):
    h = sim.hold([2], 60000, stuck=True)
    run = run_pyinfra(sim, "--data", "deadline_s=2", "--data", "grace_s=0.5")
    assert run.rc != 0, run
    m = re.search(r"needs-reset: after (\d+\.\d)s GPU 2: 60000 MiB still allocated; pids that survived SIGKILL: "
                  r"none \(pid (\d+) stopped by SIGTERM\)", run.out)
    assert m, run
    assert float(m.group(1)) <= 2.0 and int(m.group(2)) == h.pid
    assert "nvidia-smi --gpu-reset -i 2" in run.out and not h.alive()


def test_dry_run_prints_kill_plan_and_changes_nothing(sim):
    h = sim.hold([1, 2], 33000, name="python3")
    for flags in (["--dry"], ["--dry", "--diff"]):
        run = run_pyinfra(sim, *flags)
        assert run.rc == 0, run
        assert (f"gpu.idle plan: stop pid {h.pid} (process group {h.pid}), user root, GPU 1,2, 66000 MiB: "
                f"python3 -m gpusim.holder") in run.out, run
        assert re.search(r"GPUs idle\s+1 \(@local\)", run.out), run
        assert h.alive() and sim.used_mib()[1] == 33000


def test_no_driver_is_a_clear_failure(sim):
    sim.set_driver(False)
    run = run_pyinfra(sim)
    assert run.rc != 0
    assert "gpu.idle: cannot read GPUs: pynvml: NVMLError_DriverNotLoaded" in run.out, run
    assert "nvidia-smi: RuntimeError: NVIDIA-SMI has failed because it couldn't communicate" in run.out, run


def test_nvidia_smi_fallback_when_no_nvml(sim_smi_only):
    h = sim_smi_only.hold([3], 100)
    run = run_pyinfra(sim_smi_only, "-v")
    assert run.rc == 0 and not h.alive(), run
    assert "via nvidia-smi" in run_pyinfra(sim_smi_only, "-v").out


def test_process_group_is_stopped_whole(sim):
    """A launcher whose worker holds the GPU: TERM goes to the group, so the launcher exits too."""
    worker = sim.hold([0], 100)
    run = run_pyinfra(sim)
    assert run.rc == 0 and f"TERM process group {worker.pid}" in run.out or "stopped by SIGTERM" in run.out, run
