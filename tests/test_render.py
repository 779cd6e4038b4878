"""Rendered launch files: every value shell-quoted (tried with metacharacters, by running the script), secrets
kept out of the script and the unit, systemd unit and commands."""
import json
import os
import subprocess
import sys

import pytest
import yaml

from operations.model.config import from_mapping
from operations.model.engines import engine_for
from operations.controller.remote import readable
from operations.controller.supervisors import Supervisor, SystemdSupervisor

NASTY = ["a'b", 'x"; touch PWNED; echo "', "$(touch PWNED)", "`touch PWNED`", "a b\tc", "semi;colon&amp|pipe",
         "$HOME", "${HOME", "\\back\\slash", "new\nline", "*", "-dash"]
ECHO_ARGV = "import json, sys; json.dump(sys.argv[1:], open(sys.argv[0] + '.argv', 'w'))"


def launch(tmp_path, cfg, sup):
    """Write the rendered files like the operation does and run launch.sh with an argv-recording launcher."""
    for f in sup.files(cfg):
        path = tmp_path / os.path.basename(f.path)
        path.write_text(f.content)
        path.chmod(int(f.mode, 8))
    proc = subprocess.run(["sh", str(tmp_path / "launch.sh")], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / "rec.py.argv").read_text())


def flag_values(argv):
    """option -> value as the server sees them: the ``--config`` file's keys (read back with a YAML parser, as
    SGLang's loader does), then the command line's flags, which win."""
    values, rest = {}, list(argv)
    if "--config" in rest:
        i = rest.index("--config")
        with open(rest[i + 1]) as fh:
            values.update({f"--{k}": v for k, v in yaml.safe_load(fh).items()})
        del rest[i:i + 2]
    for i, arg in enumerate(rest):
        if arg.startswith("--"):
            values[arg] = rest[i + 1] if i + 1 < len(rest) and not rest[i + 1].startswith("--") else True
    return values


@pytest.mark.parametrize("value", NASTY)
def test_every_string_field_is_quoted(tmp_path, value):
    (tmp_path / "rec.py").write_text(ECHO_ARGV)
    data = {"model-path": value, "served-model-name": value, "speculative-algorithm": "EAGLE3",
            "speculative-draft-model-path": value, "speculative-num-steps": 3, "speculative-eagle-topk": 4,
            "speculative-num-draft-tokens": 16, "api-key": value, "chat-template": value,
            "specops": {"launcher": [sys.executable, str(tmp_path / "rec.py")], "env": {"HF_TOKEN": value,
                                                                                        "NOTE": value}}}
    cfg = from_mapping(data, "nasty")
    sup = Supervisor(tmp_path.name, str(tmp_path.parent))  # its directory is tmp_path
    argv = launch(tmp_path, cfg, sup)
    assert argv[:2] == ["--config", str(tmp_path / "engine.yaml")]
    values = flag_values(argv)
    assert values["--model-path"] == value and values["--served-model-name"] == value
    assert f"--api-key={value}" in argv  # on the command line, through secrets.env, as one element
    assert values["--chat-template"] == value
    assert not (tmp_path / "PWNED").exists() and not os.path.exists("PWNED")


def test_secret_stays_out_of_script_and_unit(tmp_path):
    cfg = from_mapping({"model-path": "m", "api-key": "s3cr3t-Zq9", "specops": {"env": {"HF_TOKEN": "hf_Zq9"}}}, "t")
    sup = SystemdSupervisor("llm", str(tmp_path))
    files = {os.path.basename(f.path): f for f in sup.files(cfg)}
    assert set(files) == {"engine.yaml", "launch.sh", "secrets.env", "specops-llm.service"}
    for name in ("engine.yaml", "launch.sh", "specops-llm.service"):
        assert "s3cr3t" not in files[name].content and "hf_Zq9" not in files[name].content
    assert files["secrets.env"].secret and files["secrets.env"].mode == "600"
    assert "SPECOPS_SECRET_API_KEY=s3cr3t-Zq9" in files["secrets.env"].content
    assert "export HF_TOKEN=hf_Zq9" in files["secrets.env"].content
    assert '--api-key="${SPECOPS_SECRET_API_KEY}"' in files["launch.sh"].content


def test_systemd_unit_and_commands(tmp_path):
    cfg = from_mapping({"model-path": "m", "port": 30001, "specops": {"stop_grace_s": 45}}, "t")
    sup = SystemdSupervisor("llm", "/var/lib/specops", "/opt/venv/bin/python")
    unit = next(f for f in sup.files(cfg) if f.path.endswith(".service"))
    assert unit.path == "/etc/systemd/system/specops-llm.service" and unit.mode == "644"
    lines = unit.content.splitlines()
    for expected in ("ExecStart=/bin/sh /var/lib/specops/llm/launch.sh", "KillMode=control-group",
                     "KillSignal=SIGTERM", "TimeoutStopSec=45", "Restart=no",
                     "StandardOutput=append:/var/lib/specops/llm/server.log", "WantedBy=multi-user.target"):
        assert expected in lines
    start = [readable(c.get_raw_value()) for c in sup.start(cfg)]
    assert start == ["systemctl daemon-reload", "systemctl start specops-llm.service",
                     f"/opt/venv/bin/python <server_ctl> record /var/lib/specops/llm {cfg.config_hash} specops-llm.service"]
    stop = readable(sup.stop(30.0)[0].get_raw_value())
    assert stop == "/opt/venv/bin/python <server_ctl> stop /var/lib/specops/llm 30.0 specops-llm.service"


def test_vllm_argv_has_speculative_config_json():
    cfg = from_mapping({"model": "meta-llama/Llama-3.1-8B-Instruct", "port": 8000,
                        "speculative-config": {"method": "eagle3", "model": "d", "num_speculative_tokens": 3},
                        "specops": {"engine": "vllm"}}, "v")
    argv = engine_for("vllm").argv(cfg)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    spec = argv[argv.index("--speculative-config") + 1]
    assert json.loads(spec) == {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}


def test_switch_flags_render_as_switches():
    cfg = from_mapping({"model-path": "m", "trust-remote-code": True, "enable-metrics": False}, "s")
    argv = engine_for("sglang").argv(cfg)
    assert "--trust-remote-code" in argv and "--enable-metrics" not in argv and "True" not in argv
