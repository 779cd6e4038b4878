"""Adaptive EAGLE-3 as a config X: SGLang's adaptive table checked before any host is touched (as SGLang 0.5.23 reads
it, stricter where SGLang would fail later or silently), shipped beside the launch files, part of the config's
version; adaptive's own constraints refused with a reason. The real SGLang cross-check of the table rules is in
test_real_sglang.py (``test_adaptive_table_rules_are_sglangs``)."""
import json
import re
import urllib.request

import pytest
import yaml

from conftest import REPO, run_pyinfra, shipped
from operations.controller.supervisors import Supervisor
from operations.errors import ConfigError
from operations.model import config as configs
from operations.model.engines import adaptive, engine_for
from operations.model.validation import validate

TUNED = "eagle3-adaptive-tuned-llama3.1-8b"


def write_config(tmp_path, table, **changes):
    """The tuned adaptive config in ``tmp_path`` with ``table`` (a mapping, or raw text) as its adaptive JSON."""
    data = {**shipped(TUNED), **changes}
    (tmp_path / "adaptive").mkdir(exist_ok=True)
    text = table if isinstance(table, str) else json.dumps(table)
    (tmp_path / "adaptive" / "llama3.1-8b.json").write_text(text)
    path = tmp_path / f"{TUNED}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def refusal(path) -> list[str]:
    with pytest.raises(ConfigError) as err:
        configs.load(str(path))
    return [f"{i.field}: {i.message}" for i in err.value.issues]


def issues_of(path) -> list[str]:
    """What a run refuses the config for before contact: loading's errors, else validation's (check_inventory)."""
    try:
        found = validate(configs.load(str(path)))
    except ConfigError as exc:
        found = exc.issues
    return [f"{i.field}: {i.message}" for i in found]


GOOD = json.loads((REPO / "configs" / "adaptive" / "llama3.1-8b.json").read_text())


@pytest.mark.parametrize("table, expected", [
    ({"ema_alpha": 0.2}, 'needs at least one batch-size key, e.g. {"1": {"candidate_steps": [1, 3, 5]}}'),
    ({"1": {"candidate_steps": []}}, 'batch size "1": candidate_steps must be a non-empty list of non-negative '
                                     'integers (0 = no drafting), got []'),
    ({"1": {"candidate_steps": [1, -1]}}, "got [1, -1]"),
    ({"1": {"candidate_steps": [1, 2.5]}}, "got [1, 2.5]"),
    ({"1": {"candidate_steps": [True, 3]}}, "got [True, 3]"),
    ({"1": {"candidate_steps": "1,3"}}, "got '1,3'"),
    ({"1": {}}, "got None"),
    ({"1": [1, 3]}, 'batch size "1": must be a mapping with candidate_steps, got list'),
    ({**GOOD, "l6": {"candidate_steps": [0]}}, "'l6' is neither a batch size (digits, e.g. \"8\") nor a setting"),
    ({**GOOD, "update_interval": 0}, "update_interval must be an integer >= 1, got 0"),
    ({**GOOD, "ema_alpha": 1.5}, "ema_alpha must be a number in (0, 1], got 1.5"),
    ({"1": {"candidate_steps": [1, 3], "warmup": 3}}, "'warmup' is not a slot setting"),
    ("{not json", "is not JSON"),
    ("[1, 3]", "must be a JSON object of batch-size keys, got list"),
])
def test_a_bad_adaptive_table_is_refused_before_any_host_is_touched(tmp_path, table, expected):
    problems = refusal(write_config(tmp_path, table))
    assert any(p.startswith("speculative-adaptive-config: adaptive/llama3.1-8b.json: ") and expected in p
               for p in problems), problems


def test_a_missing_or_unreadable_table_is_named(tmp_path):
    path = write_config(tmp_path, GOOD)
    (tmp_path / "adaptive" / "llama3.1-8b.json").unlink()
    (problem,) = refusal(path)
    assert problem == (f"speculative-adaptive-config: {tmp_path / 'adaptive' / 'llama3.1-8b.json'}: no such file "
                       f"(a relative path is read beside the config)")
    (tmp_path / "adaptive" / "llama3.1-8b.json").mkdir()
    assert "is a directory" in refusal(path)[0]


def test_a_relative_table_in_a_python_config_is_refused_and_an_absolute_one_is_the_hosts():
    data = shipped(TUNED)
    with pytest.raises(ConfigError) as err:
        configs.from_mapping(data, TUNED)
    assert "'adaptive/llama3.1-8b.json' is relative: give an absolute path on the host" in str(err.value)
    on_host = configs.from_mapping({**data, "speculative-adaptive-config": "/etc/sglang/adaptive.json"}, TUNED)
    assert on_host.shipped == () and on_host.args["speculative_adaptive_config"] == "/etc/sglang/adaptive.json"
    files = Supervisor("llm", "/var/lib/specops").files(on_host)
    assert [f.path for f in files if f.path.endswith(".json")] == []
    assert "speculative-adaptive-config: /etc/sglang/adaptive.json" in files[0].content


def test_steps_outside_the_tables_candidates_are_refused(tmp_path):
    problems = issues_of(write_config(tmp_path, {"1": {"candidate_steps": [1, 2]}, "8": {"candidate_steps": [0]}}))
    assert problems == ["speculative-num-steps: 3 is not one of the adaptive candidate steps [0, 1, 2] "
                        "(SGLang refuses to start)"], problems


