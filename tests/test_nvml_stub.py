"""The libnvidia-ml.so.1 stand-in, driven through the real pynvml in a subprocess (dlopen needs LD_LIBRARY_PATH at start)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pynvml")

from gpusim.nvml_build import LIB_NAME, SOURCE, build_nvml  # noqa: E402

GIB = 1024**3
SNAPSHOT = f"""\
driver\t550.54.15\t12040
gpu\t0\tGPU-aaaa-0000\tNVIDIA H100 80GB HBM3\t{80 * GIB}\t{10 * GIB}\t0
gpu\t1\tGPU-bbbb-1111\tNVIDIA A100-SXM4-40GB\t{40 * GIB}\t{2 * GIB}\t1
proc\t0\t4242\t{8 * GIB}\tpython3 -m sglang.launch_server --port 30000
proc\t0\t4343\tNA\tmystery worker
proc\t1\t5151\t{2 * GIB}\tvllm serve
future\tkinds\tare\tignored
"""

# Collects what the tests check into one JSON document.
PROBE = textwrap.dedent("""
    import json, pynvml as n
    n.nvmlInit()
    assert hasattr(n.nvmlLib, "gpusim_nvml_stub"), "loaded a real libnvidia-ml, not the stub"
    out = {"count": n.nvmlDeviceGetCount(), "driver": n.nvmlSystemGetDriverVersion(),
           "cuda": n.nvmlSystemGetCudaDriverVersion(), "cuda2": n.nvmlSystemGetCudaDriverVersion_v2(),
           "nvml": n.nvmlSystemGetNVMLVersion(), "gpus": [], "names": {}}
    for i in range(out["count"]):
        h = n.nvmlDeviceGetHandleByIndex(i)
        m, m2 = n.nvmlDeviceGetMemoryInfo(h), n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        procs = n.nvmlDeviceGetComputeRunningProcesses(h)
        for p in procs:
            out["names"][str(p.pid)] = n.nvmlSystemGetProcessName(p.pid)
        uuid = n.nvmlDeviceGetUUID(h)
        out["gpus"].append({
            "index": n.nvmlDeviceGetIndex(h), "name": n.nvmlDeviceGetName(h), "uuid": uuid,
            "by_uuid": n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(uuid)),
            "mem": [m.total, m.used, m.free], "mem2": [m2.total, m2.used, m2.free, m2.reserved],
            "mig": n.nvmlDeviceGetMigMode(h),
            "procs": [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in procs],
            "procs_v2": [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses_v2(h)],
        })
    errs = {}
    for key, call in [("bad_index", lambda: n.nvmlDeviceGetHandleByIndex(99)),
                      ("bad_uuid", lambda: n.nvmlDeviceGetHandleByUUID("GPU-nope")),
                      ("bad_pid", lambda: n.nvmlSystemGetProcessName(1))]:
        try:
            call()
        except n.NVMLError as e:
            errs[key] = e.value
    out["errors"] = errs
    n.nvmlShutdown()
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def libdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("nvml")
    build_nvml(d)
    return d


def write_snapshot(tmp_path: Path, body: str, rc: int = 0, name: str = "snap.sh") -> Path:
    data = tmp_path / (name + ".txt")
    data.write_text(body)
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\ncat '{data}'\nexit {rc}\n")
    script.chmod(0o755)
    return script


