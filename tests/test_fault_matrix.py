"""The fault and bad-input matrix, end to end: the real pyinfra CLI, deploy.py and inventory/sim.py against a
simulated host. Every scenario asserts what can be observed (exit code, output, processes alive or gone, files
and their modes, HTTP answers) and, where the host ends up converged, that the next run changes nothing.

Cases (see the issue): 1 SIGTERM ignored -> SIGKILL; 2 stuck memory -> needs-reset; 3 server dies / never ready;
6 bad configs -> every error, no host contacted; 7 shell metacharacters; 8 secrets; 9 protected daemons and other
users' jobs; 10 a re-run after each scenario reports no change. (4: tests/test_cluster.py; 5: tests/test_lock.py.)
"""
import json
import os
import re
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from operations.model.config import known_configs

import pytest
import yaml

from conftest import REPO, free_port, needs_root, run_pyinfra
from gpusim import ledger
from gpusim.ledger import proc_start_time
from test_gpusim import wait_for


# --- helpers -----------------------------------------------------------------------------------------------------

def converge(sim, config, *args):
    return run_pyinfra(sim, "--data", f"config={config}", *args)


def idle(sim, *args):
    return run_pyinfra(sim, "--data", "config=none", *args)


def assert_no_change(run):
    """A run that found everything converged: exit 0, pyinfra's "No changes", and the results table's grand total
    with nothing in Success or Error (one host, one operation, No Change 1)."""
    assert run.rc == 0, run
    assert "No changes" in run.out, run
    assert re.search(r"Grand total\s+1\s+-\s+-\s+1\s", run.out), run
    assert "converged: 1 host(s) (@local)" in run.out, run


def write_config(tmp_path, name, data) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def shipped(configs, name="eagle3-llama3.1-8b") -> dict:
    return yaml.safe_load(configs[name].read_text())


def the_server(sim) -> dict:
    (state,) = sim.servers()
    return state


