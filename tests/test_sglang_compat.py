"""Config X as SGLang takes it: the engine file and its sidecar, the desired view normalised like SGLang's resolver,
the command line split between engine.yaml and flags, GPU placement, and /server_info masking on the host.

(The same rules against the real SGLang 0.5.23 are in tests/test_real_sglang.py.)"""
import json
import subprocess

import pytest
import yaml

from conftest import REPO
from factories import host_program, proc, state
from operations.remote import server_dir
from operations.model.config import ConfigError, from_mapping, known_configs, load
from operations.model.engines import AUTO, SecretRef, engine_for, mismatches
from operations.controller.readiness import placement_problem
from operations.model.server_state import ServerStatus, drift
from operations.controller.supervisors import Supervisor

SGLANG = engine_for("sglang")
EAGLE3 = {"model-path": "m", "speculative-algorithm": "EAGLE3", "speculative-draft-model-path": "d"}


def desired(data):
    return SGLANG.desired_view(from_mapping(data, "t"))


def reported(**fields):
    """A /server_info body as SGLang 0.5.23 returns it: every resolved argument at the top level."""
    base = {"model_path": "m", "speculative_algorithm": None, "speculative_draft_model_path": None,
            "speculative_num_steps": None, "speculative_eagle_topk": None, "speculative_num_draft_tokens": None,
            "tp_size": 1, "dp_size": 1, "port": 30000, "base_gpu_id": 0, "gpu_id_step": 1}
    return {**base, **fields, "launch_command": "python3 -m sglang.launch_server", "version": "0.5.23"}


