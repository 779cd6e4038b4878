"""The GPU host simulator itself: ledger, holders, driver release delay and the stand-in nvidia-smi formats."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpusim import ledger
from gpusim.host import SimHost
from operations.remote.probe_gpu import parse_apps_csv, parse_gpu_csv

from conftest import needs_root


def smi(sim, *args):
    return subprocess.run([str(sim.root / "bin" / "nvidia-smi"), *args], capture_output=True, text=True)


def wait_for(condition, timeout=10.0, what="condition"):
    """Poll a condition (bounded); used to observe asynchronous process exits, never as a fixed sleep."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_query_gpu_formats_round_trip(sim):
    sim.hold([0, 1], 70000)
    out = smi(sim, "--query-gpu=index,uuid,name,memory.used,memory.total", "--format=csv,noheader,nounits")
    assert out.returncode == 0
    gpus = parse_gpu_csv(out.stdout)
    assert [(g["index"], g["used_mib"]) for g in gpus] == [(0, 70000), (1, 70000), (2, 0), (3, 0)]
    assert all(g["total_mib"] == ledger.H200_MIB and g["uuid"].startswith("GPU-") for g in gpus)
    header = smi(sim, "--query-gpu=index,memory.used", "--format=csv").stdout.splitlines()
    assert header[0] == "index, memory.used [MiB]" and header[1] == "0, 70000 MiB"


def test_query_compute_apps_lists_live_holders(sim):
    h = sim.hold([2], 1234, name="python3")
    out = smi(sim, "--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid", "--format=csv,noheader,nounits")
    (app,) = parse_apps_csv(out.stdout)
    assert app["pid"] == h.pid and app["used_mib"] == 1234 and app["name"] == "python3"
    assert smi(sim, "--query-compute-apps=pid,bogus", "--format=csv").stdout.startswith(
        'Field "bogus" is not a valid field to query.')


def test_mig_gpu_reports_na_process_memory(tmp_path):
    sim = SimHost.create(tmp_path / "mig", 2, nvml=False, mig=(1,))
    try:
        sim.hold([1], 5000)
        out = smi(sim, "--query-compute-apps=pid,used_gpu_memory", "--format=csv,noheader,nounits").stdout
        assert out.strip().endswith(", [N/A]")
        assert parse_apps_csv(out.replace(", [N/A]", ", x, [N/A], GPU-x").replace(", x,", ", python3,")) != []
        assert smi(sim, "--query-gpu=index,utilization.gpu", "--format=csv").stdout.splitlines() == [
            "index, utilization.gpu [%]", "0, 0 %", "1, [N/A]"]  # the header keeps the unit, as the real tool's
        assert smi(sim, "--query-compute-apps=used_gpu_memory", "--format=csv").stdout.splitlines() == [
            "used_gpu_memory [MiB]", "[N/A]"]
    finally:
        sim.cleanup()


def test_default_table_and_no_driver(sim):
    h = sim.hold([0], 4321)
    table = smi(sim).stdout
    assert "NVIDIA-SMI 550.54.15" in table and "4321MiB / 143771MiB" in table and f"{h.pid}" in table
    assert {len(line) for line in table.splitlines() if line[:1] in ("|", "+")} == {91}  # the real tool's frame
    assert "|   00000000:18:00.0 Off |" in table
    sim.set_driver(False)
    out = smi(sim, "--query-gpu=index", "--format=csv")
    assert out.returncode == 9 and "couldn't communicate with the NVIDIA driver" in out.stdout


def test_no_devices(tmp_path):
    sim = SimHost.create(tmp_path / "none", 0, nvml=False)
    out = smi(sim, "--query-gpu=index", "--format=csv")
    assert out.returncode == 6 and out.stdout == "No devices were found\n"


def test_memory_outlives_the_process_for_the_release_delay(tmp_path):
    sim = SimHost.create(tmp_path / "h", 1, nvml=False, release_delay_s=30.0)
    try:
        h = sim.hold([0], 8000)
        os.kill(h.pid, 15)
        wait_for(lambda: not h.alive(), what="holder exit")
        wait_for(lambda: not sim.snapshot().procs, what="process leaving the table")
        snap = sim.snapshot()
        assert snap.gpus[0].used_mib == 8000 and snap.procs == []  # held, but no process listed
        assert ledger.snapshot(sim.root, now=time.time() + 31).gpus[0].used_mib == 0
    finally:
        sim.cleanup()


def test_release_happens_after_delay(sim):
    h = sim.hold([0], 1000)
    os.kill(h.pid, 15)
    wait_for(lambda: sim.used_mib()[0] == 0, what="release")
    assert not list((sim.root / "ledger").iterdir())


def test_stuck_memory_is_never_released(sim):
    h = sim.hold([3], 7000, stuck=True)
    os.kill(h.pid, 9)
    wait_for(lambda: not h.alive(), what="holder exit")
    assert ledger.snapshot(sim.root, now=time.time() + 86400).gpus[3].used_mib == 7000
    assert ledger.release_all(sim.root) == 1 and sim.used_mib()[3] == 0


def test_ignore_term_mode_really_ignores_sigterm(sim):
    h = sim.hold([0], 10, on_term="ignore")
    sigign = int(next(line for line in Path(f"/proc/{h.pid}/status").read_text().splitlines()
                      if line.startswith("SigIgn:")).split()[1], 16)
    assert sigign & (1 << 14)  # bit 15 (SIGTERM) is set: the kernel discards TERM
    os.kill(h.pid, 15)
    assert h.alive()


def test_holder_has_its_own_session_and_requested_name(sim):
    h = sim.hold([0], 10, name="nvidia-persistenced")
    assert Path(f"/proc/{h.pid}/comm").read_text().strip() == "nvidia-persiste"  # 15 bytes, as the kernel keeps
    assert Path(f"/proc/{h.pid}/cmdline").read_bytes().split(b"\0")[0] == b"nvidia-persistenced"
    assert os.getpgid(h.pid) == h.pid and os.getsid(h.pid) == h.pid


def test_out_of_memory(sim):
    sim.hold([1], 140000)
    with pytest.raises(ledger.OutOfMemory, match="CUDA out of memory. Tried to allocate 5000 MiB on GPU 1"):
        sim.hold([1], 5000)
    cli = subprocess.run([sys.executable, "-m", "gpusim", "hold", str(sim.root), "--gpus", "1", "--mib", "5000"],
                         capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert cli.returncode == 2 and "CUDA out of memory" in cli.stderr


def test_pid_reuse_is_not_mistaken_for_the_holder(sim):
    h = sim.hold([0], 500)
    path = next((sim.root / "ledger").iterdir())
    entry = path.read_text().replace(f'"start": {h.start}', f'"start": {h.start + 1}')
    path.write_text(entry)  # same PID, different start time: a different process
    assert sim.snapshot().procs == []


@needs_root
def test_holder_as_another_user(sim):
    h = sim.hold([0], 10, user="nobody")
    assert os.stat(f"/proc/{h.pid}").st_uid == 65534
