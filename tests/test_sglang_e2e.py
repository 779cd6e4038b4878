"""Issue 13 end to end on the simulated host (pyinfra CLI, deploy.py, the stand-in SGLang): the server on exactly
its GPUs, configs SGLang rewrites converging with zero changes on re-run, no secret stored when /server_info
echoes the key, and the host's own SGLang refusing a command line before the old server is stopped."""
import json
import os
import textwrap
import urllib.request

import pytest
import yaml

from conftest import changed, free_port, needs_root, run_pyinfra, shipped
from gpusim.host import SimHost
from gpusim.ledger import proc_start_time


@pytest.fixture
def host8(tmp_path):
    host = SimHost.create(tmp_path / "host", 8, release_delay_s=0.3)
    host.configure(server_start_s=0.4)
    yield host
    host.cleanup()


def write_config(tmp_path, name, base="baseline-llama3.1-8b", port=None, **changes):
    data = shipped(base)
    specops = {**data.pop("specops"), "ready_timeout_s": 30, **changes.pop("specops", {})}
    data.update({"port": port or free_port(), **changes})
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    (tmp_path / f"{name}.specops.yaml").write_text(yaml.safe_dump(specops))
    return path


def converge(sim, config, *args):
    return run_pyinfra(sim, "--data", f"config={config}", *args)


def server_state(sim, name="llm"):
    return json.loads((sim.root / "servers" / name / "state.json").read_text())


def gpus_of(sim, pid) -> set[int]:
    """The GPUs on which the simulated driver lists memory of ``pid`` (what nvidia-smi there shows)."""
    return {p.gpu_index for p in sim.snapshot().procs if p.pid == pid}


