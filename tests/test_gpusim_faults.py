"""The simulator's real-world faults: unreadable GPU memory, device files held open, a driver reporting PIDs from
another PID namespace, memory pinned by an unlisted descendant, and a running server's accept length moving."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, free_port
from gpusim import ledger
from gpusim.host import SimHost
from test_gpusim import smi, wait_for


def fd_targets(pid: int) -> set[str]:
    """What ``readlink /proc/PID/fd/*`` shows."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:  # closed meanwhile
            pass
    return out


def devices(sim: SimHost, *gpus: int) -> set[str]:
    dev = sim.root.resolve() / "dev"
    return {str(dev / "nvidiactl"), str(dev / "nvidia-uvm"), *(str(dev / f"nvidia{i}") for i in gpus)}


def gpu_devices_open(pid: int) -> set[str]:
    return {t for t in fd_targets(pid) if "/dev/nvidia" in t and not t.startswith("/dev/")}


def apps(sim: SimHost) -> list[list[str]]:
    out = smi(sim, "--query-compute-apps=pid,process_name,used_gpu_memory", "--format=csv,noheader,nounits").stdout
    return [line.split(", ") for line in out.splitlines() if line]


def unused_pid() -> int:
    """A PID no process has (the brief's 4194000, or the next free one below it)."""
    pid = 4194000
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def nvml(sim: SimHost, body: str) -> dict:
    """Run ``body`` against the libnvidia-ml stand-in through the real pynvml in a subprocess; its JSON result."""
    pytest.importorskip("pynvml")
    code = "import json, pynvml as n\nn.nvmlInit()\nout = {}\n" + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    proc = subprocess.run([sys.executable, "-c", code], env=sim.env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def slow_release(tmp_path):
    """A host whose driver takes 30 s to free a dead context: any freeing seen sooner is a bug, not timing."""
    host = SimHost.create(tmp_path / "slow", 4, release_delay_s=30.0)
    yield host
    host.cleanup()


# --- 1. unreadable GPU memory ----------------------------------------------------------------------------------

def test_unreadable_memory_in_query_gpu(sim):
    sim.configure_gpu(0, memory="na")
    sim.configure_gpu(1, memory="noperm")
    h = sim.hold([0], 4000)
    fields = "--query-gpu=index,memory.used,memory.total,memory.free"
    out = smi(sim, fields, "--format=csv").stdout.splitlines()
    assert out[0] == "index, memory.used [MiB], memory.total [MiB], memory.free [MiB]"  # header keeps the units
    assert out[1] == "0, [N/A], [N/A], [N/A]"
    assert out[2] == "1, [Insufficient Permissions], [Insufficient Permissions], [Insufficient Permissions]"
    assert out[3] == f"2, 0 MiB, {ledger.H200_MIB} MiB, {ledger.H200_MIB} MiB"
    bare = smi(sim, fields, "--format=csv,noheader,nounits").stdout.splitlines()
    assert bare[:3] == ["0, [N/A], [N/A], [N/A]",
                        "1, [Insufficient Permissions], [Insufficient Permissions], [Insufficient Permissions]",
                        f"2, 0, {ledger.H200_MIB}, {ledger.H200_MIB}"]
    assert apps(sim) == [[str(h.pid), "python3", "4000"]]  # per-process memory still reads, as on a GB10
    assert sim.used_mib()[0] == 4000  # only the reporting changes: the ledger still books it
    with pytest.raises(ledger.OutOfMemory):
        sim.hold([0], ledger.H200_MIB)


def table_memory_cells(table: str) -> list[str]:
    """The Memory-Usage cell of each GPU block (the second line of each block)."""
    lines = table.splitlines()
    return [lines[i + 1].split("|")[2] for i, line in enumerate(lines) if line.startswith("|   ") and " On  |" in line]


def test_unreadable_memory_in_the_default_table(sim):
    sim.configure_gpu(0, memory="na")
    sim.configure_gpu(1, memory="noperm")
    sim.hold([2], 1234)
    cells = table_memory_cells(smi(sim).stdout)
    assert [c.strip() for c in cells] == ["Not Supported", "N/A", f"1234MiB / {ledger.H200_MIB}MiB",
                                          f"0MiB / {ledger.H200_MIB}MiB"]
    assert cells[0] == f" {'Not Supported':<22} " and cells[1] == f" {'N/A':>22} "  # as the real tool aligns them
    assert {len(line) for line in smi(sim).stdout.splitlines() if line[:1] in ("|", "+")} == {91}  # the frame stays intact


def test_gpu_memory_setting_cli_and_validation(sim):
    cli = [sys.executable, "-m", "gpusim", "gpu", str(sim.root), "--index", "3", "--memory"]
    assert subprocess.run([*cli, "noperm"], cwd=REPO, capture_output=True).returncode == 0
    assert sim.snapshot().gpus[3].memory == "noperm"
    assert "[Insufficient Permissions]" in smi(sim, "--query-gpu=memory.free", "-i", "3", "--format=csv").stdout
    assert subprocess.run([*cli, "ok"], cwd=REPO, capture_output=True).returncode == 0
    assert smi(sim, "--query-gpu=memory.free", "-i", "3", "--format=csv,noheader").stdout == f"{ledger.H200_MIB} MiB\n"
    assert subprocess.run([*cli, "bogus"], cwd=REPO, capture_output=True).returncode == 2
    bad_index = subprocess.run([*cli[:-3], "--index", "9", "--memory", "na"], cwd=REPO, capture_output=True, text=True)
    assert bad_index.returncode == 2 and "no GPU 9" in bad_index.stderr
    with pytest.raises(ValueError):
        sim.configure_gpu(0, memory="unknown")


def test_unreadable_memory_through_pynvml(sim):
    sim.configure_gpu(0, memory="na")
    sim.configure_gpu(1, memory="noperm")
    h = sim.hold([0], 2048)
    out = nvml(sim, """
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            row = out[str(i)] = {}
            for key, call in [("v1", lambda: n.nvmlDeviceGetMemoryInfo(h)),
                              ("v2", lambda: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2))]:
                try:
                    m = call()
                    row[key] = [m.total, m.used]
                except n.NVMLError as e:
                    row[key] = [type(e).__name__, e.value, str(e)]
            row["procs"] = [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
    """)
    mib = 1024 * 1024
    assert out["0"]["v1"] == out["0"]["v2"] == ["NVMLError_NotSupported", 3, "Not Supported"]
    assert out["1"]["v1"] == out["1"]["v2"] == ["NVMLError_NoPermission", 4, "Insufficient Permissions"]
    assert out["2"]["v1"] == out["2"]["v2"] == [ledger.H200_MIB * mib, 0]
    assert out["0"]["procs"] == [[h.pid, 2048 * mib]]


# --- 2. device files held open ------------------------------------------------------------------------------------

def test_host_has_device_file_stand_ins(tmp_path):
    sim = SimHost.create(tmp_path / "h", 3, nvml=False)
    dev = sim.root / "dev"
    assert sorted(p.name for p in dev.iterdir()) == ["nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidiactl"]
    for p in dev.iterdir():
        assert p.is_file() and p.stat().st_size == 0 and p.stat().st_mode & 0o777 == 0o666
    assert sim.device_glob == str(sim.root / "dev" / "nvidia*")
    SimHost.create(tmp_path / "h", 1, nvml=False)  # re-initialised smaller: no stale GPU device left
    assert sorted(p.name for p in dev.iterdir()) == ["nvidia-uvm", "nvidia0", "nvidiactl"]


def test_holder_keeps_its_gpus_device_files_open(sim):
    h = sim.hold([1, 3], 100)
    assert gpu_devices_open(h.pid) == devices(sim, 1, 3)
    assert gpu_devices_open(h.watcher) == set()  # the driver's watcher is no CUDA process
    bare = sim.hold([0], 100, device_fds=False)
    assert gpu_devices_open(bare.pid) == set() and [int(a[0]) for a in apps(sim)] == [h.pid, h.pid, bare.pid]


@pytest.mark.timeout(60)
def test_sglang_server_keeps_device_files_open_and_reports_live_accept_length(sim):
    sim.configure(server_start_s=0.2)
    port = free_port()
    argv = [str(sim.root / "bin" / "sglang-launch-server"), "--model-path", "m", "--host", "127.0.0.1",
            "--port", str(port), "--tp-size", "2", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", "d", "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
            "--speculative-num-draft-tokens", "16"]
    proc = subprocess.Popen(argv, env=sim.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for(lambda: sim.used_mib()[0] > 0, timeout=20, what="server booking its memory")
        assert gpu_devices_open(proc.pid) == devices(sim, 0, 1)

        def accept() -> float | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=2) as r:
                    return json.load(r)["internal_states"][0]["avg_spec_accept_length"]
            except OSError:
                return None

        wait_for(lambda: accept() is not None, timeout=20, what="server answering")
        start = accept()
        assert start > 2.0
        sim.configure(accept_length=1.2)
        assert accept() == 1.2  # re-read on each request, no restart
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as r:
            assert json.load(r)["internal_states"][0]["avg_spec_accept_length"] == 1.2
        sim.configure(accept_length=2.7)
        assert accept() == 2.7
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    wait_for(lambda: sim.used_mib()[0] == 0, what="the server's memory released")  # its watcher is done


# --- 3. PID namespace mismatch ------------------------------------------------------------------------------------

def test_reported_pid_with_no_local_process(slow_release):
    sim, n = slow_release, unused_pid()
    h = sim.hold([0], 700, report_pid=n)
    assert h.report_pid == n
    assert apps(sim) == [[str(n), "[Not Found]", "700"]]
    row = next(line for line in smi(sim).stdout.splitlines() if f" {n} " in line)
    assert "[Not Found]" in row and "700MiB" in row and str(h.pid) not in smi(sim).stdout
    out = nvml(sim, f"""
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["pids"] = [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
        try:
            out["name"] = n.nvmlSystemGetProcessName({n})
        except n.NVMLError_NotFound:
            out["name"] = None
    """)
    assert out == {"pids": [n], "name": None}
    os.kill(h.pid, signal.SIGKILL)
    wait_for(lambda: apps(sim) == [], what="the entry leaving the list")
    assert sim.used_mib()[0] == 700  # released after the real holder's death plus the delay, not before
    assert ledger.snapshot(sim.root, now=time.time() + 31).gpus[0].used_mib == 0


def test_reported_pid_of_an_unrelated_local_process(slow_release):
    sim = slow_release
    other = subprocess.Popen(["sleep", "600"])
    other_start = ledger.proc_start_time(other.pid)
    try:
        h = sim.hold([1], 900, report_pid=other.pid)
        assert apps(sim) == [[str(other.pid), "sleep", "900"]]  # the name resolved locally, as nvidia-smi does
        out = nvml(sim, f"""
            h = n.nvmlDeviceGetHandleByIndex(1)
            out["pids"] = [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
            out["name"] = n.nvmlSystemGetProcessName({other.pid})
        """)
        assert out == {"pids": [other.pid], "name": "sleep"}
        other.kill()
        other.wait()
        assert apps(sim) == [[str(other.pid), "[Not Found]", "900"]]  # liveness follows the real holder
        os.kill(h.pid, signal.SIGKILL)
        wait_for(lambda: not h.alive(), what="holder exit")
        wait_for(lambda: apps(sim) == [], what="the entry leaving the list")
        assert sim.used_mib()[1] == 900
        assert ledger.snapshot(sim.root, now=time.time() + 31).gpus[1].used_mib == 0
    finally:
        if ledger.proc_start_time(other.pid) == other_start:
            other.kill()
        other.wait()


# --- 4. memory pinned by an unlisted descendant -------------------------------------------------------------------

def entry(sim: SimHost) -> dict:
    (path,) = (sim.root / "ledger").glob("*.json")
    return json.loads(path.read_text())


def test_pinning_child_keeps_memory_after_the_holder_dies(slow_release):
    sim = slow_release
    h = sim.hold([2], 900, pin_child=True)
    assert h.pin_alive() and h.pin_pid != h.pid
    stat = Path(f"/proc/{h.pin_pid}/stat").read_text()
    assert int(stat[stat.rindex(")") + 2:].split()[1]) == h.pid  # a child of the holder ...
    assert os.getsid(h.pin_pid) == h.pin_pid != os.getsid(h.pid)  # ... in its own session
    assert gpu_devices_open(h.pin_pid) == gpu_devices_open(h.pid) == devices(sim, 2)
    assert [int(a[0]) for a in apps(sim)] == [h.pid]  # the driver lists only the holder

    os.killpg(h.pid, signal.SIGTERM)  # the holder's whole process group: the child is not in it
    wait_for(lambda: not h.alive(), what="holder exit")
    assert h.pin_alive() and apps(sim) == []
    assert ledger.snapshot(sim.root, now=time.time() + 3600).gpus[2].used_mib == 900  # no countdown yet
    assert entry(sim)["dead_at"] is None

    killed = time.time()
    os.kill(h.pin_pid, signal.SIGKILL)
    wait_for(lambda: not h.pin_alive(), what="pinning child exit")
    wait_for(lambda: entry(sim)["dead_at"] is not None, what="the driver noticing")
    dead_at = entry(sim)["dead_at"]
    assert dead_at >= killed  # the release delay counts from the child's death
    assert ledger.snapshot(sim.root, now=dead_at + 29).gpus[2].used_mib == 900
    assert ledger.snapshot(sim.root, now=dead_at + 30.01).gpus[2].used_mib == 0


def test_pinned_memory_is_released_after_the_delay(sim):
    h = sim.hold([1], 300, pin_child=True)
    os.kill(h.pid, signal.SIGKILL)
    wait_for(lambda: not h.alive(), what="holder exit")
    assert sim.used_mib()[1] == 300
    os.kill(h.pin_pid, signal.SIGKILL)
    wait_for(lambda: sim.used_mib()[1] == 0, what="release after the child's death")


def test_child_dying_first_leaves_the_holder_in_charge(sim):
    h = sim.hold([0], 400, pin_child=True)
    os.kill(h.pin_pid, signal.SIGKILL)
    wait_for(lambda: not h.pin_alive(), what="pinning child exit")
    assert [int(a[0]) for a in apps(sim)] == [h.pid] and sim.used_mib()[0] == 400
    os.kill(h.pid, signal.SIGKILL)
    wait_for(lambda: sim.used_mib()[0] == 0, what="release after the holder's death")


def test_stuck_and_pinned_stays_stuck(sim):
    h = sim.hold([3], 500, pin_child=True, stuck=True)
    os.kill(h.pid, signal.SIGKILL)
    os.kill(h.pin_pid, signal.SIGKILL)
    wait_for(lambda: not h.alive() and not h.pin_alive(), what="both exits")
    assert ledger.snapshot(sim.root, now=time.time() + 86400).gpus[3].used_mib == 500


def test_cleanup_kills_the_pinning_child(tmp_path):
    sim = SimHost.create(tmp_path / "h", 1, nvml=False, release_delay_s=0.2)
    h = sim.hold([0], 10, pin_child=True, on_term="ignore")
    sim.cleanup()
    wait_for(lambda: not h.alive() and not h.pin_alive(), what="holder and child gone")


def test_cli_hold_with_fault_flags(sim):
    n = unused_pid()
    cli = subprocess.run([sys.executable, "-m", "gpusim", "hold", str(sim.root), "--gpus", "1", "--mib", "50",
                          "--pin-child", "--report-pid", str(n), "--no-device-fds"],
                         cwd=REPO, capture_output=True, text=True, timeout=30)
    assert cli.returncode == 0, cli.stderr
    info = json.loads(cli.stdout)
    pids = {info["pid"]: ledger.proc_start_time(info["pid"]), info["pin_pid"]: info["pin_start"],
            info["watcher"]: ledger.proc_start_time(info["watcher"])}
    try:
        assert ledger.proc_start_time(info["pin_pid"]) == info["pin_start"]
        assert apps(sim) == [[str(n), "[Not Found]", "50"]]
        assert gpu_devices_open(info["pid"]) == gpu_devices_open(info["pin_pid"]) == set()
    finally:
        for pid, start in pids.items():
            if start is not None and ledger.proc_start_time(pid) == start:
                os.kill(pid, signal.SIGKILL)
