"""Config X: loading, secrets, and validation (every error listed, with field and host)."""
import pytest

from operations.model import config as configs
from operations.model.config import ServerConfig, from_mapping
from operations.model.validation import HostContext, validate
from operations.errors import ConfigError

from conftest import REPO

EAGLE3 = {"model-path": "meta-llama/Llama-3.1-8B-Instruct", "speculative-algorithm": "EAGLE3",
          "speculative-draft-model-path": "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B",
          "speculative-num-steps": 3, "speculative-eagle-topk": 4, "speculative-num-draft-tokens": 16}


def issues(data, ctx=HostContext("gpu-a", 8)):
    return [str(i) for i in validate(from_mapping(data, "t"), ctx)]


@pytest.mark.parametrize("name", ["eagle3-llama3.1-8b", "baseline-llama3.1-8b", "vllm-eagle3-llama3.1-8b"])
def test_shipped_configs_are_valid(name):
    cfg = configs.load(name, REPO / "configs")
    assert validate(cfg, HostContext("h", 8)) == []
    assert cfg.speculative == ("baseline" not in name)


def test_flag_spellings_are_one_key():
    cfg = from_mapping({"model": "m", "tp_size": 2, "speculative-eagle-topk": 4}, "t")
    assert set(cfg.args) == {"model_path", "tp_size", "speculative_eagle_topk"}
    with pytest.raises(ConfigError, match="given twice"):
        from_mapping({"model": "m", "model-path": "m"}, "t")


def test_unknown_flag_bad_choice_bad_type_all_listed():
    got = issues({"model-path": "m", "cuda-graph-max-bs": 8, "dtype": "fp7", "tp-size": "two"})
    assert got == ["[gpu-a] cuda-graph-max-bs: unknown flag for SGLang 0.5.23",
                   "[gpu-a] dtype: 'fp7' is not one of ['auto', 'half', 'float16', 'bfloat16', 'float', 'float32']",
                   "[gpu-a] tp-size: must be an integer, got 'two'"]


def test_eagle_without_draft_model_is_refused_with_the_reason():
    got = issues({k: v for k, v in EAGLE3.items() if k != "speculative-draft-model-path"})
    assert got == ["[gpu-a] speculative-draft-model-path: required for EAGLE3: without it SGLang drafts with the "
                   "target model itself and crashes after loading the weights twice"]