def server_info(port, key=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/server_info")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


@needs_root
def test_server_runs_on_gpus_5_and_7_while_another_users_job_holds_gpu_0(host8, tmp_path):
    theirs = host8.hold([0], 70000, user="nobody")  # another user's job: never stopped, and in the way of GPU 0
    cfg = write_config(tmp_path, "two", **{"tp-size": 2, "specops": {"gpus": [5, 7]}})
    run = converge(host8, cfg)
    assert run.rc == 0 and "config confirmed" in run.out, run
    state = server_state(host8)
    assert gpus_of(host8, state["pid"]) == {5, 7}, host8.snapshot()
    assert "export CUDA_VISIBLE_DEVICES=5,7" in (host8.root / "servers" / "llm" / "launch.sh").read_text()
    assert state["recorded"]["gpus"] == [5, 7] and state["recorded"]["engine"]["version"] == "0.5.23"
    again = converge(host8, cfg, "-v")
    assert again.rc == 0 and changed(again) == 0 and "SGLang 0.5.23, pid" in again.out, again
    assert "GPU 5,7, healthy" in again.out, again
    assert theirs.alive() and server_state(host8)["pid"] == state["pid"]


def test_two_servers_on_disjoint_gpus_of_one_host(host8, tmp_path):
    a = write_config(tmp_path, "a", **{"tp-size": 2, "specops": {"gpus": [1, 2]}})
    b = write_config(tmp_path, "b", **{"specops": {"gpus": [6]}})
    deploy = tmp_path / "two.py"
    deploy.write_text(textwrap.dedent(f"""
        from operations import server
        server.running(name="a", server_name="a", config={str(a)!r})
        server.running(name="b", server_name="b", config={str(b)!r})
    """))
    run = run_pyinfra(host8, deploy=str(deploy))
    assert run.rc == 0 and run.out.count("config confirmed") == 2, run
    pa, pb = server_state(host8, "a")["pid"], server_state(host8, "b")["pid"]
    assert gpus_of(host8, pa) == {1, 2} and gpus_of(host8, pb) == {6}
    again = run_pyinfra(host8, deploy=str(deploy))
    assert again.rc == 0 and changed(again) == 0, again
    assert proc_start_time(pa) and proc_start_time(pb)


REWRITTEN = {
    # NEXTN is served as EAGLE, with the tree SGLang chooses; no draft model (the target's own MTP layers)
    "nextn": ({"speculative-algorithm": "NEXTN"}, {"speculative_algorithm": "EAGLE"}),
    # NGRAM: topk = bfs breadth 10, draft tokens 12, steps 12 // 10
    "ngram": ({"speculative-algorithm": "ngram"},
              {"speculative_algorithm": "NGRAM", "speculative_eagle_topk": 10, "speculative_num_draft_tokens": 12,
               "speculative_num_steps": 1}),
    # EAGLE3 with steps / topk / draft tokens omitted: 5 / 4 / 8 for a Llama target
    "eagle3-auto": ({"speculative-algorithm": "EAGLE3",
                     "speculative-draft-model-path": "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"},
                    {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 5, "speculative_eagle_topk": 4,
                     "speculative_num_draft_tokens": 8}),
}


@pytest.mark.parametrize("case", sorted(REWRITTEN))
def test_configs_sglang_rewrites_converge_and_rerun_with_zero_changes(host8, tmp_path, case):
    flags, resolved = REWRITTEN[case]
    cfg = write_config(tmp_path, case, **flags)
    run = converge(host8, cfg)
    assert run.rc == 0 and "config confirmed" in run.out, run
    port = yaml.safe_load(cfg.read_text())["port"]
    info = server_info(port)
    assert {k: info[k] for k in resolved} == resolved, info  # the stand-in reports what SGLang resolves
    assert "server_args" not in info and "launch_command" in info  # 0.5.23's shape
    again = converge(host8, cfg, "-v")
    assert again.rc == 0 and changed(again) == 0 and "healthy" in again.out, again
    assert "deprecated" not in (host8.root / "servers" / "llm" / "server.log").read_text().lower()


def test_no_secret_is_stored_when_server_info_echoes_the_key(host8, tmp_path):
    key = "sk-e2e-Zq9xW2-very-secret"
    cfg = write_config(tmp_path, "keyed", base="eagle3-llama3.1-8b", **{"api-key": "${SPECOPS_E2E_KEY}"})
    env_key = {"SPECOPS_E2E_KEY": key}
    port = yaml.safe_load(cfg.read_text())["port"]
    results = tmp_path / "results"
    os.environ.update(env_key)
    try:
        run = converge(host8, cfg)
        assert run.rc == 0 and "config confirmed" in run.out, run
        assert key in server_info(port, key)["launch_command"]  # the stand-in echoes it, as SGLang does
        sweep = run_pyinfra(host8, "--data", f"configs={cfg}", "--data", "concurrency=1", "--data", "num_prompts=4",
                            "--data", "input_len=16", "--data", "output_len=8", "--data", f"results={results}",
                            deploy="sweep.py", timeout=300)
        assert sweep.rc == 0, sweep
    finally:
        os.environ.pop("SPECOPS_E2E_KEY")
    assert key not in run.out + sweep.out
    stored = [p for root in (host8.root / "servers", results) for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "state.json" for p in stored) and any(p.suffix == ".json" for p in stored
                                                               if results in p.parents)
    leaks = [str(p) for p in stored if p.name != "secrets.env" and key.encode() in p.read_bytes()]
    assert leaks == []
    snapshot = next(json.loads(p.read_text()) for p in stored if results in p.parents and p.suffix == ".json"
                    and "server_info" in p.read_text())
    assert "--api-key=<secret>" in snapshot["server_info"]["launch_command"]


def test_the_hosts_own_sglang_refuses_a_flag_before_the_old_server_stops(host8, tmp_path):
    base = write_config(tmp_path, "base")
    assert converge(host8, base).rc == 0
    old = server_state(host8)["pid"]
    host8.configure(sglang_version="0.5.20", sglang_removed_flags=["--cuda-graph-max-bs-decode"])
    eagle = write_config(tmp_path, "eagle", base="eagle3-llama3.1-8b", port=yaml.safe_load(base.read_text())["port"])
    run = converge(host8, eagle)
    assert run.rc != 0, run
    assert "the host's SGLang 0.5.20" in run.out and "--cuda-graph-max-bs-decode" in run.out, run
    assert "the running server was left as it was" in run.out, run
    assert proc_start_time(old) is not None and server_state(host8)["pid"] == old
    dry = converge(host8, eagle, "--dry")
    assert dry.rc != 0 and "WOULD FAIL" in dry.out and "refuses the command line" in dry.out, dry


def test_a_server_that_lands_on_other_gpus_fails_readiness_and_is_stopped(host8, tmp_path):
    # a launcher that drops CUDA_VISIBLE_DEVICES (a wrapper script someone wrote): the server lands on GPU 0
    wrapper = tmp_path / "unplaced-launch"
    wrapper.write_text(f"#!/bin/sh\nunset CUDA_VISIBLE_DEVICES\nexec {host8.root / 'bin' / 'python'} "
                       f"-m sglang.launch_server \"$@\"\n")
    wrapper.chmod(0o755)
    cfg = write_config(tmp_path, "placed", **{"specops": {"gpus": [3], "launcher": [str(wrapper)]}})
    dry = converge(host8, cfg, "--dry")
    assert "note: the host's SGLang was not asked to parse the command line" in dry.out, dry  # not PY -m ...
    run = converge(host8, cfg)
    assert run.rc != 0, run
    assert "server runs on other GPUs than its config declares" in run.out, run
    assert "runs on GPU 0, config declares GPU 3" in run.out and "GPU processes now:" in run.out, run
    state = server_state(host8)
    assert state["status"] != "running" and proc_start_time(state["pid"]) is None


def test_another_sglang_version_on_the_host_is_said_and_shown_as_drift(host8, tmp_path):
    base = write_config(tmp_path, "base")
    assert converge(host8, base).rc == 0
    assert server_state(host8)["recorded"]["engine"]["version"] == "0.5.23"
    host8.configure(sglang_version="0.5.24")  # the venv was upgraded under the running server
    eagle = write_config(tmp_path, "eagle", base="eagle3-llama3.1-8b", port=yaml.safe_load(base.read_text())["port"])
    dry = converge(host8, eagle, "--dry")
    assert dry.rc == 0, dry
    assert "~ engine_version: 0.5.23 -> 0.5.24 (restart)" in dry.out, dry
    assert "note: the host runs SGLang 0.5.24; specops' flag table is 0.5.23" in dry.out, dry
    run = converge(host8, eagle)
    assert run.rc == 0 and "config confirmed" in run.out, run
    assert server_state(host8)["recorded"]["engine"]["version"] == "0.5.24"
