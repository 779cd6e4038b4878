"""The package works from an installed wheel in a fresh venv, run from a directory outside the checkout."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import venv

from conftest import REPO
from gpusim.ledger import proc_start_time


def sh(*argv, **kw):
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def test_wheel_in_clean_venv_runs_a_deploy_from_elsewhere(tmp_path):
    dist = tmp_path / "dist"
    sh(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", dist, REPO)
    (wheel,) = dist.glob("specops-*.whl")
    names = sh(sys.executable, "-m", "zipfile", "-l", wheel)
    for member in ("operations/templates/launch.sh.j2", "operations/templates/server.service.j2",
                   "operations/probe_gpu.py", "operations/signal_procs.py", "gpusim/nvml_stub.c"):
        assert member in names

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    sh(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel)

    work = tmp_path / "elsewhere"
    work.mkdir()
    host_dir = tmp_path / "host"
    sh(py, "-m", "gpusim", "init", host_dir, "--gpus", "2", "--release-delay", "0.3", cwd=work)
    held = json.loads(sh(py, "-m", "gpusim", "hold", host_dir, "--gpus", "1", "--mib", "4000", cwd=work))
    start = proc_start_time(held["pid"])
    try:
        _deploy_from_elsewhere(tmp_path, env_dir, py, work, host_dir)
        assert proc_start_time(held["pid"]) is None
    finally:  # stop what this test started, by PID, if the deploy did not
        for pid in (held["pid"], held["watcher"]):
            if proc_start_time(pid) is not None and (pid != held["pid"] or proc_start_time(pid) == start):
                os.kill(pid, signal.SIGKILL)


def _deploy_from_elsewhere(tmp_path, env_dir, py, work, host_dir):
    (work / "inv.py").write_text(textwrap.dedent(f"""
        import os, sys
        hosts = [("@local", {{"specops_python": sys.executable, "specops_gpu_devices": "{host_dir}/dev/nvidia*",
                             "_env": {{"PATH": "{host_dir}/bin:" + os.environ["PATH"],
                                      "LD_LIBRARY_PATH": "{host_dir}/lib"}}}})]
    """))
    (work / "deploy.py").write_text(textwrap.dedent("""
        import operations
        from operations import gpu
        from operations.render import render

        print("operations from", operations.__file__)
        print(render("launch.sh.j2", name="demo", config_hash="abc", env_file=None,
                     env={"NCCL_DEBUG": "WARN"}, argv=["python3", "-m", "sglang.launch_server", "--model", "a b"]))
        gpu.idle(name="wheel idle", grace_s=1, deadline_s=20)
    """))
    out = sh(env_dir / "bin" / "pyinfra", "-y", "inv.py", "deploy.py", cwd=work,
             env={"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert f"operations from {env_dir}/lib/" in out and "site-packages/operations/__init__.py" in out, out
    assert "exec python3 -m sglang.launch_server --model 'a b'" in out, out
    assert "idle: GPU 0,1 idle after" in out and "stopped by SIGTERM" in out, out