def port_refuses(port) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def http_get(port, path, key=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def proc_environ(pid) -> dict:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def proc_argv(pid) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


@pytest.fixture
def python_spy(tmp_path):
    """An interpreter for host data ``specops_python`` that records each call, then runs the real one: every
    specops fact and remote script runs through it, so "no call recorded" means the host was never contacted."""
    calls = tmp_path / "host-python-calls"
    spy = tmp_path / "spy-python"
    spy.write_text(f"#!/bin/sh\necho called >> '{calls}'\nexec '{sys.executable}' \"$@\"\n")
    spy.chmod(0o755)
    return spy, calls


# --- 1. a holder that ignores SIGTERM --------------------------------------------------------------------------

def test_1_term_ignoring_holder_is_killed_and_reported_then_rerun_is_noop(sim):
    stubborn = sim.hold([1], 2000, on_term="ignore")
    run = idle(sim, "--data", "grace_s=0.5")
    assert run.rc == 0, run
    m = re.search(rf"pid {stubborn.pid} \(.*\) ignored SIGTERM for (\d+\.\d)s: sending SIGKILL", run.out)
    assert m and float(m.group(1)) >= 0.5, run
    assert f"pid {stubborn.pid} needed SIGKILL" in run.out, run
    assert not stubborn.alive() and sim.used_mib() == {0: 0, 1: 0, 2: 0, 3: 0}
    assert_no_change(idle(sim, "--data", "grace_s=0.5"))


def test_1_term_ignoring_job_on_the_server_gpu_is_killed_then_server_converges_then_noop(server_sim, configs):
    stubborn = server_sim.hold([0], 90000, on_term="ignore")
    run = converge(server_sim, configs["eagle3-llama3.1-8b"], "--data", "grace_s=0.5")
    assert run.rc == 0, run
    assert f"pid {stubborn.pid} needed SIGKILL" in run.out and "config confirmed" in run.out, run
    assert not stubborn.alive()
    pid = the_server(server_sim)["pid"]
    assert_no_change(converge(server_sim, configs["eagle3-llama3.1-8b"], "--data", "grace_s=0.5"))
    assert the_server(server_sim)["pid"] == pid and proc_start_time(pid) is not None


# --- 2. memory that is never released -------------------------------------------------------------------------

def test_2_stuck_memory_verdict_within_deadline_rerun_signals_nothing_then_noop_after_reset(sim):
    h = sim.hold([2], 60000, stuck=True)
    first = idle(sim, "--data", "deadline_s=2", "--data", "grace_s=0.5")
    assert first.rc != 0, first
    m = re.search(r"needs-reset: after (\d+\.\d)s GPU 2: 60000 MiB still allocated", first.out)
    assert m and float(m.group(1)) <= 2.0, first
    assert f"gpu.idle plan: stop pid {h.pid}" in first.out and "FAILED @local: GPUs idle" in first.out, first
    assert not h.alive()
    # still stuck: the same verdict within the deadline, and nothing is signalled (no live process holds it)
    second = idle(sim, "--data", "deadline_s=2", "--data", "grace_s=0.5")
    assert second.rc != 0, second
    assert "gpu.idle plan: wait for the driver to release memory (GPU 2: 60000 MiB)" in second.out, second
    m = re.search(r"needs-reset: after (\d+\.\d)s GPU 2: 60000 MiB still allocated; pids that survived SIGKILL: "
                  r"none\. ", second.out)
    assert m and float(m.group(1)) <= 2.0, second
    assert "gpu.idle plan: stop" not in second.out and "Error: executed 0 commands" in second.out, second
    # the operator resets the GPU (the simulator's reset); then the host is idle and a run changes nothing
    reset = subprocess.run([sys.executable, "-m", "gpusim", "reset", str(sim.root)], cwd=REPO, capture_output=True,
                           text=True)
    assert reset.returncode == 0 and "released 1 allocation(s)" in reset.stdout, reset
    assert_no_change(idle(sim, "--data", "deadline_s=2", "--data", "grace_s=0.5"))


def test_2_stuck_memory_on_the_server_gpu_fails_before_any_start_then_converges_after_reset(server_sim, configs):
    sim = server_sim
    sim.hold([0], 60000, stuck=True)  # the server would book 0.8 x 143771 MiB: it cannot fit beside this
    run = converge(sim, configs["eagle3-llama3.1-8b"], "--data", "deadline_s=2", "--data", "grace_s=0.5")
    assert run.rc != 0 and "needs-reset" in run.out and "GPU 0: 60000 MiB still allocated" in run.out, run
    assert "FAILED @local" in run.out, run
    # no CUDA OOM start was attempted: the stand-in never launched, nothing is recorded as running
    assert not (sim.root / "timeline.jsonl").exists()
    assert not (sim.root / "servers" / "llm" / "server.log").exists()
    assert all(s.get("status") != "running" for s in sim.servers())
    assert ledger.release_all(sim.root) == 1  # the GPU reset
    fixed = converge(sim, configs["eagle3-llama3.1-8b"])
    assert fixed.rc == 0 and "config confirmed" in fixed.out, fixed
    assert_no_change(converge(sim, configs["eagle3-llama3.1-8b"]))


def test_2_memory_the_old_server_never_frees_stops_the_switch_before_any_start(server_sim, configs):
    """The one host-side switch stops the old server, then waits for the driver to release its memory; when that
    never happens it hands over to gpu.idle's own verdict (needs-reset, judged at once: the host already waited the
    whole deadline), and the new config is never started into memory that is not there."""
    sim = server_sim
    first = converge(sim, configs["eagle3-llama3.1-8b"])
    assert first.rc == 0, first
    old = the_server(sim)
    assert ledger.make_stuck(sim.root, old["pid"]) == 1  # the driver will never tear its context down
    run = converge(sim, configs["baseline-llama3.1-8b"], "--data", "deadline_s=2", "--data", "grace_s=0.5")
    assert run.rc != 0, run
    assert "one host-side step: stop the server, wait for GPU memory release" in run.out, run
    assert "waiting for GPU 0 to be released (up to 2s)" in run.out, run
    assert "GPU memory not released within 2s: handing over to gpu.idle" in run.out, run
    m = re.search(r"needs-reset: after (\d+\.\d)s GPU 0: \d+ MiB still allocated", run.out)
    assert m and float(m.group(1)) <= 1.0, run  # judged, not waited for a second time
    assert "started pid" not in run.out and "FAILED @local" in run.out, run
    assert ledger.proc_start_time(old["pid"]) is None  # the old server was stopped
    assert not (sim.root / "servers" / "llm" / "staged.json").exists()  # the staged files (secrets) not left
    assert the_server(sim)["status"] == "stopped" and the_server(sim)["config_hash"] == old["config_hash"]
    assert ledger.release_all(sim.root) == 1  # the GPU reset
    fixed = converge(sim, configs["baseline-llama3.1-8b"])
    assert fixed.rc == 0 and "config confirmed" in fixed.out, fixed


# --- 3. the server dies during start, or never becomes ready --------------------------------------------------

@pytest.fixture
def flaky_launcher(tmp_path, server_sim):
    """A launcher that, while ``broken`` exists, prints a few start-up lines and exits 1 (as a server that crashes
    while loading); otherwise it execs the SGLang-API stand-in."""
    broken = tmp_path / "broken"
    script = tmp_path / "flaky-launch"
    script.write_text(f"#!/bin/sh\nif [ -e '{broken}' ]; then\n  echo 'Load weight begin.'\n"
                      f"  echo 'RuntimeError: flaky launcher: weights file is truncated'\n  exit 1\nfi\n"
                      f"exec '{server_sim.root / 'bin' / 'sglang-launch-server'}' \"$@\"\n")
    script.chmod(0o755)
    broken.touch()
    return script, broken


def test_3_server_exits_during_start_log_tail_nothing_stale_then_rerun_converges_then_noop(
        server_sim, configs, tmp_path, flaky_launcher):
    sim = server_sim
    script, broken = flaky_launcher
    data = shipped(configs)
    data["specops"]["launcher"] = [str(script)]
    path = write_config(tmp_path, "flaky", data)
    run = converge(sim, path)
    assert run.rc != 0, run
    assert "server exited during start" in run.out, run
    assert "last lines of the server log:" in run.out, run
    assert "RuntimeError: flaky launcher: weights file is truncated" in run.out, run
    assert "GPU processes now:" in run.out and "FAILED @local" in run.out, run
    state = the_server(sim)
    assert state["status"] in ("failed", "stopped") and proc_start_time(state["pid"]) is None, state
    assert port_refuses(configs["port"])
    broken.unlink()  # the cause goes away; the same command converges
    again = converge(sim, path)
    assert again.rc == 0 and "config confirmed" in again.out, again
    assert_no_change(converge(sim, path))


def test_3_never_ready_times_out_log_tail_nothing_running_then_rerun_converges_then_noop(server_sim, configs, tmp_path):
    sim = server_sim
    sim.configure(server_start_s=60)
    data = shipped(configs)
    data["specops"]["ready_timeout_s"] = 2
    path = write_config(tmp_path, "slow", data)
    run = converge(sim, path)
    assert run.rc != 0 and "not ready before the deadline" in run.out, run
    assert "last lines of the server log:" in run.out and "Load weight begin" in run.out, run
    state = the_server(sim)
    assert state["status"] == "stopped" and proc_start_time(state["pid"]) is None, state
    assert port_refuses(configs["port"])
    wait_for(lambda: not sim.snapshot().procs, what="no GPU process left")
    sim.configure(server_start_s=0.4)  # the slowness goes away; the same command converges
    again = converge(sim, path)
    assert again.rc == 0 and "config confirmed" in again.out, again
    assert_no_change(converge(sim, path))


# --- 6. bad configs: every error listed, in one run, and no host contacted ------------------------------------

EAGLE = {"model-path": "m", "speculative-algorithm": "EAGLE3", "speculative-draft-model-path": "d",
         "speculative-num-steps": 3, "speculative-eagle-topk": 4, "speculative-num-draft-tokens": 16}

# Each case breaks as many rules as can fail together (some rules exclude each other: e.g. the tree rules run
# only when steps/topk/draft are all set and in range, and vLLM rules only for engine vllm). Each expected item
# is "[host] field: the start of the message"; the run must list exactly these.
BAD = {
    # file-level rules (specops section, spellings, ${VAR}) and every host-independent SGLang rule, together
    "file-and-flag-rules": ({
        "model_path": "m", "model-path": "m2", "cuda-graph-max-bs": 8, "dtype": "fp7", "max-running-requests": "lots",
        "schedule-conservativeness": "high", "chat-template": ["a"], "preferred-sampling-params": 5,
        "trust-remote-code": "yes", "cuda-graph-bs-decode": [1, "x"], "port": 70000, "mem-fraction-static": 1.5,
        "speculative-algorithm": "EAGLE3", "speculative-num-steps": 3, "api-key": "${SPECOPS_FM_UNSET_VAR}",
        "specops": {"colour": 1, "engine": "sglang", "ready_timeout_s": "fast", "stop_grace_s": -1,
                    "min_accept_length": "x", "prompt": "", "name": 5, "launcher": 5, "secret_fields": "api-key",
                    "gpus": [0, 0], "env": {"A=1; curl x": "v", "HF_TOKEN": None}}}, (), [
        "[*] specops.colour: unknown specops key",
        "[*] specops.ready_timeout_s: must be a finite number > 0, got 'fast'",
        "[*] specops.stop_grace_s: must be a finite number >= 0, got -1",
        "[*] specops.min_accept_length: must be a finite number >= 0, got 'x'",
        "[*] specops.prompt: must be a non-empty string",
        "[*] specops.name: must be a non-empty string",
        "[*] specops.env.HF_TOKEN: must be a string or a number, got NoneType",
        "[*] specops.launcher: must be a command",
        "[*] specops.secret_fields: must be a list of field names",
        "[*] specops.gpus: must be a list of distinct GPU indices",
        "[*] model-path: given twice",
        "[*] api-key: environment variable SPECOPS_FM_UNSET_VAR is not set on the controller",
        "[*] specops.env.A=1; curl x: not a valid environment variable name",
        "[*] cuda-graph-max-bs: unknown flag for SGLang 0.5.23",
        "[*] dtype: 'fp7' is not one of",
        "[*] max-running-requests: must be an integer, got 'lots'",
        "[*] schedule-conservativeness: must be a number, got 'high'",
        "[*] chat-template: must be a string, got list",
        "[*] preferred-sampling-params: must be JSON",
        "[*] trust-remote-code: is a switch: true or false, got 'yes'",
        "[*] cuda-graph-bs-decode: must be an integer, got 'x'",
        "[*] port: port must be an integer 1-65535, got 70000",
        "[*] mem-fraction-static: must be between 0 and 1, got 1.5",
        "[*] speculative-draft-model-path: required for EAGLE3",
        "[*] speculative-eagle-topk: required for EAGLE3 once any of steps / topk / draft tokens is set"]),
    "unknown-engine": ({"model-path": "m", "specops": {"engine": "trt"}}, (), [
        "[*] specops.engine: 'trt' is not one of"]),
    # rules that need the host: GPU count (host data gpu_count), nnodes, ranks, dist-init-addr
    "host-rules": ({"tokenizer-path": "t", "speculative-num-steps": 3, "speculative-eagle-topk": 4, "tp-size": 3,
                    "dp-size": 3, "nnodes": 2, "node-rank": 3, "specops": {"gpus": [0]}}, ("gpu_count=2",), [
        "[@local] nnodes: 2 needs a multi-node group",
        "[@local] model-path: required",
        "[@local] speculative-num-steps: set without speculative-algorithm",
        "[@local] speculative-eagle-topk: set without speculative-algorithm",
        "[@local] tp-size: tp-size x dp-size = 9 does not split over nnodes 2",
        "[@local] specops.gpus: 1 GPUs listed but tp-size x dp-size / nnodes = 4",
        "[@local] tp-size: tp-size 3 x dp-size 3 / nnodes 2 needs 4 GPU(s) (up to index 0); host has 2",
        "[@local] node-rank: 3 is outside 0..1",
        "[@local] dist-init-addr: required when nnodes > 1"]),
    "ranges": ({**EAGLE, "speculative-num-steps": 0, "speculative-eagle-topk": 0, "speculative-num-draft-tokens": 1,
                "tp-size": 0, "dp-size": 0, "nnodes": 0}, (), [
        "[@local] speculative-num-steps: must be an integer >= 1, got 0",
        "[@local] speculative-eagle-topk: must be an integer >= 1, got 0",
        "[@local] speculative-num-draft-tokens: must be an integer >= 2, got 1",
        "[@local] tp-size: must be an integer >= 1, got 0",
        "[@local] dp-size: must be an integer >= 1, got 0",
        "[@local] nnodes: must be an integer >= 1, got 0"]),
    "tree-incomplete-and-group": ({k: v for k, v in EAGLE.items() if k != "speculative-num-steps"} | {"nnodes": 2},
                                  ("specops_group=g",), [
        "[@local] nnodes: 2 but inventory group g has 1 host(s)",
        "[@local] speculative-num-steps: required for EAGLE3"]),
    "tree-too-small-and-gpus": ({**EAGLE, "speculative-num-steps": 1, "tp-size": 8}, ("gpu_count=4",), [
        "[@local] speculative-num-draft-tokens: 16 exceeds the 5 tokens a tree of 1 steps x topk 4 can propose "
        "(SGLang's draft step fails at the first decode)",
        "[@local] tp-size: tp-size 8 x dp-size 1 / nnodes 1 needs 8 GPU(s) (up to index 7); host has 4"]),
    "unknown-algorithm": ({"model-path": "m", "speculative-algorithm": "MEDUSA", "mem-fraction-static": 0}, (), [
        "[@local] mem-fraction-static: must be between 0 and 1, got 0",
        "[@local] speculative-algorithm: 'MEDUSA' is not one of"]),
    "vllm-rules": ({"bogus-opt": 1, "max-model-len": "long", "port": 0, "tensor-parallel-size": 8,
                    "speculative-config": {"method": "eagle3", "num_speculative_tokens": 0},
                    "specops": {"engine": "vllm"}}, ("gpu_count=4",), [
        "[@local] bogus-opt: unknown vllm serve option",
        "[@local] max-model-len: must be int, got 'long'",
        "[@local] model: required",
        "[@local] port: port must be an integer 1-65535, got 0",
        "[@local] speculative-config.model: required for method eagle3",
        "[@local] speculative-config.num_speculative_tokens: must be an integer >= 1, got 0",
        "[@local] tensor-parallel-size: needs 8 GPU(s); host has 4"]),
    "vllm-method": ({"model": "m", "enforce-eager": "yes", "speculative-config": {"method": "medusa2",
                                                                                   "num_speculative_tokens": 1},
                     "specops": {"engine": "vllm"}}, (), [
        "[@local] enforce-eager: must be bool, got 'yes'",
        "[@local] speculative-config.method: 'medusa2' is not one of"]),
    "vllm-ngram": ({"model": "m", "speculative-config": {"method": "ngram", "num_speculative_tokens": 3},
                    "specops": {"engine": "vllm"}}, (), [
        "[@local] speculative-config.prompt_lookup_max: required for ngram"]),
    "vllm-ngram-bounds": ({"model": "m", "speculative-config": {"method": "ngram", "num_speculative_tokens": 3,
                                                                "prompt_lookup_min": 5, "prompt_lookup_max": 2},
                           "specops": {"engine": "vllm"}}, (), [
        "[@local] speculative-config.prompt_lookup_min: 5 > prompt_lookup_max 2"]),
    "ranks": ({"model-path": "m"}, ("specops_group=g", "specops_rank=1"), [
        "[*] specops_rank: group g: ranks 1 are not 0..0, each once"]),
    "invalid-yaml": ("model-path: [\n", (), ["[*] config: ", "invalid YAML"]),
    "not-a-mapping": ("- model-path\n- m\n", (), ["[*] <file>: ", "expected a mapping of flags, got list"]),
}


def _listed(out: str) -> list[str]:
    return [line[4:] for line in out.splitlines() if line.startswith("  - [")]


def assert_untouched(sim, spy_calls, holder, before):
    assert not spy_calls.exists(), spy_calls.read_text()  # no specops fact or script ran on the host
    assert not (sim.root / "servers").exists()  # no state dir, no lease, no server dir
    assert not (sim.root / "timeline.jsonl").exists()  # no server launched
    assert holder.alive() and sim.snapshot().procs == before  # nothing signalled, nothing new on the GPUs


@pytest.mark.parametrize("case", sorted(BAD))
def test_6_bad_config_lists_every_error_at_once_and_contacts_no_host(case, sim, tmp_path, python_spy, monkeypatch):
    monkeypatch.delenv("SPECOPS_FM_UNSET_VAR", raising=False)
    data, host_data, expected = BAD[case]
    spy, calls = python_spy
    holder = sim.hold([0], 1000)  # any change to the host would stop it
    before = sim.snapshot().procs
    path = write_config(tmp_path, "bad", data)
    extra = [a for d in host_data for a in ("--data", d)]
    run = converge(sim, path, "--data", f"specops_python={spy}", *extra)
    assert run.rc != 0, run
    if case in ("invalid-yaml", "not-a-mapping"):
        assert all(fragment in run.out for fragment in expected) and "1 config error(s)" in run.out, run
    else:
        listed = _listed(run.out)
        assert f"{len(expected)} config error(s)" in run.out, run
        assert len(listed) == len(expected), run
        for item in expected:
            assert sum(line.startswith(item) for line in listed) == 1, (item, run)
    assert "Traceback" not in run.out, run
    assert_untouched(sim, calls, holder, before)


def test_6_unknown_config_name_lists_the_known_ones_and_contacts_no_host(sim, python_spy):
    spy, calls = python_spy
    holder = sim.hold([0], 1000)
    before = sim.snapshot().procs
    run = converge(sim, "no-such-config", "--data", f"specops_python={spy}")
    assert run.rc != 0 and "config: no config 'no-such-config'" in run.out, run
    known = ", ".join(known_configs(REPO / "configs"))
    assert f"known: {known}" in run.out, run
    assert_untouched(sim, calls, holder, before)


@pytest.mark.parametrize("data, fragment", [
    (("specops_supervisor=upstart",), "[@local] supervisor: must be 'process' or 'systemd'"),
    (("specops_state_dir=relative/dir",), "[@local] state_dir: 'relative/dir': use an absolute path"),
], ids=["supervisor", "state_dir"])
def test_6_bad_host_data_is_a_config_error_before_any_host_command(data, fragment, sim, configs, python_spy):
    spy, calls = python_spy
    holder = sim.hold([0], 1000)
    before = sim.snapshot().procs
    run = converge(sim, configs["baseline-llama3.1-8b"], "--data", f"specops_python={spy}",
                   *[a for d in data for a in ("--data", d)])
    assert run.rc != 0 and "1 config error(s)" in run.out and fragment in run.out, run
    assert "An internal exception occurred" not in run.out, run
    assert "converged: 0 host(s)" in run.out and "FAILED @local: server running with config" in run.out, run
    assert_untouched(sim, calls, holder, before)


def test_6_grace_not_shorter_than_the_idle_deadline_fails_before_the_old_server_is_stopped(server_sim, configs):
    sim, baseline = server_sim, configs["baseline-llama3.1-8b"]
    assert converge(sim, baseline).rc == 0
    pid = json.loads((sim.root / "servers" / "llm" / "state.json").read_text())["pid"]
    run = converge(sim, configs["eagle3-llama3.1-8b"], "--data", "grace_s=200")
    assert run.rc != 0 and "grace_s/deadline_s: grace_s (200.0) must be shorter than deadline_s (120.0)" in run.out, run
    assert "An internal exception occurred" not in run.out, run
    state = json.loads((sim.root / "servers" / "llm" / "state.json").read_text())
    assert state["status"] == "running" and state["pid"] == pid and proc_start_time(pid) == state["start"]
    assert_no_change(converge(sim, baseline))


def test_6_python_spy_does_see_a_run_that_contacts_the_host(sim, python_spy):
    """The control for the tests above: the same spy records the calls of a run that does reach the host."""
    spy, calls = python_spy
    run = idle(sim, "--data", f"specops_python={spy}")
    assert_no_change(run)
    assert calls.exists() and calls.read_text().count("called") >= 1


def test_6_gpu_count_read_from_the_host_fails_before_anything_changes(server_sim, configs, tmp_path, python_spy):
    """Without host data gpu_count the tp x dp rule needs the host's own GPU count: one read, then the error,
    with nothing stopped, written or started."""
    sim = server_sim
    spy, calls = python_spy
    holder = sim.hold([0], 1000)
    data = shipped(configs)
    data["tp-size"] = 8
    run = converge(sim, write_config(tmp_path, "tp8", data), "--data", f"specops_python={spy}")
    assert run.rc != 0 and "1 config error(s)" in run.out, run
    assert "[@local] tp-size: tp-size 8 x dp-size 1 / nnodes 1 needs 8 GPU(s) (up to index 7); host has 4" in run.out
    assert "FAILED @local" in run.out, run
    assert calls.exists()  # the GPU read
    assert holder.alive() and not (sim.root / "servers" / "llm").exists() and not (sim.root / "timeline.jsonl").exists()


# --- 7. shell metacharacters in every string field ------------------------------------------------------------

def nasty(canary: Path, tag: str, newline: bool = True) -> str:
    c = str(canary)
    value = (f"{tag}$(touch {c})`touch {c}`;touch {c};|touch {c}&&touch {c}||touch {c} 'q' \"dq\" \\ $HOME *"
             f" > {c}")
    return value + ("\n$(touch " + c + ")\n" if newline else "")


def test_7_metacharacters_in_every_string_field_arrive_verbatim_and_run_nothing(server_sim, configs, tmp_path,
                                                                                 monkeypatch):
    sim = server_sim
    canary = tmp_path / "CANARY"
    values = {k: nasty(canary, k) for k in ("model", "served", "draft", "tokenizer", "template", "public",
                                            "token", "prompt", "name")}
    values["api"] = nasty(canary, "api", newline=False)  # an HTTP header value: no newline
    monkeypatch.setenv("SPECOPS_FM_API_KEY", values["api"])
    data = shipped(configs)
    data.update({"model-path": values["model"], "served-model-name": values["served"],
                 "speculative-draft-model-path": values["draft"], "tokenizer-path": values["tokenizer"],
                 "chat-template": values["template"], "api-key": "${SPECOPS_FM_API_KEY}"})
    data["specops"].update({"env": {"FM_PUBLIC": values["public"], "HF_TOKEN": values["token"]},
                            "prompt": values["prompt"], "name": values["name"]})
    path = write_config(tmp_path, "nasty", data)
    first = converge(sim, path, "--diff", "-vv")
    assert first.rc == 0 and "config confirmed" in first.out, first  # the stand-in reported every flag verbatim
    server = the_server(sim)
    argv = proc_argv(server["pid"])  # the engine file on the command line, the key from secrets.env
    assert argv[argv.index("--config") + 1].endswith("/engine.yaml")
    assert f"--api-key={values['api']}" in argv  # one element: a key may start with "-"
    env = proc_environ(server["pid"])
    assert env["FM_PUBLIC"] == values["public"] and env["HF_TOKEN"] == values["token"]
    code, body = http_get(configs["port"], "/server_info", values["api"])
    info = json.loads(body)  # what the server parsed from engine.yaml, as SGLang's loader reads it
    assert code == 200
    for field, key in (("model_path", "model"), ("served_model_name", "served"),
                       ("speculative_draft_model_path", "draft"), ("tokenizer_path", "tokenizer"),
                       ("chat_template", "template")):
        assert info[field] == values[key], field
    assert_no_change(converge(sim, path))
    # the users patterns and the dry-run plan see the same strings; still nothing runs
    holder = sim.hold([1], 1000)
    users = json.dumps(["root", nasty(canary, "user")])
    assert idle(sim, "--data", "gpus=1", "--data", f"users={users}", "--dry").rc == 0
    stopped = idle(sim, "--data", "gpus=1", "--data", f"users={users}")
    assert stopped.rc == 0 and not holder.alive(), stopped
    assert not canary.exists() and not list(tmp_path.rglob("CANARY*")) and not list(REPO.glob("CANARY*"))


@pytest.mark.parametrize("args, fragment", [
    (("--data", "specops_state_dir=/tmp/x$(touch CANARY)"), "state_dir: '/tmp/x$(touch CANARY)': use an absolute"),
    (("--data", "specops_state_dir=/tmp/x`touch CANARY`"), "state_dir: '/tmp/x`touch CANARY`': use an absolute"),
], ids=["dollar-paren", "backticks"])
def test_7_metacharacters_in_the_state_dir_are_refused(args, fragment, sim, configs, python_spy, tmp_path):
    spy, calls = python_spy
    canary = tmp_path / "CANARY"
    args = tuple(a.replace("CANARY", str(canary)) for a in args)
    run = converge(sim, configs["baseline-llama3.1-8b"], "--data", f"specops_python={spy}", *args)
    assert run.rc != 0 and fragment.replace("CANARY", str(canary)) in run.out, run
    assert not calls.exists() and not canary.exists()


def test_7_metacharacters_in_the_server_name_are_refused(sim, python_spy, tmp_path):
    spy, calls = python_spy
    canary = tmp_path / "CANARY"
    name = f"llm$(touch {canary});touch {canary}"
    run = run_pyinfra(sim, f"server_name={name}", "--data", f"specops_python={spy}",
                      deploy="operations.server.stopped")
    assert run.rc != 0 and f"[@local] name: {name!r}: use letters, digits" in run.out, run
    assert not calls.exists() and not canary.exists()


# --- 8. secrets -------------------------------------------------------------------------------------------------

API_KEY, HF_TOKEN, BLOB = "sk-fm-Zq81xT2live", "hf_fmLiteralTok9", "blob-fm-Env7Qp"


def secret_holders(tmp_path, exclude) -> list[Path]:
    out = []
    for f in tmp_path.rglob("*"):
        if f.is_file() and not f.is_symlink() and f not in exclude:
            data = f.read_bytes()
            if any(s.encode() in data for s in (API_KEY, HF_TOKEN, BLOB)):
                out.append(f)
    return out


def test_8_secrets_never_in_output_or_readable_files_and_the_server_gets_them(server_sim, configs, tmp_path,
                                                                              monkeypatch):
    sim = server_sim
    monkeypatch.setenv("SPECOPS_FM_API_KEY", API_KEY)
    monkeypatch.setenv("SPECOPS_FM_BLOB", BLOB)
    data = shipped(configs)
    data["api-key"] = "${SPECOPS_FM_API_KEY}"
    data["specops"]["env"] = {"HF_TOKEN": HF_TOKEN, "FM_BLOB": "${SPECOPS_FM_BLOB}", "NCCL_DEBUG": "WARN"}
    path = write_config(tmp_path, "keyed", data)
    runs = [converge(sim, path, "--dry", "--diff", "-vv"), converge(sim, path, "--diff", "-vv"),
            converge(sim, path, "-vv"), idle(sim, "--dry", "--diff", "-vv")]
    assert runs[1].rc == 0 and "config confirmed" in runs[1].out, runs[1]
    assert_no_change(runs[2])
    assert "--api-key=<secret>" in runs[3].out, runs[3]  # the stop plan shows the server's command line, masked
    for run in runs:
        for secret in (API_KEY, HF_TOKEN, BLOB):
            assert secret not in run.out, (secret, run)
    # on disk: only secrets.env holds them, mode 0600, in a 0700 directory; nothing else there is readable by others
    directory = sim.root / "servers" / "llm"
    assert secret_holders(tmp_path, exclude={path}) == [directory / "secrets.env"]
    assert stat.S_IMODE((directory / "secrets.env").stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for f in directory.iterdir():
        assert not f.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO), f
    launch = (directory / "launch.sh").read_text()
    assert '"${SPECOPS_SECRET_API_KEY}"' in launch and "NCCL_DEBUG=WARN" in launch
    # and the server really has them: its API refuses a request without the key and answers one with it
    port = configs["port"]
    assert http_get(port, "/server_info")[0] == 401
    code, body = http_get(port, "/server_info", API_KEY)
    assert code == 200 and API_KEY in body  # SGLang echoes it (launch_command, api_key): specops masks what it keeps
    env = proc_environ(the_server(sim)["pid"])
    assert env["HF_TOKEN"] == HF_TOKEN and env["FM_BLOB"] == BLOB and env["NCCL_DEBUG"] == "WARN"


def test_8_secrets_echoed_by_a_failing_server_are_masked_in_the_log_tail(server_sim, configs, tmp_path, monkeypatch):
    """A server that logs its own arguments and environment (SGLang logs ServerArgs, api_key included) and dies:
    the log tail in the error shows the lines, with the secrets masked; the log itself stays private."""
    sim = server_sim
    monkeypatch.setenv("SPECOPS_FM_API_KEY", API_KEY)
    echo = tmp_path / "echo-and-die"
    echo.write_text('#!/bin/sh\necho "server_args=ServerArgs($*)"\necho "HF_TOKEN=$HF_TOKEN"\nexit 1\n')
    echo.chmod(0o755)
    data = {"model-path": "m", "port": configs["port"], "api-key": "${SPECOPS_FM_API_KEY}",
            "specops": {"launcher": [str(echo)], "ready_timeout_s": 10, "env": {"HF_TOKEN": HF_TOKEN}}}
    run = converge(sim, write_config(tmp_path, "echo", data), "-vv")
    assert run.rc != 0 and "server exited during start" in run.out, run
    assert "server_args=ServerArgs(--config " in run.out and "--api-key=<secret>)" in run.out, run
    assert "HF_TOKEN=<secret>" in run.out, run
    assert API_KEY not in run.out and HF_TOKEN not in run.out, run
    directory = sim.root / "servers" / "llm"
    assert API_KEY in (directory / "server.log").read_text()  # the server's own log, as the server wrote it
    for f in secret_holders(tmp_path, exclude={tmp_path / "echo.yaml"}):
        assert f.parent == directory and not f.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO), f
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