@pytest.mark.parametrize("data, info", [
    ({"model-path": "m", "speculative-algorithm": "NEXTN"},  # served as EAGLE; tree chosen from the model
     reported(speculative_algorithm="EAGLE", speculative_draft_model_path="m", speculative_num_steps=3,
              speculative_eagle_topk=1, speculative_num_draft_tokens=4)),
    ({"model-path": "m", "speculative-algorithm": "ngram"},
     reported(speculative_algorithm="NGRAM", speculative_num_steps=1, speculative_eagle_topk=10,
              speculative_num_draft_tokens=12)),
    ({"model-path": "m", "speculative-algorithm": "NGRAM", "speculative-num-draft-tokens": 8,
      "speculative-ngram-max-bfs-breadth": 3},
     reported(speculative_algorithm="NGRAM", speculative_num_steps=2, speculative_eagle_topk=3,
              speculative_num_draft_tokens=8, speculative_ngram_max_bfs_breadth=3)),
    ({**EAGLE3, "speculative-num-steps": 3, "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 8},
     reported(speculative_algorithm="EAGLE3", speculative_draft_model_path="d", speculative_num_steps=3,
              speculative_eagle_topk=1, speculative_num_draft_tokens=4)),
    (EAGLE3, reported(speculative_algorithm="EAGLE3", speculative_draft_model_path="d", speculative_num_steps=5,
                      speculative_eagle_topk=4, speculative_num_draft_tokens=8)),
    ({**EAGLE3, "speculative-adaptive": True},
     reported(speculative_algorithm="EAGLE3", speculative_draft_model_path="d", speculative_num_steps=3,
              speculative_eagle_topk=1, speculative_num_draft_tokens=4, speculative_adaptive=True)),
    ({"model-path": "m", "base-gpu-id": 4, "tp-size": 2}, reported(tp_size=2)),  # CUDA_VISIBLE_DEVICES places it
])
def test_a_server_sglang_started_from_x_compares_equal_to_x(data, info):
    cfg = from_mapping(data, "t")
    assert mismatches(SGLANG.desired_view(cfg), SGLANG.reported_view(cfg, info)) == []
    status = ServerStatus(alive=True, status="running", config_hash=cfg.config_hash, health=200, server_info=info)
    assert [c for c in drift(cfg, status) if c.restart] == []


def test_a_real_difference_is_still_caught():
    cfg = from_mapping({**EAGLE3, "speculative-num-steps": 3, "speculative-eagle-topk": 4,
                        "speculative-num-draft-tokens": 16}, "t")
    info = reported(speculative_algorithm="EAGLE3", speculative_draft_model_path="d", speculative_num_steps=3,
                    speculative_eagle_topk=4, speculative_num_draft_tokens=8)
    assert mismatches(SGLANG.desired_view(cfg), SGLANG.reported_view(cfg, info)) == [
        ("speculative_num_draft_tokens", 8, 16)]
    # "SGLang decides" matches any value SGLang chose, but not another algorithm
    auto = from_mapping(EAGLE3, "t")
    assert SGLANG.desired_view(auto)["speculative_num_steps"] is AUTO
    wrong = reported(speculative_algorithm="EAGLE", speculative_draft_model_path="d")
    assert [k for k, _, _ in mismatches(SGLANG.desired_view(auto), SGLANG.reported_view(auto, wrong))] == [
        "speculative_algorithm"]


def test_drift_from_what_was_recorded_is_resolved_the_same_way():
    cfg = from_mapping({"model-path": "m", "speculative-algorithm": "nextn"}, "t")
    status = ServerStatus(alive=False, recorded={"args": cfg.masked_args()})
    assert drift(cfg, status) == []


def test_engine_file_is_sglang_config_yaml_and_the_rest_goes_on_the_command_line(tmp_path):
    cfg = from_mapping({**EAGLE3, "speculative-num-steps": 3, "speculative-eagle-topk": 1, "api-key": "k-123456",
                        "enable-tf32-matmul": False, "default-chat-template-kwargs": {"a": [1, 2]},
                        "trust-remote-code": True, "base-gpu-id": 2}, "t")
    doc = yaml.safe_load(SGLANG.engine_yaml(cfg))
    assert doc["model-path"] == "m" and doc["speculative-num-steps"] == 3 and doc["trust-remote-code"] is True
    assert json.loads(doc["default-chat-template-kwargs"]) == {"a": [1, 2]}  # JSON, as the loader would make it
    assert "api-key" not in doc and "enable-tf32-matmul" not in doc and "base-gpu-id" not in doc
    argv = SGLANG.launch_argv(cfg, "/srv/llm/engine.yaml")
    assert argv[:5] == ["python3", "-m", "sglang.launch_server", "--config", "/srv/llm/engine.yaml"]
    assert argv[5:] == ["--no-enable-tf32-matmul", SecretRef("api_key", "--api-key=")]
    files = {f.path.rsplit("/", 1)[1]: f for f in Supervisor("llm", str(tmp_path)).files(cfg)}
    assert "export CUDA_VISIBLE_DEVICES=2" in files["launch.sh"].content
    assert "k-123456" not in files["engine.yaml"].content + files["launch.sh"].content


def test_shipped_configs_are_engine_files_with_settings_beside_them():
    for name in ("eagle3-llama3.1-8b", "baseline-llama3.1-8b", "eagle3-llama3.1-70b-2node"):
        engine = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
        assert "specops" not in engine  # a file `sglang serve --config` accepts as it is
        cfg = load(str(REPO / "configs" / f"{name}.yaml"))
        assert cfg.ready_timeout_s == yaml.safe_load((REPO / "configs" / f"{name}.specops.yaml").read_text())[
            "ready_timeout_s"]
    assert "eagle3-llama3.1-8b" in known_configs(REPO / "configs")
    assert not any(n.endswith(".specops") for n in known_configs(REPO / "configs"))


def test_sidecar_rules(tmp_path):
    (tmp_path / "x.yaml").write_text("model-path: m\nport: 31000\n")
    assert load(str(tmp_path / "x.yaml")).ready_timeout_s == 900  # no sidecar: defaults
    (tmp_path / "x.specops.yaml").write_text("ready_timeout_s: 60\ngpus: [5, 7]\n")
    cfg = load(str(tmp_path / "x.yaml"))
    assert cfg.ready_timeout_s == 60 and cfg.gpu_indices() == [5, 7] is not None
    with pytest.raises(ConfigError, match="holds specops settings, not a config"):
        load(str(tmp_path / "x.specops.yaml"))
    (tmp_path / "x.yaml").write_text("model-path: m\nspecops: {ready_timeout_s: 5}\n")
    with pytest.raises(ConfigError, match="given both in"):
        load(str(tmp_path / "x.yaml"))
    (tmp_path / "x.specops.yaml").write_text("ready_timout_s: 60\n")
    (tmp_path / "x.yaml").write_text("model-path: m\n")
    with pytest.raises(ConfigError, match="specops.ready_timout_s: unknown specops key"):
        load(str(tmp_path / "x.yaml"))


def test_gpu_selection_is_checked_before_anything_runs():
    from operations.model.validation import HostContext, validate

    def issues(data, gpus=None):
        return [str(i) for i in validate(from_mapping(data, "t"), HostContext("h", gpus))]

    assert from_mapping({"model-path": "m", "tp-size": 2, "base-gpu-id": 4}, "t").gpu_indices() == [4, 5]
    assert from_mapping({"model-path": "m", "tp-size": 2, "base-gpu-id": 1, "gpu-id-step": 2}, "t").gpu_indices() == [1, 3]
    assert issues({"model-path": "m", "tp-size": 2, "specops": {"gpus": [5]}}) == [
        "[h] specops.gpus: 1 GPUs listed but tp-size x dp-size / nnodes = 2"]
    assert issues({"model-path": "m", "base-gpu-id": 1, "specops": {"gpus": [5]}}) == [
        "[h] specops.gpus: given together with base-gpu-id / gpu-id-step: list the GPUs in one place "
        "(specops.gpus is what CUDA_VISIBLE_DEVICES is set to)"]
    assert issues({"model-path": "m", "specops": {"gpus": [7]}}, gpus=4) == [
        "[h] tp-size: tp-size 1 x dp-size 1 / nnodes 1 needs 1 GPU(s) (up to index 7); host has 4"]
    assert issues({"model-path": "m", "specops": {"env": {"CUDA_VISIBLE_DEVICES": "1"}}}) == [
        "[h] specops.env.CUDA_VISIBLE_DEVICES: set by specops from the GPUs the config declares: use specops.gpus "
        "(or base-gpu-id) instead"]


def test_placement_from_the_gpu_fact():
    cfg = from_mapping({"model-path": "m", "tp-size": 2, "specops": {"gpus": [5, 7]}}, "t")
    ok = state((0,) * 8, proc(100, 5, 9000, pgid=100), proc(101, 7, 9000, pgid=100), proc(300, 0, 500, pgid=300))
    assert placement_problem(cfg, ok, 100) is None
    wrong = state((0,) * 8, proc(100, 0, 9000, pgid=100), proc(101, 7, 9000, pgid=100))
    assert placement_problem(cfg, wrong, 100) == ("runs on GPU 0,7, config declares GPU 5,7 (also on GPU 0; "
                                                  "not on GPU 5)")
    assert placement_problem(cfg, ok, 999) is None  # none of its processes listed: nothing to judge by


def test_server_info_shaped_like_sglangs_is_masked_on_the_host(tmp_path):
    key, token = "sk-live-Zq9xW2", "hf_AbCdEf123"
    (tmp_path / "secrets.env").write_text(f"SPECOPS_SECRET_API_KEY={key}\nexport HF_TOKEN={token}\n")
    body = {"model_path": "m", "api_key": key, "admin_api_key": None, "max_total_tokens": 4096,
            "launch_command": f"python3 -m sglang.launch_server --model-path m --api-key {key} --port 30000",
            "internal_states": [{"note": f"loaded with token {token}"}], "version": "0.5.23",
            "tokenizer_path": "m", "watermark_key": "wm-secret"}
    out = server_dir.redactor(str(tmp_path))(body)
    text = json.dumps(out)
    assert key not in text and token not in text and "wm-secret" not in text
    assert out["api_key"] == "<secret>" and out["admin_api_key"] is None
    assert out["launch_command"] == "python3 -m sglang.launch_server --model-path m --api-key <secret> --port 30000"
    assert out["max_total_tokens"] == 4096 and out["tokenizer_path"] == "m"  # not secrets, whatever they contain
    assert out["internal_states"] == [{"note": "loaded with token <secret>"}]


def _tiny_sglang(root):
    """A tiny SGLang-shaped package (the real one: test_real_sglang.py): its parser and its --config loader."""
    pkg = root / "sglang"
    (pkg / "srt" / "utils").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.5.99'\n")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "utils" / "__init__.py").write_text("")
    (pkg / "srt" / "server_args.py").write_text(
        "class ServerArgs:\n    @staticmethod\n    def add_cli_args(p):\n        p.add_argument('--model-path')\n"
        "        p.add_argument('--config')\n")
    (pkg / "srt" / "utils" / "server_args_config_parser.py").write_text(
        "class ConfigArgumentMerger:\n    def __init__(self, parser):\n        pass\n"
        "    def merge_config_with_args(self, argv):\n        text = open(argv[argv.index('--config') + 1]).read()\n"
        "        if 'bad' in text:\n            raise ValueError('Unsupported config option bad')\n"
        "        i = argv.index('--config')\n"
        "        return ['--model-path', text.split(':')[1].strip()] + argv[:i] + argv[i + 2:]\n")
    return pkg


def _host_run(home, path, name, *args):
    """Host program ``name`` run as specops runs it (the bundle under HOME), with ``path`` on PYTHONPATH."""
    out = subprocess.run(host_program(name, *args), capture_output=True, text=True,
                         env={"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin", "HOME": str(home)})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_engine_check_program_reads_a_parser_and_its_config_loader(tmp_path):
    """engine_check.py against a tiny SGLang-shaped package: the flags it refuses, the loader's errors and a
    missing SGLang each come back as one JSON document."""
    _tiny_sglang(tmp_path)

    def check(flags, engine_yaml, path=tmp_path):
        return _host_run(tmp_path, path, "engine_check.py", json.dumps(flags), engine_yaml)

    assert check(["--config", "/not/there.yaml"], "model-path: m\n")["ok"] is True
    got = check(["--config", "/x.yaml", "--nope", "1"], "model-path: m\n")
    assert got["version"] == "0.5.99" and not got["ok"] and got["error"] == "unrecognized arguments: --nope 1"
    assert check(["--config", "/x.yaml"], "bad: 1\n")["error"] == "its --config loader: Unsupported config option bad"
    missing = check([], "", path=tmp_path / "none")
    assert not missing["ok"] and missing["error"].startswith("ModuleNotFoundError")
    assert not (tmp_path / ".cache" / "specops" / "engine-checks").exists()  # no key given: nothing kept


def test_the_host_keeps_its_engine_s_verdict_until_sglang_changes(tmp_path):
    """With a key the verdict is kept (0600, in a 0700 directory) and observe returns it with the GPUs and the
    server; an edited (or reinstalled) parser file voids it; a missing SGLang is never kept."""
    pkg = _tiny_sglang(tmp_path)
    key, refused = "ab" * 12, "cd" * 12
    observe = lambda k: _host_run(tmp_path, tmp_path, "observe.py", str(tmp_path / "dev*"), str(tmp_path / "srv"),
                                  "1", "--engine", k)["engine"]
    assert observe(key) is None
    fresh = _host_run(tmp_path, tmp_path, "engine_check.py", json.dumps(["--model-path", "m"]), "", key)
    assert fresh["ok"] is True and "cached" not in fresh
    kept = tmp_path / ".cache" / "specops" / "engine-checks" / f"{key}.json"
    assert kept.stat().st_mode & 0o777 == 0o600 and kept.parent.stat().st_mode & 0o777 == 0o700
    assert observe(key) == {**fresh, "cached": True}
    _host_run(tmp_path, tmp_path, "engine_check.py", json.dumps(["--nope"]), "", refused)
    assert observe(refused)["error"] == "unrecognized arguments: --nope" and observe(refused)["ok"] is False
    parser = pkg / "srt" / "server_args.py"
    parser.write_text(parser.read_text() + "        p.add_argument('--nope', action='store_true')\n")
    assert observe(key) is None and observe(refused) is None  # SGLang changed: ask it again
    assert _host_run(tmp_path, tmp_path, "engine_check.py", json.dumps(["--nope"]), "", refused)["ok"] is True
    assert observe(refused)["ok"] is True
    _host_run(tmp_path, tmp_path / "none", "engine_check.py", "[]", "", "ef" * 12)
    assert observe("ef" * 12) is None  # no SGLang in that interpreter: nothing judged, nothing kept
    assert observe("../../x" + "0" * 17) is None  # not a key: never a path


def test_a_flag_sharing_its_dest_with_a_deprecated_alias_is_itself():
    # --monokernel-backend (deprecated, choices ['amd']) shares the dest of the switch --enable-amd-monokernel
    cfg = from_mapping({"model-path": "m", "enable-amd-monokernel": True}, "t")
    from operations.model.validation import validate

    assert validate(cfg) == []
    assert yaml.safe_load(SGLANG.engine_yaml(cfg))["enable-amd-monokernel"] is True


@pytest.mark.parametrize("data, info", [
    ({"model-path": "m", "served-model-name": 8}, reported(served_model_name="8")),  # a str flag: parsed as text
    ({"model-path": "m", "max-total-tokens": "16k"}, reported(max_total_tokens=16000)),  # human_readable_int
    ({"model-path": "m", "preferred-sampling-params": '{"temperature": 0.5}'},
     reported(preferred_sampling_params={"temperature": 0.5})),  # a JSON string: SGLang reports the object
    ({"model-path": "m", "prompt-tokens-buckets": "default"}, reported(prompt_tokens_buckets=["default"])),
    ({"model-path": "m", "tp-size": 2, "dp-size": 2, "enable-dp-attention": True},  # attention DP: dp -> attn dp
     reported(tp_size=2, dp_size=1, attn_dp_size=2, enable_dp_attention=True)),
])
def test_desired_values_are_compared_as_sglangs_parser_makes_them(data, info):
    cfg = from_mapping(data, "t")
    assert mismatches(SGLANG.desired_view(cfg), SGLANG.reported_view(cfg, info)) == []


def test_attention_dp_runs_on_the_tp_gpus():
    cfg = from_mapping({"model-path": "m", "tp-size": 8, "dp-size": 8, "enable-dp-attention": True}, "t")
    assert cfg.gpu_indices() == list(range(8))
    from operations.model.validation import HostContext, validate

    assert validate(cfg, HostContext("h", 8)) == []


def test_secret_names_are_one_rule_and_not_sglangs_token_counters(tmp_path):
    from operations.remote.common import secret_name

    assert all(map(secret_name, ("api_key", "admin_api_key", "--api-key", "ssl_keyfile_password", "watermark_key",
                                 "watermark_config", "hf_token", "--hf-token", "token", "access_token")))
    assert not any(map(secret_name, ("bucket_time_to_first_token", "kt_max_deferred_experts_per_token",
                                     "max_total_tokens", "tokenizer_path", "speculative_num_draft_tokens")))
    cfg = from_mapping({"model-path": "m", "ssl-keyfile-password": "hunter22", "bucket-time-to-first-token": [0.1],
                        "specops": {"env": {"TOKENIZERS_PARALLELISM": "false", "HF_TOKEN": "hf_x123"}}}, "t")
    assert cfg.is_secret("ssl_keyfile_password") and not cfg.is_secret("bucket_time_to_first_token")
    assert cfg.is_secret("HF_TOKEN") and not cfg.is_secret("TOKENIZERS_PARALLELISM")
    assert "hunter22" not in SGLANG.engine_yaml(cfg) and "ssl_keyfile_password" not in SGLANG.desired_view(cfg)


def test_secret_fields_may_be_spelled_as_flags():
    cfg = from_mapping({"model-path": "m", "chat-template": "t1", "specops": {"secret_fields": ["chat-template"]}}, "t")
    assert cfg.is_secret("chat_template") and "t1" not in SGLANG.engine_yaml(cfg)


def test_masking_values_with_spaces_lists_and_multiline_secrets(tmp_path):
    (tmp_path / "secrets.env").write_text("SPECOPS_SECRET_API_KEY='abcd efgh'\n"
                                          "export TLS_KEY='-----BEGIN KEY-----\nMIIEvQ\n-----END KEY-----'\n")
    out = server_dir.redactor(str(tmp_path))({
        "launch_command": "python3 -m sglang.launch_server --api-key abcd efgh --port 1",
        "argv": ["--api-key", "abc"], "note": "pem: -----BEGIN KEY-----\nMIIEvQ\n-----END KEY----- end"})
    assert out["launch_command"] == "python3 -m sglang.launch_server --api-key <secret> --port 1"
    assert out["argv"] == ["--api-key", "<secret>"] and out["note"] == "pem: <secret> end"


def test_sidecar_paths_and_broken_links(tmp_path):
    from operations.model.config import settings_path

    assert settings_path(tmp_path / "x.yml").name == "x.specops.yaml"
    assert settings_path(tmp_path / "x").name == "x.specops.yaml"
    (tmp_path / "x.yaml").write_text("model-path: m\n")
    (tmp_path / "x.specops.yaml").symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(ConfigError, match="is a broken link"):
        load(str(tmp_path / "x.yaml"))
    (tmp_path / "x.specops.yaml").unlink()
    (tmp_path / "x.specops.yml").write_text("gpus: [1]\n")
    with pytest.raises(ConfigError, match="are read from x.specops.yaml: rename it"):
        load(str(tmp_path / "x.yaml"))


def test_launch_env_orders_gpus_as_nvidia_smi_does_and_null_topology_is_an_issue(tmp_path):
    from operations.model.validation import validate

    cfg = from_mapping({"model-path": "m", "specops": {"gpus": [3]}}, "t")
    script = next(f for f in Supervisor("llm", str(tmp_path)).files(cfg) if f.path.endswith("launch.sh")).content
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in script and "export CUDA_VISIBLE_DEVICES=3" in script
    assert [str(i) for i in validate(from_mapping({"model-path": "m", "tp-size": None}, "t"))] == [
        "[*] tp-size: must be an integer, got null"]