@pytest.mark.parametrize("change, expected", [
    ({"speculative-algorithm": "NGRAM", "speculative-draft-model-path": None},
     "adaptive speculation needs EAGLE / EAGLE3 / NEXTN, not NGRAM"),
    ({"speculative-eagle-topk": 4, "speculative-num-draft-tokens": 8}, "adaptive speculation needs speculative-eagle-topk 1"),
    ({"enable-dp-attention": True, "dp-size": 2, "tp-size": 2}, "adaptive speculation does not work with attention DP"),
    ({"enable-multi-layer-eagle": True}, "adaptive speculation does not work with multi-layer EAGLE"),
    ({"enable-two-batch-overlap": True}, "adaptive speculation does not work with two-batch overlap"),
    ({"enable-pdmux": True}, "adaptive speculation does not work with PD multiplexing"),
])
def test_adaptive_where_sglang_would_turn_it_off_is_an_error(tmp_path, change, expected):
    data = {k: v for k, v in {**shipped(TUNED), **change}.items() if v is not None}
    path = write_config(tmp_path, GOOD)
    path.write_text(yaml.safe_dump(data))
    messages = issues_of(path)
    assert f"speculative-adaptive: {expected}; SGLang would silently run without it" in messages, messages


def test_the_table_ships_beside_the_launch_files_and_its_content_is_the_configs_version(tmp_path):
    cfg = configs.load(str(write_config(tmp_path, GOOD)))
    files = {f.path: f for f in Supervisor("llm", "/var/lib/specops").files(cfg)}
    table = files["/var/lib/specops/llm/adaptive-config.json"]
    assert json.loads(table.content) == GOOD and table.mode == "600" and not table.secret
    engine_yaml = yaml.safe_load(files["/var/lib/specops/llm/engine.yaml"].content)
    assert engine_yaml["speculative-adaptive-config"] == "/var/lib/specops/llm/adaptive-config.json"
    # where the host keeps it is not the version; what it says is
    assert cfg.placed("/elsewhere").config_hash == cfg.config_hash
    other = configs.load(str(write_config(tmp_path, {**GOOD, "1": {"candidate_steps": [1, 3]}})))
    assert other.config_hash != cfg.config_hash
    assert "speculative_adaptive_config" not in engine_for("sglang").compared(cfg)  # the path differs per host


def test_steps_default_to_the_middle_of_the_shipped_tables_candidates(tmp_path):
    data = {k: v for k, v in shipped(TUNED).items() if k != "speculative-num-steps"}
    path = write_config(tmp_path, {"1": {"candidate_steps": [2, 4, 6]}, "16": {"candidate_steps": [0]}})
    path.write_text(yaml.safe_dump(data))
    view = engine_for("sglang").desired_view(configs.load(str(path)))
    assert (view["speculative_num_steps"], view["speculative_eagle_topk"], view["speculative_num_draft_tokens"]) \
        == (4, 1, 5)  # candidates [0, 2, 4, 6]: the middle is index 2, as SGLang picks it
    builtin = engine_for("sglang").desired_view(configs.load("eagle3-adaptive-llama3.1-8b", search=REPO / "configs"))
    assert builtin["speculative_num_steps"] == adaptive.DEFAULT_STEPS[len(adaptive.DEFAULT_STEPS) // 2] == 3


def _server_info(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as r:
        return json.loads(r.read())


def test_adaptive_configs_converge_rerun_unchanged_and_a_changed_table_restarts(server_sim, configs):
    sim, tuned = server_sim, configs[TUNED]
    first = run_pyinfra(sim, "--data", f"config={tuned}")
    assert first.rc == 0 and "config confirmed" in first.out, first
    on_host = sim.root / "servers" / "llm" / "adaptive-config.json"
    assert json.loads(on_host.read_text()) == GOOD and on_host.stat().st_mode & 0o777 == 0o600
    info = _server_info(configs["port"])
    assert (info["speculative_adaptive"], info["speculative_adaptive_config"], info["speculative_num_steps"]) \
        == (True, str(on_host), 3)
    (pid,) = [s["pid"] for s in sim.servers() if s.get("status") == "running"]

    again = run_pyinfra(sim, "--data", f"config={tuned}")
    assert again.rc == 0 and "No changes" in again.out, again

    table = tuned.parent / "adaptive" / "llama3.1-8b.json"
    old = '"1": {"candidate_steps": [1, 3, 5], "down_hysteresis": -0.25}'
    assert old in table.read_text()
    table.write_text(table.read_text().replace(old, '"1": {"candidate_steps": [1, 3, 7]}'))
    dry = run_pyinfra(sim, "--data", f"config={tuned}", "--dry", "--diff")
    assert dry.rc == 0 and f"Will modify {on_host}" in dry.out, dry
    assert re.search(r'\+.*"1": \{"candidate_steps": \[1, 3, 7\]\}', dry.out), dry  # --diff: the table's line
    changed = run_pyinfra(sim, "--data", f"config={tuned}")
    assert changed.rc == 0 and "config changed" in changed.out, changed
    assert json.loads(on_host.read_text())["1"] == {"candidate_steps": [1, 3, 7]}
    assert [s["pid"] for s in sim.servers() if s.get("status") == "running"] != [pid]

    builtin = run_pyinfra(sim, "--data", f"config={configs['eagle3-adaptive-llama3.1-8b']}")
    assert builtin.rc == 0 and "config confirmed" in builtin.out, builtin
    info = _server_info(configs["port"])
    assert info["speculative_adaptive"] is True and info["speculative_adaptive_config"] is None


def test_shipped_adaptive_table_is_valid():
    assert adaptive.parse((REPO / "configs" / "adaptive" / "llama3.1-8b.json").read_text())[1] == []
    assert shipped(TUNED)["speculative-adaptive-config"] == "adaptive/llama3.1-8b.json"