def run_py(libdir: Path, code: str, snapshot: Path | None, **env_extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GPUSIM_SNAPSHOT"}
    env["LD_LIBRARY_PATH"] = str(libdir)
    if snapshot is not None:
        env["GPUSIM_SNAPSHOT"] = str(snapshot)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def probe(libdir: Path, snapshot: Path | None, **env_extra: str) -> dict:
    proc = run_py(libdir, PROBE, snapshot, **env_extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_inventory_through_pynvml(libdir, tmp_path):
    out = probe(libdir, write_snapshot(tmp_path, SNAPSHOT))
    assert out["count"] == 2
    assert out["driver"] == "550.54.15"
    assert out["cuda"] == out["cuda2"] == 12040
    assert out["nvml"] == "12.550.54.15"
    g0, g1 = out["gpus"]
    assert [g0["index"], g1["index"]] == [0, 1]
    assert [g0["by_uuid"], g1["by_uuid"]] == [0, 1]
    assert [g0["name"], g1["name"]] == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"]
    assert [g0["uuid"], g1["uuid"]] == ["GPU-aaaa-0000", "GPU-bbbb-1111"]
    assert g0["mem"] == [80 * GIB, 10 * GIB, 70 * GIB]
    assert g1["mem2"] == [40 * GIB, 2 * GIB, 38 * GIB, 0]
    assert g0["mig"] == [0, 0] and g1["mig"] == [1, 1]
    na = 0xFFFFFFFF
    assert g0["procs"] == [[4242, 8 * GIB, na, na], [4343, None, na, na]]
    assert g0["procs_v2"] == [[4242, 8 * GIB], [4343, None]]
    assert g1["procs"] == [[5151, 2 * GIB, na, na]]
    assert out["names"] == {"4242": "python3 -m sglang.launch_server --port 30000",
                            "4343": "mystery worker", "5151": "vllm serve"}
    assert out["errors"] == {"bad_index": 2, "bad_uuid": 6, "bad_pid": 6}


def test_no_proc_lines_means_empty_list(libdir, tmp_path):
    body = "".join(l + "\n" for l in SNAPSHOT.splitlines() if not l.startswith("proc"))
    out = probe(libdir, write_snapshot(tmp_path, body))
    assert [g["procs"] for g in out["gpus"]] == [[], []]


def test_many_processes_use_the_size_retry(libdir, tmp_path):
    # pynvml asks with count 0 first, then retries with 2n+5 slots: 40 is well past any fixed guess.
    body = SNAPSHOT + "".join(f"proc\t1\t{7000 + i}\t{i * 1024}\tworker {i}\n" for i in range(40))
    g1 = probe(libdir, write_snapshot(tmp_path, body))["gpus"][1]
    assert [p[0] for p in g1["procs"]] == [5151] + [7000 + i for i in range(40)]
    assert [p[1] for p in g1["procs"][1:]] == [i * 1024 for i in range(40)]


def test_exact_and_short_buffers_follow_nvml_sizing(libdir, tmp_path):
    code = textwrap.dedent("""
        import ctypes, pynvml as n
        n.nvmlInit()
        lib, h = n.nvmlLib, n.nvmlDeviceGetHandleByIndex(0)
        fn = lib.nvmlDeviceGetComputeRunningProcesses_v3
        c = ctypes.c_uint(1); arr = (n.c_nvmlProcessInfo_v3_t * 2)()
        short = fn(h, ctypes.byref(c), arr), c.value
        c.value = 2
        exact = fn(h, ctypes.byref(c), arr), c.value, arr[1].pid
        buf = ctypes.create_string_buffer(5)
        name = lib.nvmlDeviceGetName(h, buf, ctypes.c_uint(5))
        print(short, exact, name)
    """)
    proc = run_py(libdir, code, write_snapshot(tmp_path, SNAPSHOT))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "(7, 2) (0, 2, 4343) 7"


@pytest.mark.parametrize("body,rc", [(SNAPSHOT, 3), ("gpu\t0\tGPU-x\tX\t1\t0\t0\n", 0)],
                         ids=["command-fails", "no-driver-line"])
def test_bad_snapshot_is_driver_not_loaded(libdir, tmp_path, body, rc):
    code = textwrap.dedent("""
        import pynvml as n
        try:
            n.nvmlInit()
        except n.NVMLError as e:
            print(e.value == n.NVML_ERROR_DRIVER_NOT_LOADED, isinstance(e, n.NVMLError_DriverNotLoaded))
    """)
    proc = run_py(libdir, code, write_snapshot(tmp_path, body, rc=rc))
    assert proc.stdout.split() == ["True", "True"], proc.stderr


def test_missing_command_is_driver_not_loaded(libdir, tmp_path):
    code = "import pynvml as n\ntry:\n n.nvmlInit()\nexcept n.NVMLError as e:\n print(e.value)"
    proc = run_py(libdir, code, tmp_path / "does-not-exist")
    assert proc.stdout.strip() == "9", proc.stderr


def test_default_command_found_on_path(libdir, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    write_snapshot(bindir, SNAPSHOT, name="gpusim-snapshot")
    out = probe(libdir, None, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    assert out["count"] == 2


def test_uninitialized_and_reinit_rereads(libdir, tmp_path):
    # ctypes directly: pynvml itself refuses calls before it has loaded the library.
    snap = write_snapshot(tmp_path, SNAPSHOT)
    data = Path(str(snap) + ".txt")
    code = textwrap.dedent(f"""
        import ctypes, pynvml as n
        lib = ctypes.CDLL("{LIB_NAME}")
        c = ctypes.c_uint()
        before = lib.nvmlDeviceGetCount_v2(ctypes.byref(c))
        n.nvmlInit(); first = n.nvmlDeviceGetCount(); n.nvmlShutdown()
        after = lib.nvmlDeviceGetCount_v2(ctypes.byref(c))
        open({str(data)!r}, "w").write({SNAPSHOT.split(chr(10) + "gpu" + chr(9) + "1")[0] + chr(10)!r})
        n.nvmlInit(); second = n.nvmlDeviceGetCount()
        print(before, first, after, second, lib.nvmlShutdown(), lib.nvmlShutdown())
    """)
    proc = run_py(libdir, code, snap)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "2", "1", "1", "0", "1"]


def test_build_is_cached_and_rebuilt_when_source_is_newer(tmp_path):
    lib = build_nvml(tmp_path)
    assert lib == tmp_path / LIB_NAME and os.access(lib, os.R_OK | os.X_OK)
    mtime = lib.stat().st_mtime_ns
    assert build_nvml(tmp_path).stat().st_mtime_ns == mtime  # up to date: untouched
    old = SOURCE.stat().st_mtime - 10
    os.utime(lib, (old, old))
    assert build_nvml(tmp_path).stat().st_mtime > old  # stale: rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [LIB_NAME]  # no temp files left behind


def test_memory_rc_field_and_unresolved_process_names(libdir, tmp_path):
    # gpu lines may carry an 8th field: what nvmlDeviceGetMemoryInfo returns (3 NOT_SUPPORTED, 4 NO_PERMISSION);
    # an empty proc name is a PID with no local process (a driver reporting another PID namespace's PIDs).
    body = (f"driver\t580.95.05\t13000\n"
            f"gpu\t0\tGPU-gb10\tNVIDIA GB10\t{120 * GIB}\t{6 * GIB}\t0\t3\n"
            f"gpu\t1\tGPU-mig\tNVIDIA A100-SXM4-80GB\t{80 * GIB}\t0\t1\t4\n"
            f"gpu\t2\tGPU-ok\tNVIDIA H200\t{140 * GIB}\t0\t0\t0\n"
            f"gpu\t3\tGPU-bad\tX\t1\t0\t0\tbogus\n"  # malformed: ignored like any bad line
            f"proc\t0\t4194000\t{6 * GIB}\t\n")
    code = textwrap.dedent("""
        import json, pynvml as n
        n.nvmlInit()
        out = {"count": n.nvmlDeviceGetCount(), "mem": []}
        for i in range(out["count"]):
            h = n.nvmlDeviceGetHandleByIndex(i)
            row = []
            for version in (None, n.nvmlMemory_v2):
                try:
                    row.append(n.nvmlDeviceGetMemoryInfo(h, version=version).total)
                except n.NVMLError as e:
                    row.append(type(e).__name__)
            out["mem"].append(row)
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["pids"] = [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
        try:
            n.nvmlSystemGetProcessName(4194000)
        except n.NVMLError_NotFound:
            out["name"] = "not found"
        print(json.dumps(out))
    """)
    proc = run_py(libdir, code, write_snapshot(tmp_path, body))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["count"] == 3
    assert out["mem"] == [["NVMLError_NotSupported"] * 2, ["NVMLError_NoPermission"] * 2, [140 * GIB] * 2]
    assert out["pids"] == [4194000] and out["name"] == "not found"
