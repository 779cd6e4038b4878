"""Every specops fact through pyinfra's own CLI (``pyinfra INVENTORY fact ...``): JSON out, as pyinfra's facts print."""
import json
import os
import shutil
import subprocess

from conftest import PYINFRA, REPO, run_pyinfra


def fact(env: dict, inventory: str, *fact_args: str) -> dict:
    """Run ``pyinfra INVENTORY fact FACT [ARGS]`` and return the one host's fact data (the JSON pyinfra prints)."""
    proc = subprocess.run([PYINFRA, inventory, "fact", *fact_args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    start = out.index("\n{\n") + 1
    end = out.index("\n}\n", start) + 2
    (data,) = json.loads(out[start:end]).values()  # {host name: fact data}
    return data


def test_gpus_fact_prints_the_probe_document_of_the_simulated_host(sim):
    sim.hold([1], 5000)
    doc = fact(sim.env(), str(REPO / "inventory" / "sim.py"), "operations.facts.gpu.Gpus")
    assert doc["source"] == "pynvml" and [g["index"] for g in doc["gpus"]] == [0, 1, 2, 3]
    assert [(a["used_mib"], a["pid"] > 0) for a in doc["apps"]] == [(5000, True)]
    # the nvidia-smi reading, chosen through the fact's own argument on the command line
    smi = fact(sim.env(), str(REPO / "inventory" / "sim.py"), "operations.facts.gpu.Gpus", "nvml=False")
    assert smi["source"] == "nvidia-smi" and [g["used_mib"] for g in smi["gpus"]] == [0, 5000, 0, 0]


def test_gpus_fact_on_plain_local_host_is_a_document_too():
    """``pyinfra @local fact``: this machine as it is (CI has no GPU: no nvidia-smi, no libnvidia-ml)."""
    doc = fact(dict(os.environ), "@local", "operations.facts.gpu.Gpus")
    if shutil.which("nvidia-smi") is None:
        assert doc["source"] == "none" and "nvidia-smi" in " ".join(doc["errors"]), doc
    else:  # a machine with a real GPU: its real reading
        assert doc["source"] in ("pynvml", "nvidia-smi") and doc["gpus"], doc


def test_server_fact_reports_the_running_server_and_its_config_hash(server_sim, configs):
    empty = fact(server_sim.env(), str(REPO / "inventory" / "sim.py"), "operations.facts.server.Server")
    assert empty["alive"] is False and empty["state"] == {} and empty["health"] is None, empty
    assert run_pyinfra(server_sim, "--data", f"config={configs['eagle3-llama3.1-8b']}").rc == 0
    state = json.loads((server_sim.root / "servers" / "llm" / "state.json").read_text())
    doc = fact(server_sim.env(), str(REPO / "inventory" / "sim.py"), "operations.facts.server.Server",
               f"port={configs['port']}")
    assert doc["alive"] is True and doc["health"] == 200, doc
    assert doc["state"]["config_hash"] == state["config_hash"] and doc["state"]["status"] == "running"
    assert doc["server_info"]["speculative_algorithm"] == "EAGLE3"


def test_engine_parse_fact_asks_the_hosts_own_engine(sim):
    inventory = str(REPO / "inventory" / "sim.py")
    ok = fact(sim.env(), inventory, "operations.facts.engine.EngineParse", "config=eagle3-llama3.1-8b")
    assert ok["ok"] is True and ok["version"] and ok["error"] is None, ok
    bad = fact(sim.env(), inventory, "operations.facts.engine.EngineParse", f"python={sim.root / 'bin' / 'python'}",
               'flags=["--model-path", "m", "--no-such-flag"]', "engine_yaml=")
    assert bad["ok"] is False and "--no-such-flag" in bad["error"], bad