# --- 9. protected daemons and other users' jobs -----------------------------------------------------------------

PROTECTED = ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nv-fabricmanager")


@needs_root
def test_9_protected_daemons_and_other_users_jobs_survive_a_server_converge_and_reruns(server_sim, configs):
    sim = server_sim
    daemons = [sim.hold([i], 200, name=name) for i, name in enumerate(PROTECTED)]
    theirs = sim.hold([3], 5000, user="nobody")  # not on the server's GPU: it stays, and does not block
    ours = sim.hold([0], 9000)
    run = converge(sim, configs["eagle3-llama3.1-8b"])
    assert run.rc == 0 and "config confirmed" in run.out, run
    assert not ours.alive() and all(d.alive() for d in daemons) and theirs.alive()
    assert_no_change(converge(sim, configs["eagle3-llama3.1-8b"]))
    # GPUs 1, 2: only daemons' memory (tolerated) -> idle, nothing to do
    assert_no_change(idle(sim, "--data", "gpus=1,2"))
    # GPU 3: the other user's job blocks, twice, and is never signalled
    for _ in range(2):
        blocked = idle(sim, "--data", "gpus=3")
        assert blocked.rc != 0 and f"pid {theirs.pid} on GPU 3 (user nobody" in blocked.out, blocked
        assert "Nothing was signalled" in blocked.out, blocked
    assert all(d.alive() for d in daemons) and theirs.alive() and sim.used_mib()[3] == 5200


@needs_root
def test_9_other_users_job_on_the_server_gpu_blocks_the_start_and_survives_reruns(server_sim, configs):
    sim = server_sim
    theirs = sim.hold([0], 100000, user="nobody")
    for _ in range(2):  # the same refusal each time, nothing signalled, nothing started
        run = converge(sim, configs["eagle3-llama3.1-8b"])
        assert run.rc != 0 and "blocked: GPU 0 held by processes this operation may not stop" in run.out, run
        assert theirs.alive() and not (sim.root / "timeline.jsonl").exists()
    assert not any(s.get("status") == "running" for s in sim.servers())
