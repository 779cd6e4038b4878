"""The simulated host's SGLang: the fake ``sglang`` distribution behind DIR/bin/python, SGLang 0.5.23's parser and
``--config`` merging, its resolution of speculative settings, /server_info as 0.5.23 answers it, and GPU placement
through CUDA_VISIBLE_DEVICES / base-gpu-id / gpu-id-step (no pyinfra)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from conftest import free_port
from gpusim import srt_args
from gpusim.bench_serving import server_accept_length
from gpusim.host import SimHost
from gpusim.sglang_server import gpu_ordinals, resolved_args, visible_gpus
from gpusim.srt_args import ConfigArgumentMerger, build_parser, prepare_server_args
from gpusim.tools import host_data
from test_gpusim import smi, wait_for
from test_gpusim_faults import devices, gpu_devices_open

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"
M = ["--model-path", MODEL]
D = ["--speculative-draft-model-path", DRAFT]
TREE = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


@pytest.fixture(autouse=True)
def no_model_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache: the stand-in assumes a Llama where it finds no config.json."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "GPUSIM_ROOT"):
        monkeypatch.delenv(var, raising=False)


def yaml_file(tmp_path, text: str, name: str = "c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- the parser and --config ---------------------------------------------------------------------------------

def test_parser_has_every_flag_of_the_table_with_sglangs_action_classes():
    parser = build_parser(set())
    by_option = {o: a for a in parser._actions for o in a.option_strings}
    for row in srt_args.rows():
        for option in row["options"]:
            assert option in by_option, option
    assert by_option["--model-path"].required and by_option["--model"] is by_option["--model-path"]
    kinds = {o: type(by_option[o]).__name__ for o in ("--speculative-enable-w4a4-mxfp4-megamoe", "--lora-paths",
                                                      "--enable-dp-attention", "--monokernel-backend",
                                                      "--enable-metrics")}
    assert kinds == {"--speculative-enable-w4a4-mxfp4-megamoe": "BooleanOptionalAction",
                     "--lora-paths": "LoRAPathAction", "--enable-dp-attention": "DeprecatedStoreTrueAction",
                     "--monokernel-backend": "DeprecatedStoreConstAction", "--enable-metrics": "_StoreTrueAction"}
    assert parser.prog == "sglang serve"


def test_config_args_go_first_so_the_command_line_wins(tmp_path):
    path = yaml_file(tmp_path, "port: 30123\nenable-metrics: true\ndisable-radix-cache: false\n"
                               "json-model-override-args: {\"rope_scaling\": {\"factor\": 2}}\n"
                               "cuda-graph-bs-decode: [1, 2, 8]\ntrust-remote-code: false\ntp: 2\n")
    argv = [*M, "--config", path, "--port", "31000"]
    merged = ConfigArgumentMerger(build_parser(set())).merge_config_with_args(argv)
    assert merged == ["--port", "30123", "--enable-metrics", "--json-model-override-args",
                      '{"rope_scaling": {"factor": 2}}', "--cuda-graph-bs-decode", "1", "2", "8", "--tp", "2",
                      *M, "--port", "31000"]
    args = prepare_server_args(argv, removed=set())
    assert (args.port, args.tp_size, args.enable_metrics, args.disable_radix_cache) == (31000, 2, True, False)
    assert json.loads(args.json_model_override_args) == {"rope_scaling": {"factor": 2}}
    assert args.cuda_graph_bs_decode == [1, 2, 8]
    assert args.launch_command == " ".join(merged)  # the merged command line, as SGLang records it


@pytest.mark.parametrize("text, action", [
    ("speculative-enable-w4a4-mxfp4-megamoe: true\n", "'speculative_enable_w4a4_mxfp4_megamoe' with action "
                                                      "'BooleanOptionalAction'"),
    ("lora-paths: [a, b]\n", "'lora_paths' with action 'LoRAPathAction'"),
    ("enable_dp_attention: true\n", "'enable_dp_attention' with action 'DeprecatedStoreTrueAction'"),
])
def test_yaml_key_of_an_unsupported_action_is_refused(tmp_path, text, action):
    with pytest.raises(ValueError, match=f"^Unsupported config option {action}$"):
        prepare_server_args([*M, "--config", yaml_file(tmp_path, text)], removed=set())


def test_a_specops_section_in_the_yaml_is_an_unrecognized_argument(tmp_path, capsys):
    path = yaml_file(tmp_path, "speculative-algorithm: EAGLE3\nspecops:\n  gpus: [0, 1]\n")
    with pytest.raises(SystemExit) as exc:
        prepare_server_args([*M, "--config", path], removed=set())
    assert exc.value.code == 2
    assert 'sglang serve: error: unrecognized arguments: --specops {"gpus": [0, 1]}' in capsys.readouterr().err


def test_underscore_keys_are_looked_up_but_passed_verbatim(tmp_path, capsys):
    """SGLang normalises a key to find its action but writes ``--{key}`` as given: ``speculative_algorithm:``
    becomes ``--speculative_algorithm``, which argparse does not know."""
    with pytest.raises(SystemExit):
        prepare_server_args([*M, "--config", yaml_file(tmp_path, "speculative_algorithm: NGRAM\n")], removed=set())
    assert "unrecognized arguments: --speculative_algorithm NGRAM" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--config", "c.json"], "Config file must be YAML format, got: .json"),
    (["--config", "/nonexistent/c.yaml"], "Config file not found: /nonexistent/c.yaml"),
    (["--config", "LIST"], "Config file must contain a dictionary at root level"),
    (["--config", "a.yaml", "--config", "b.yaml"], "Multiple config files specified! Only one allowed."),
    (["--config"], "No config file specified after --config flag!"),
])
def test_config_file_errors_are_sglangs(tmp_path, argv, message):
    argv = [yaml_file(tmp_path, "- a\n- b\n", "list.yaml") if a == "LIST" else a for a in argv]
    with pytest.raises(ValueError) as exc:
        prepare_server_args([*M, *argv], removed=set())
    assert str(exc.value) == message


def test_removed_flags_make_an_older_engine(tmp_path, capsys):
    older = {"--speculative-adaptive", "--speculative-adaptive-config"}  # a release before adaptive speculation
    with pytest.raises(SystemExit):
        prepare_server_args([*M, "--speculative-adaptive"], removed=older)
    assert "unrecognized arguments: --speculative-adaptive" in capsys.readouterr().err
    assert prepare_server_args(M, removed=older).speculative_adaptive is False  # the field keeps its default
    # argparse takes a unique prefix for the whole option: with only --speculative-adaptive gone, it is read as an
    # abbreviation of --speculative-adaptive-config, as SGLang's own parser would read it
    with pytest.raises(SystemExit):
        prepare_server_args([*M, "--speculative-adaptive"], removed={"--speculative-adaptive"})
    assert "argument --speculative-adaptive-config: expected one argument" in capsys.readouterr().err


# --- resolution --------------------------------------------------------------------------------------------

def tree(argv) -> tuple:
    d = resolved_args([*M, *argv])
    return (d["speculative_algorithm"], *(d[k] for k in TREE))


@pytest.mark.parametrize("argv, expected", [
    (["--speculative-algorithm", "eagle3", *D], ("EAGLE3", 5, 4, 8)),  # lower case; SGLang's choice for Llama
    (["--speculative-algorithm", "NEXTN", *D], ("EAGLE", 5, 4, 8)),  # NEXTN is served as EAGLE
    (["--speculative-algorithm", "nextn", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1"],
     ("EAGLE", 2, 1, 3)),
    (["--speculative-algorithm", "NGRAM"], ("NGRAM", 1, 10, 12)),  # topk = max bfs breadth, draft 12, steps = //
    (["--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "24",
      "--speculative-ngram-max-bfs-breadth", "4", "--speculative-eagle-topk", "2"], ("NGRAM", 6, 4, 24)),
    (["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
      "--speculative-num-draft-tokens", "8", *D], ("EAGLE", 3, 1, 4)),  # topk 1: draft tokens = steps + 1
    (["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "5", "--speculative-eagle-topk", "4", *D],
     ("EAGLE3", 5, 4, None)),
    (["--speculative-algorithm", "standalone", "--speculative-draft-model-path", MODEL], ("STANDALONE", 3, 1, 4)),
    (["--speculative-algorithm", "EAGLE3", "--speculative-adaptive", *D], ("EAGLE3", 3, 1, 4)),
    (["--speculative-algorithm", "EAGLE3", "--speculative-adaptive", "--speculative-eagle-topk", "4",
      "--speculative-num-steps", "5", "--speculative-num-draft-tokens", "8", *D], ("EAGLE3", 5, 4, 8)),
    (["--speculative-algorithm", "DFLASH", *D], ("DFLASH", 1, 1, 16)),
    (["--speculative-algorithm", "DSPARK", *D], ("DSPARK", 1, 1, 8)),
    (["--speculative-algorithm", "FROZEN_KV_MTP", *D], ("FROZEN_KV_MTP", None, None, None)),
    ([], (None, None, None, None)),
])
def test_speculative_settings_resolve_as_sglang_does(argv, expected):
    assert tree(argv) == expected


def test_resolution_fills_what_sglang_fills():
    d = resolved_args([*M, "--speculative-algorithm", "EAGLE3", *D, "--api-key", "k1", "--tp", "2"])
    assert (d["max_running_requests"], d["speculative_draft_model_revision"], d["tokenizer_path"], d["api_key"],
            d["tp_size"], d["device"], d["speculative_adaptive"]) == (48, "main", MODEL, "k1", 2, "cuda", False)
    assert d["launch_command"] == " ".join(
        [*M, "--speculative-algorithm", "EAGLE3", *D, "--api-key", "k1", "--tp", "2"])
    assert "config" not in d and "server_args" not in d
    assert resolved_args([*M, "--speculative-algorithm", "EAGLE3", *D, "--max-running-requests", "16"])[
        "max_running_requests"] == 16
    cpu = resolved_args([*M, "--speculative-algorithm", "NGRAM", "--device", "cpu"])
    assert cpu["disable_overlap_schedule"] is True and cpu["enable_mixed_chunk"] is False
    dpa = resolved_args([*M, "--tp", "2", "--dp", "2", "--enable-dp-attention"])
    assert (dpa["dp_size"], dpa["attn_dp_size"], dpa["enable_dp_attention"]) == (1, 2, True)


@pytest.mark.parametrize("argv, error, message", [
    (["--speculative-num-steps", "3", *D], TypeError, "'>' not supported between instances of 'NoneType' and 'int'"),
    (["--speculative-eagle-topk", "2", *D], AssertionError, ""),
    (["--speculative-num-draft-tokens", "6", *D], AssertionError, ""),
    (["--speculative-adaptive", "--speculative-num-steps", "4", *D], ValueError,
     "--speculative-num-steps=4 is not in the adaptive config candidate_steps [0, 1, 3, 5, 7]. Pass one of those "
     "values."),
])
def test_eagle3_settings_sglang_rejects(argv, error, message):
    with pytest.raises(error) as exc:
        resolved_args([*M, "--speculative-algorithm", "EAGLE3", *argv])
    assert str(exc.value) == message


@pytest.mark.parametrize("argv, message", [
    (["--speculative-algorithm", "FOO"], "Unknown speculative algorithm name: FOO"),
    (["--speculative-algorithm", "DFLASH", *D, "--device", "cpu"],
     "DFLASH speculative decoding is not supported by SRTPlatform on device 'cpu'."),
    (["--speculative-algorithm", "UNO"], "UNO requires --uno-lora-path."),
    (["--tp", "2", "--dp", "2", "--enable-dp-attention", "--speculative-algorithm", "NGRAM"],
     "Currently ngram speculative decoding does not support dp attention."),
])
def test_other_settings_sglang_rejects(argv, message):
    with pytest.raises(ValueError) as exc:
        resolved_args([*M, *argv])
    assert str(exc.value) == message


def test_auto_params_follow_the_models_architecture(tmp_path, monkeypatch):
    snapshot = tmp_path / "hf" / "hub" / "models--deepseek-ai--DeepSeek-V3" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc")
    d = resolved_args(["--model-path", "deepseek-ai/DeepSeek-V3", "--speculative-algorithm", "NEXTN"])
    assert (d["speculative_algorithm"], *(d[k] for k in TREE)) == ("EAGLE", 3, 1, 4)
    assert d["speculative_draft_model_path"] == "deepseek-ai/DeepSeek-V3"  # the checkpoint is its own draft


# --- placement ---------------------------------------------------------------------------------------------

def placement(**kw) -> list[int]:
    args = {"nnodes": 1, "node_rank": 0, "tp_size": 1, "pp_size": 1, "dp_size": 1, "attn_dp_size": 1,
            "base_gpu_id": 0, "gpu_id_step": 1, **kw}
    return gpu_ordinals(SimpleNamespace(**args))


def test_gpu_ordinals_are_sglangs():
    assert placement(tp_size=2) == [0, 1]
    assert placement(tp_size=2, base_gpu_id=1, gpu_id_step=2) == [1, 3]
    assert placement(tp_size=2, dp_size=2, base_gpu_id=1, gpu_id_step=2) == [1, 3, 5, 7]  # replica 1: +tp*step
    assert placement(tp_size=2, attn_dp_size=2) == [0, 1]  # attention DP runs inside the TP group
    assert placement(tp_size=4, nnodes=2, node_rank=1) == [0, 1]  # each node numbers its own GPUs


def test_visible_gpus_remap_like_cuda():
    host = list(range(8))
    assert visible_gpus({}, host) == host
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "5,7"}, host) == [5, 7]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3,x,1"}, host) == [3]  # enumeration stops at an invalid entry
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "9"}, host) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, host) == []


# --- the simulated host's Python and a running stand-in ----------------------------------------------------

def test_host_python_has_the_hosts_sglang(sim):
    sim.configure(sglang_version="0.5.22")
    py = sim.root / "bin" / "python"
    program = ("import sglang, json; from sglang.srt.server_args import ServerArgs, prepare_server_args; "
               "from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger; "
               "a = prepare_server_args(['--model-path', 'm', '--speculative-algorithm', 'ngram']); a.resolve_once(); "
               "print(json.dumps([sglang.__version__, a.resolved_dict()['speculative_eagle_topk'], "
               "ServerArgs.__name__, ConfigArgumentMerger.__name__]))")
    out = subprocess.run([str(py), "-c", program], capture_output=True, text=True, env=sim.env(), cwd="/")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["0.5.22", 10, "ServerArgs", "ConfigArgumentMerger"]
    data = host_data(sim.root)
    assert data["specops_launchers"] == {"sglang": [f"{sim.root}/bin/python", "-m", "sglang.launch_server"]}
    assert set(data) == {"_env", "specops_python", "specops_state_dir", "specops_gpu_devices", "specops_launchers",
                         "specops_bench_runner"}


class Standin:
    """A stand-in server started as product code starts it (``DIR/bin/python -m sglang.launch_server``), in its own
    session; stopped by PID."""

    def __init__(self, sim: SimHost, *argv: str, env: dict | None = None, api_key: str | None = None):
        self.port, self.api_key, self.sim = free_port(), api_key, sim
        self.log = sim.root / f"standin-{self.port}.log"
        full = [str(sim.root / "bin" / "python"), "-m", "sglang.launch_server", "--host", "127.0.0.1",
                "--port", str(self.port), *argv, *(["--api-key", api_key] if api_key else [])]
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(full, env={**sim.env(), **(env or {})}, stdout=fh, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def get(self, path: str):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self) -> "Standin":
        wait_for(lambda: self.ready() or self.proc.poll() is not None, timeout=20, what="stand-in ready")
        assert self.proc.poll() is None, self.log.read_text()
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def standins(sim):
    sim.configure(server_start_s=0.1)
    started: list[Standin] = []

    def start(*argv, **kw) -> Standin:
        started.append(Standin(sim, *argv, **kw))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def test_server_info_is_sglang_0_5_23s(standins):
    argv = [*M, "--speculative-algorithm", "eagle3", *D, "--tp", "2", "--dp", "2", "--mem-fraction-static", "0.4"]
    s = standins(*argv, api_key="sk-test-1234").wait_ready()
    code, info = s.get("/server_info")
    assert code == 200 and "server_args" not in info and info["version"] == "0.5.23"
    assert info["launch_command"] == " ".join(["--host", "127.0.0.1", "--port", str(s.port), *argv,
                                               "--api-key", "sk-test-1234"])  # the key in clear, as SGLang has it
    assert info["api_key"] == "sk-test-1234"
    assert (info["speculative_algorithm"], *(info[k] for k in TREE)) == ("EAGLE3", 5, 4, 8)
    assert info == {**info, **resolved_args(info["launch_command"].split(" "))}
    assert len(info["internal_states"]) == 2 and all(st["avg_spec_accept_length"] > 1 for st in info["internal_states"])
    code, model = s.get("/model_info")
    assert code == 200 and model["model_path"] == MODEL and model["architectures"] == ["LlamaForCausalLM"]
    plain = standins(*M, "--mem-fraction-static", "0.4").wait_ready()
    code, info = plain.get("/server_info")
    assert code == 200 and info["internal_states"] and "avg_spec_accept_length" not in info["internal_states"][0]


def test_get_server_info_answers_the_same_and_warns_on_every_call(standins):
    s = standins(*M, "--speculative-algorithm", "NGRAM").wait_ready()
    warning = ("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
               "Please use '/server_info' instead.")
    assert warning not in s.log.read_text()
    first, second = s.get("/get_server_info"), s.get("/get_server_info")
    assert first[0] == second[0] == 200 and first[1]["speculative_eagle_topk"] == 10
    assert set(first[1]) == set(s.get("/server_info")[1])
    wait_for(lambda: s.log.read_text().count(warning) == 2, what="two deprecation warnings")


def test_an_engine_older_than_server_info_answers_404_and_the_old_body(sim, standins):
    sim.configure(sglang_version="0.4.9")
    s = standins(*M, "--speculative-algorithm", "EAGLE3", *D, "--speculative-num-steps", "3",
                 "--speculative-eagle-topk", "1").wait_ready()
    assert s.get("/server_info") == (404, None)
    code, info = s.get("/get_server_info")
    assert code == 200 and info["version"] == "0.4.9" and "launch_command" not in info
    assert (info["speculative_num_steps"], info["speculative_num_draft_tokens"]) == (3, 4)
    assert "deprecated" not in s.log.read_text()
    assert server_accept_length(f"http://127.0.0.1:{s.port}") == info["internal_states"][0]["avg_spec_accept_length"]


def test_steps_without_topk_dies_at_start_with_sglangs_error(sim, standins):
    s = standins(*M, "--speculative-algorithm", "EAGLE3", *D, "--speculative-num-steps", "3")
    assert s.proc.wait(timeout=20) == 1
    log = s.log.read_text()
    assert "Traceback (most recent call last):" in log
    assert "TypeError: '>' not supported between instances of 'NoneType' and 'int'" in log
    assert sim.used_mib() == {0: 0, 1: 0, 2: 0, 3: 0}


def test_a_gpu_past_the_visible_ones_is_an_invalid_device_ordinal(sim, standins):
    s = standins(*M, "--tp", "2", env={"CUDA_VISIBLE_DEVICES": "3"})
    assert s.proc.wait(timeout=20) == 1
    assert "CUDA error: invalid device ordinal" in s.log.read_text()
    assert sim.used_mib() == {0: 0, 1: 0, 2: 0, 3: 0}


def gpus_by_pid(sim) -> dict[int, set[int]]:
    index = dict(line.split(", ")[::-1] for line in smi(sim, "--query-gpu=index,uuid",
                                                      "--format=csv,noheader").stdout.splitlines())
    out: dict[int, set[int]] = {}
    apps = smi(sim, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader").stdout.splitlines()
    for pid, uuid in (line.split(", ") for line in apps):
        out.setdefault(int(pid), set()).add(int(index[uuid]))
    return out


def test_two_servers_on_disjoint_gpus_of_one_host(tmp_path):
    sim = SimHost.create(tmp_path / "host8", 8, nvml=False, release_delay_s=0.2)
    sim.configure(server_start_s=0.1)
    servers = []
    try:
        servers.append(Standin(sim, *M, "--tp", "2", "--mem-fraction-static", "0.5",
                               env={"CUDA_VISIBLE_DEVICES": "5,7"}))
        servers.append(Standin(sim, *M, "--mem-fraction-static", "0.5", env={"CUDA_VISIBLE_DEVICES": "1"}))
        for s in servers:
            s.wait_ready()
        a, b = servers
        wait_for(lambda: len(gpus_by_pid(sim)) == 2, what="both servers' memory booked")
        assert gpus_by_pid(sim) == {a.proc.pid: {5, 7}, b.proc.pid: {1}}
        assert gpu_devices_open(a.proc.pid) == devices(sim, 5, 7) and gpu_devices_open(b.proc.pid) == devices(sim, 1)
        used = sim.used_mib()
        assert {g for g, mib in used.items() if mib} == {1, 5, 7}
    finally:
        for s in servers:
            s.stop()
        sim.cleanup()