def test_tree_settings_as_sglangs_resolver_takes_them():
    # topk 1 with other draft tokens: SGLang sets steps + 1, and the desired view says so (no error)
    assert issues({**EAGLE3, "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 8}) == []
    # all three omitted: SGLang chooses them for the model
    assert issues({k: v for k, v in EAGLE3.items() if not k.startswith(("speculative-num", "speculative-eagle"))}) == []
    # one of steps / topk without the other: SGLang's resolver crashes (TypeError / AssertionError)
    assert issues({**EAGLE3, "speculative-num-steps": None}) == [
        "[gpu-a] speculative-num-steps: required for EAGLE3 once any of steps / topk / draft tokens is set "
        "(SGLang's resolver crashes without it); or omit all three and SGLang chooses them for the model"]
    assert issues({**EAGLE3, "speculative-num-draft-tokens": None}) == [
        "[gpu-a] speculative-num-draft-tokens: required for EAGLE3 when speculative-eagle-topk is > 1 "
        "(SGLang has no default for a tree)"]
    assert issues({"model-path": "m", "speculative-num-steps": 3}) == [
        "[gpu-a] speculative-num-steps: set without speculative-algorithm (it would be ignored)"]
    assert issues({**EAGLE3, "speculative-algorithm": "MEDUSA"}) == [
        "[gpu-a] speculative-algorithm: 'MEDUSA' is not one of ['EAGLE', 'EAGLE3', 'NEXTN', 'STANDALONE', 'NGRAM', "
        "'DFLASH', 'UNO', 'DSPARK', 'FROZEN_KV_MTP'] (any case)"]
    assert issues({**EAGLE3, "speculative-algorithm": "eagle3"}) == []  # SGLang upper-cases it


def test_tp_dp_against_host_gpus_and_ports_and_nodes():
    got = issues({**EAGLE3, "tp-size": 4, "dp-size": 4, "port": 70000, "nnodes": 2, "node-rank": 3},
                 HostContext("gpu-b", 4, group_size=3))
    assert got == ["[gpu-b] port: port must be an integer 1-65535, got 70000",
                   "[gpu-b] tp-size: tp-size 4 x dp-size 4 / nnodes 2 needs 8 GPU(s) (up to index 7); host has 4",
                   "[gpu-b] nnodes: 2 but the inventory group serving this model has 3 host(s)",
                   "[gpu-b] node-rank: 3 is outside 0..1",
                   "[gpu-b] dist-init-addr: required when nnodes > 1 (rank 0's address:port)"]
    assert issues({"model-path": "m", "mem-fraction-static": 1.5}) == [
        "[gpu-a] mem-fraction-static: must be between 0 and 1, got 1.5"]
    assert issues({"model-path": "m", "trust-remote-code": "yes"}) == [
        "[gpu-a] trust-remote-code: is a switch: true or false, got 'yes'"]


def test_specops_section_and_env_refs():
    with pytest.raises(ConfigError) as err:
        from_mapping({"model-path": "m", "api-key": "${NOPE_KEY}", "specops": {"engine": "trt", "colour": 1}}, "t",
                     environ={})
    text = str(err.value)
    assert "specops.colour: unknown specops key" in text and "specops.engine: 'trt' is not one of" in text
    assert "api-key: environment variable NOPE_KEY is not set on the controller" in text


def test_secrets_are_masked_and_hashed_not_exposed():
    cfg = from_mapping({"model-path": "m", "api-key": "${K}", "specops": {"env": {"HF_TOKEN": "hf_abc",
                                                                              "NCCL_DEBUG": "WARN"}}},
                       "t", environ={"K": "s3cr3t"})
    assert cfg.args["api_key"] == "s3cr3t" and cfg.masked_args()["api_key"] == "<secret>"
    assert cfg.is_secret("HF_TOKEN") and not cfg.is_secret("NCCL_DEBUG")
    assert "s3cr3t" not in repr(cfg.restart_identity()) and "hf_abc" not in repr(cfg.restart_identity())
    other = from_mapping({"model-path": "m", "api-key": "other", "specops": {"env": {"HF_TOKEN": "hf_abc",
                                                                             "NCCL_DEBUG": "WARN"}}}, "t")
    assert other.config_hash != cfg.config_hash  # a new key restarts the server


def test_missing_config_name_lists_known(tmp_path):
    (tmp_path / "a.yaml").write_text("model-path: m\n")
    with pytest.raises(ConfigError, match="no config 'b'.*known: a"):
        configs.load("b", tmp_path)
    (tmp_path / "bad.yaml").write_text("model-path: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        configs.load("bad", tmp_path)


def test_vllm_speculative_config_rules():
    base = {"model": "m", "specops": {"engine": "vllm"}}
    v = lambda spec: issues({**base, "speculative-config": spec})  # noqa: E731
    assert v({"method": "eagle3", "num_speculative_tokens": 3}) == [
        "[gpu-a] speculative-config.model: required for method eagle3"]
    assert v({"method": "ngram", "num_speculative_tokens": 4}) == [
        "[gpu-a] speculative-config.prompt_lookup_max: required for ngram (an integer >= 1)"]
    assert v({"method": "mtp", "num_speculative_tokens": 0}) == [
        "[gpu-a] speculative-config.num_speculative_tokens: must be an integer >= 1, got 0"]
    assert v({"method": "medusa2", "num_speculative_tokens": 1}) == [
        "[gpu-a] speculative-config.method: 'medusa2' is not one of ['eagle', 'eagle3', 'ngram', 'mtp', 'draft_model']"]
    assert issues({**base, "tensor-parallel-size": 16}) == ["[gpu-a] tensor-parallel-size: needs 16 GPU(s); host has 8"]


def test_python_object_config():
    cfg = ServerConfig(name="py", args={"model_path": "m", "port": 31000})
    assert cfg.port == 31000 and cfg.launcher == ("python3", "-m", "sglang.launch_server")
    assert validate(cfg) == []


def test_every_error_is_listed_even_when_several_rules_fail():
    got = issues({"model-path": "m", "speculative-algorithm": "EAGLE3", "speculative-num-steps": 3,
                  "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 8, "tp-size": 16, "dtype": "fp7",
                  "port": 99999}, HostContext("gpu-c", 2))
    assert len(got) == 4, got
    assert any("speculative-draft-model-path: required" in g for g in got)


def test_inventory_check_lists_errors_for_every_host():
    from operations.server import check_inventory

    class H:
        def __init__(self, name, gpus):
            self.name, self.data = name, {"gpu_count": gpus}

    bad = {**EAGLE3, "tp-size": 4}
    with pytest.raises(ConfigError) as err:
        check_inventory(from_mapping(bad, "t"), [H("node-a", 2), H("node-b", 8), H("node-c", 1)])
    text = str(err.value)
    assert "2 config error(s)" in text and "[node-a] tp-size" in text and "[node-c] tp-size" in text
    assert "node-b" not in text
    assert check_inventory(from_mapping(EAGLE3, "t"), [H("node-a", 1)]).name == "t"


def test_env_names_validated_and_env_sourced_values_secret():
    with pytest.raises(ConfigError, match="specops.env.A=1; curl x: not a valid environment variable name"):
        from_mapping({"model-path": "m", "specops": {"env": {"A=1; curl x": "v"}}}, "t")
    cfg = from_mapping({"model-path": "m", "chat-template": "${TPL}", "specops": {"env": {"HF_HUB_AUTH": "${T}"}}},
                       "t", environ={"T": "hf_x", "TPL": "t"})
    assert cfg.is_secret("HF_HUB_AUTH") and cfg.is_secret("chat_template")


def test_secret_with_quote_round_trips_through_secrets_env(tmp_path):
    from operations.remote.server_dir import secret
    from operations.controller.supervisors import secrets_env

    cfg = from_mapping({"model-path": "m", "api-key": "a'b\"c $d"}, "t")
    (tmp_path / "secrets.env").write_text(secrets_env(cfg))
    assert secret(str(tmp_path), "SPECOPS_SECRET_API_KEY") == "a'b\"c $d"
