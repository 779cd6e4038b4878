"""nvidia-smi CSV and probe-document parsers, on output captured from the real tools."""
import pytest

from operations.model.gpus import parse_probe
from operations.remote.probe_gpu import parse_apps_csv, parse_gpu_csv, satisfied

# nvidia-smi 550.54.15 on an 8x H100 node, two GPUs in MIG mode (memory per process is [N/A] there)
REAL_GPUS = """\
0, GPU-1e4c3f0a-8a4b-2b2c-5f1e-0d3c5a8b7e61, NVIDIA H100 80GB HBM3, 72419, 81559
1, GPU-7b2d9e3c-1f4a-6c8d-9e0b-3a5c7d9e1f23, NVIDIA H100 80GB HBM3, 4, 81559
2, GPU-2c4e6a8b-0d1f-3a5c-7e9b-1d3f5a7c9e0b, NVIDIA H100 80GB HBM3, [N/A], 81559
"""
REAL_APPS = """\
2338147, /usr/bin/python3, 72410, GPU-1e4c3f0a-8a4b-2b2c-5f1e-0d3c5a8b7e61
2338200, python3 -m sglang.launch_server, [N/A], GPU-2c4e6a8b-0d1f-3a5c-7e9b-1d3f5a7c9e0b
"""


def test_gpu_csv_with_na_memory():
    gpus = parse_gpu_csv(REAL_GPUS)
    assert [(g["index"], g["used_mib"], g["total_mib"]) for g in gpus] == [(0, 72419, 81559), (1, 4, 81559),
                                                                           (2, None, 81559)]
    assert gpus[2]["memory_error"] == "nvidia-smi reports memory.used as [N/A]" and gpus[0]["memory_error"] == ""
    assert gpus[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert gpus[1]["uuid"] == "GPU-7b2d9e3c-1f4a-6c8d-9e0b-3a5c7d9e1f23"


# DGX Spark (GB10, unified memory): nvidia-smi reports no framebuffer memory; MIG in an unprivileged container
UNREADABLE_GPUS = """\
0, GPU-a1b2c3d4-0000-1111-2222-333344445555, NVIDIA GB10, [N/A], [N/A]
1, GPU-b1b2c3d4-0000-1111-2222-333344445555, NVIDIA H100 80GB HBM3, [Insufficient Permissions], [Insufficient Permissions]
"""


def test_gpu_csv_unreadable_memory_is_none_with_the_reason_never_zero():
    gpus = parse_gpu_csv(UNREADABLE_GPUS)
    assert [(g["used_mib"], g["total_mib"]) for g in gpus] == [(None, None), (None, None)]
    assert gpus[0]["memory_error"] == "nvidia-smi reports memory.used as [N/A]"
    assert gpus[1]["memory_error"] == "nvidia-smi reports memory.used as [Insufficient Permissions]"


def test_apps_csv_with_na_and_spaces():
    apps = parse_apps_csv(REAL_APPS)
    assert apps[0] == {"pid": 2338147, "name": "/usr/bin/python3", "used_mib": 72410,
                       "gpu_uuid": "GPU-1e4c3f0a-8a4b-2b2c-5f1e-0d3c5a8b7e61"}
    assert apps[1]["used_mib"] is None and apps[1]["name"] == "python3 -m sglang.launch_server"


def test_no_processes_is_empty():
    assert parse_apps_csv("") == []
    assert parse_apps_csv("\n") == []
    assert parse_apps_csv("No running processes found\n") == []


def test_units_left_in_are_tolerated():
    assert parse_gpu_csv("0, GPU-x, NVIDIA H200, 123 MiB, 143771 MiB\n")[0]["used_mib"] == 123


def test_name_containing_comma_is_rejoined():
    apps = parse_apps_csv("77, python3 train.py --tags a, b, 100, GPU-x\n")
    assert apps == [{"pid": 77, "name": "python3 train.py --tags a, b", "used_mib": 100, "gpu_uuid": "GPU-x"}]


def test_garbage_line_raises():
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        parse_gpu_csv("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")


def _me():
    return {"uid": 0, "user": "root", "pid": 9, "sid": 9, "pgid": 9}


def test_probe_from_smi_enriches_from_proc():
    doc = {"source": "nvidia-smi", "gpus": parse_gpu_csv(REAL_GPUS), "apps": parse_apps_csv(REAL_APPS),
           "errors": ["pynvml: boom"],
           "me": _me(),
           "procs": {"2338147": {"state": "S", "ppid": 1, "pgid": 2338147, "sid": 2338147, "start": 555,
                                 "uid": 1000, "user": "alice", "comm": "python3", "argv": ["python3", "train.py"]},
                     "2338200": None},
           "groups": {"2338147": [{"pid": 2338147, "uid": 1000, "comm": "python3"}]}}
    state = parse_probe(doc)
    assert state.available and state.source == "nvidia-smi"
    p0, p1 = state.processes
    assert (p0.pid, p0.gpu_index, p0.user, p0.cmdline, p0.start, p0.pgid) == (
        2338147, 0, "alice", "python3 train.py", 555, 2338147)
    assert len(p0.group) == 1
    assert p1.gpu_index == 2 and p1.start is None  # gone from /proc between the two reads
    assert state.errors == ("pynvml: boom",)


def test_probe_none_is_unavailable_with_reason():
    state = parse_probe({"source": "none", "errors": ["pynvml: NVMLError_LibraryNotFound", "nvidia-smi: not found"],
                         "me": _me()})
    assert not state.available
    assert "LibraryNotFound" in state.error and "nvidia-smi: not found" in state.error


def test_probe_with_driver_but_no_gpus():
    state = parse_probe({"source": "pynvml", "gpus": [], "apps": [], "me": _me()})
    assert not state.available and state.error == "no GPUs found"


def _sample(used, apps):
    return {"gpus": [{"index": i, "uuid": f"GPU-{i}", "used_mib": u} for i, u in enumerate(used)],
            "apps": [{"pid": pid, "gpu_uuid": f"GPU-{g}"} for pid, g in apps]}


def test_wait_condition_on_the_host():
    gone = {"absent": [10], "idle": False}
    assert not satisfied(_sample([100, 0], [(10, 0)]), gone) and satisfied(_sample([100, 0], []), gone)
    idle = {"gpus": [0], "idle": True, "tolerated_pids": [5], "tolerated_mib": {"0": 300}, "threshold_mib": 256}
    assert satisfied(_sample([500, 9000], [(5, 0), (6, 1)]), idle)  # 500-300 <= 256; GPU 1 not chosen
    assert not satisfied(_sample([600, 0], [(5, 0)]), idle)
    assert not satisfied(_sample([300, 0], [(5, 0), (7, 0)]), idle)


def test_secret_flag_values_are_masked_in_reported_cmdlines():
    from operations.remote.common import masked

    argv = ["python3", "-m", "sglang.launch_server", "--api-key", "sk-1", "--hf-token=hf_2", "--port", "30000",
            "--admin-api-key", "adm"]
    assert masked(argv) == ["python3", "-m", "sglang.launch_server", "--api-key", "<secret>",
                            "--hf-token=<secret>", "--port", "30000", "--admin-api-key", "<secret>"]
