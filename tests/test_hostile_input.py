"""Hostile input: every bad value becomes a clear ConfigError (``[host] field: message``) before any host is
contacted; never a traceback, never a hang, never the content of a file that is not a config.

Through the real pyinfra CLI wherever the value comes in through it (``--data``, operation arguments, config
files), with the spy interpreter of test_fault_matrix proving that no specops fact or script ran on the host;
unit tests for what only Python callers can pass (``float('nan')``, a list)."""
import math
import os
import subprocess
import time

import pytest

from conftest import needs_root, run_pyinfra
from operations.model import config as configs
from operations import gpu
from operations.model import hostdata
from operations.model.config import from_mapping
from operations.model.validation import validate
from operations.errors import ConfigError
from operations.controller.idle_converge import Timing
from test_fault_matrix import _listed, assert_untouched, python_spy, shipped, write_config  # noqa: F401

SECRET_HASH = "$6$saltsalt$Qx9hashofrootpasswordZz"
SHADOW = (f"root:{SECRET_HASH}:19000:0:99999:7:::\n"
          "daemon:*:19000:0:99999:7:::\n"
          "alice:$6$pepper$AnotherSecretHashValue0:19000:0:99999:7:::\n")


class FakeHost:
    """Enough of a pyinfra host for the readers: a name and its data."""

    def __init__(self, **data):
        self.name, self.data = "gpu-a", data


def guarded(sim, python_spy):
    """A holder any change would stop, the snapshot to compare with, and the spy's --data argument."""
    spy, calls = python_spy
    holder = sim.hold([0], 1000)
    return holder, sim.snapshot().procs, ["--data", f"specops_python={spy}"], calls


def assert_refused(run, *fragments, errors=1):
    """A clean ConfigError: non-zero exit, every fragment listed, the count, and no traceback."""
    assert run.rc != 0, run
    assert f"{errors} config error(s)" in run.out, run
    for fragment in fragments:
        assert fragment in run.out, (fragment, run)
    assert "Traceback" not in run.out and "An internal exception occurred" not in run.out, run


# --- 1. numbers: nan, inf, junk, negative ------------------------------------------------------------------

@pytest.mark.parametrize("data, listed", [
    ("grace_s=nan", "[@local] grace_s: must be a finite number >= 0, got 'nan'"),
    ("grace_s=NaN", "[@local] grace_s: must be a finite number >= 0, got nan"),  # JSON: a float nan
    ("deadline_s=inf", "[@local] deadline_s: must be a finite number >= 0, got 'inf'"),
    ("deadline_s=Infinity", "[@local] deadline_s: must be a finite number >= 0, got inf"),
    ("grace_s=abc", "[@local] grace_s: must be a finite number >= 0, got 'abc'"),
    ("grace_s=-1", "[@local] grace_s: must be a finite number >= 0, got -1"),
    ("specops_lock_wait_s=nan", "[@local] specops_lock_wait_s: must be a finite number >= 0, got 'nan'"),
    ("gpus=0,x", "[@local] gpus: '0,x': use comma-separated distinct GPU indices"),
], ids=["nan", "json-nan", "inf", "json-inf", "junk", "negative", "lock-wait", "gpus"])
def test_bad_number_in_host_data_is_a_config_error_before_any_host_command(data, listed, sim, python_spy):
    holder, before, spy, calls = guarded(sim, python_spy)
    run = run_pyinfra(sim, "--data", "config=none", "--data", data, *spy)
    assert_refused(run, listed)
    assert_untouched(sim, calls, holder, before)


def test_every_bad_host_data_value_is_listed_in_one_run(sim, python_spy):
    holder, before, spy, calls = guarded(sim, python_spy)
    run = run_pyinfra(sim, "--data", "config=none", "--data", "grace_s=abc", "--data", "deadline_s=inf",
                      "--data", "force=maybe", "--data", "users=", *spy)
    assert_refused(run, "[@local] grace_s: must be a finite number >= 0, got 'abc'",
                   "[@local] deadline_s: must be a finite number >= 0, got 'inf'",
                   "[@local] users: must be comma-separated names or patterns",
                   "[@local] force: must be true or false (also 1/0, yes/no, on/off), got 'maybe'", errors=4)
    assert_untouched(sim, calls, holder, before)


def test_bad_number_with_a_server_config_stops_nothing(server_sim, configs, python_spy):
    holder, before, spy, calls = guarded(server_sim, python_spy)
    run = run_pyinfra(server_sim, "--data", f"config={configs['baseline-llama3.1-8b']}", "--data", "grace_s=nan",
                      *spy)
    assert_refused(run, "[@local] grace_s: must be a finite number >= 0, got 'nan'")
    assert_untouched(server_sim, calls, holder, before)


def test_gpu_idle_operation_refuses_nan_and_inf_timings(sim, python_spy):
    holder, before, spy, calls = guarded(sim, python_spy)
    run = run_pyinfra(sim, "grace_s=NaN", "deadline_s=Infinity", *spy, deploy="operations.gpu.idle")
    assert_refused(run, "[@local] grace_s: must be a finite number >= 0, got nan",
                   "[@local] deadline_s: must be a finite number >= 0, got inf", errors=2)
    assert_untouched(sim, calls, holder, before)


@pytest.mark.parametrize("field", ["grace_s", "deadline_s", "stable_s", "poll_s", "progress_s"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_timing_refuses_non_finite_values(field, value):
    with pytest.raises(ValueError, match="timings must be finite numbers"):
        Timing(**{field: value})


def test_sweep_lists_every_bad_workload_value_before_any_host_command(sim, python_spy, tmp_path):
    holder, before, spy, calls = guarded(sim, python_spy)
    results = tmp_path / "results"
    run = run_pyinfra(sim, "--data", "concurrency=1,x", "--data", "num_prompts=abc", "--data", "input_len=0",
                      "--data", "output_len=nan", "--data", "timeout_s=inf", "--data", f"results={results}",
                      *spy, deploy="sweep.py")
    assert_refused(run, "[@local] concurrency: must be comma-separated integers >= 1, e.g. 1,2,4, got '1,x'",
                   "[@local] num_prompts: must be an integer >= 1, got 'abc'",
                   "[@local] input_len: must be an integer >= 1, got 0",
                   "[@local] output_len: must be an integer >= 1, got 'nan'",
                   "[@local] timeout_s: must be a finite number >= 1, got 'inf'", errors=5)
    assert_untouched(sim, calls, holder, before)
    assert not results.exists()


def test_host_data_readers():
    h = FakeHost(a="1.5", b=2, c="nan", d="0,1", e=[3], f="root, alice,", g="no", h=1, i="-0.0", j=True)
    assert hostdata.number(h, "a", 0) == 1.5 and hostdata.number(h, "b", 0) == 2.0
    assert hostdata.number(h, "missing", 10) == 10.0 and hostdata.number(h, "i", 1) == 0.0
    assert hostdata.indices(h, "d") == [0, 1] and hostdata.indices(h, "e") == [3] and hostdata.indices(h, "x") is None
    assert hostdata.indices(h, "b") == [2]  # --data gpus=2 arrives as the int 2
    assert hostdata.patterns(h, "f") == ["root", "alice"] and hostdata.patterns(h, "e2", ["x"]) == ["x"]
    assert hostdata.flag(h, "g") is False and hostdata.flag(h, "h") is True and hostdata.flag(h, "x") is False
    assert hostdata.integers(h, "d", "9", low=0) == [0, 1] and hostdata.integer(h, "x", None) is None
    assert hostdata.lock_wait_s(h) == 300.0 and hostdata.lock_wait_s(FakeHost(specops_lock_wait_s="5")) == 5.0
    for read, key in ((hostdata.number, "c"), (hostdata.number, "j"), (hostdata.integer, "a"),
                      (hostdata.flag, "b"), (hostdata.lock_wait_s, None)):
        with pytest.raises(ConfigError, match=r"\[gpu-a\]"):
            read(FakeHost(specops_lock_wait_s=math.inf)) if key is None else read(h, key, 0)
    with pytest.raises(ConfigError, match=r"\[gpu-a\] gpus: '0,0': use comma-separated distinct GPU indices"):
        hostdata.indices(FakeHost(gpus="0,0"), "gpus")


def test_specops_section_refuses_nan_and_inf(sim, python_spy, tmp_path):
    holder, before, spy, calls = guarded(sim, python_spy)
    path = write_config(tmp_path, "nan", "model-path: m\nspecops:\n  ready_timeout_s: .nan\n  stop_grace_s: .inf\n"
                                         "  min_accept_length: .inf\n  gpus: [.nan]\n")
    run = run_pyinfra(sim, "--data", f"config={path}", *spy)
    assert_refused(run, "[*] specops.ready_timeout_s: must be a finite number > 0, got nan",
                   "[*] specops.stop_grace_s: must be a finite number >= 0, got inf",
                   "[*] specops.min_accept_length: must be a finite number >= 0, got inf",
                   "[*] specops.gpus: must be a list of distinct GPU indices (integers >= 0), got [nan]", errors=4)
    assert_untouched(sim, calls, holder, before)


# --- 2. list-valued data: split on commas everywhere ---------------------------------------------------------

def test_user_and_name_patterns_split_on_commas_like_gpu_lists():
    assert gpu.as_patterns("root,alice") == ("root", "alice") and gpu.as_patterns("root") == ("root",)
    assert gpu.as_patterns(["root,x", "alice"]) == ("root,x", "alice")  # a Python list passes through
    assert gpu.as_patterns(None) is None and gpu.as_patterns(" root , *sglang* ") == ("root", "*sglang*")


@needs_root
def test_users_list_from_the_cli_is_split_so_a_second_user_may_be_stopped(sim):
    holder = sim.hold([1], 2000, user="nobody")
    blocked = run_pyinfra(sim, "--data", "config=none", "--data", "users=root")
    assert blocked.rc != 0 and "blocked: GPU 1 held by processes" in blocked.out, blocked
    assert "Nothing was signalled" in blocked.out and holder.alive(), blocked
    stopped = run_pyinfra(sim, "--data", "config=none", "--data", "users=root,nobody")
    assert stopped.rc == 0 and "idle: GPU 0,1,2,3 idle" in stopped.out, stopped
    assert not holder.alive() and "Traceback" not in stopped.out


# --- 3. config files that are not configs -------------------------------------------------------------------

def refused_file(sim, python_spy, path, *fragments, errors=1):
    holder, before, spy, calls = guarded(sim, python_spy)
    run = run_pyinfra(sim, "--data", f"config={path}", *spy)
    assert_refused(run, *fragments, errors=errors)
    assert_untouched(sim, calls, holder, before)
    return run


def test_duplicate_keys_are_listed_with_both_lines(sim, python_spy, tmp_path):
    path = write_config(tmp_path, "dup", "model-path: m\nport: 30001\ntp-size: 1\nport: 30002\n"
                                         "specops:\n  ready_timeout_s: 30\n  engine: sglang\n  ready_timeout_s: 5\n")
    refused_file(sim, python_spy, path, f"[*] port: given twice in {path} (lines 2 and 4)",
                 f"[*] specops.ready_timeout_s: given twice in {path} (lines 6 and 8)", errors=2)


def test_a_directory_as_config_is_refused(sim, python_spy, tmp_path):
    folder = tmp_path / "configs.d"
    folder.mkdir()
    refused_file(sim, python_spy, f"{folder}/", f"[*] config: {folder}: is a directory, not a YAML config file")


def test_a_non_utf8_file_names_the_byte_offset(sim, python_spy, tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"model-path: m\nserved-model-name: caf\xe9\n")
    refused_file(sim, python_spy, path, f"[*] config: {path}: is not UTF-8 text (invalid byte at offset 36)")


def test_a_huge_file_is_refused_by_its_size_without_reading_it(sim, python_spy, tmp_path):
    path = tmp_path / "huge.yaml"
    subprocess.run(["truncate", "-s", "58M", str(path)], check=True)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="is 60817408 bytes; a config may have at most 1048576"):
        configs.load(str(path))
    assert time.monotonic() - t0 < 0.5
    refused_file(sim, python_spy, path, f"[*] config: {path}: is 60817408 bytes; a config may have at most 1048576")


@pytest.mark.parametrize("text", ["", "# nothing but a comment\n\n"], ids=["zero-bytes", "comment-only"])
def test_an_empty_file_is_refused(text, sim, python_spy, tmp_path):
    path = write_config(tmp_path, "empty", text)
    refused_file(sim, python_spy, path, f"[*] config: {path}: is empty")


def test_a_shadow_like_file_is_refused_without_echoing_any_of_it(sim, python_spy, tmp_path):
    path = tmp_path / "shadow"
    path.write_text(SHADOW)
    # each line ends in ':', so YAML reads it as a mapping of three keys: refused by the shape of its keys
    run = refused_file(sim, python_spy, path, f"[*] <file>: {path}: not a config: the key(s) on line(s) 1, 2, 3 "
                                              f"cannot be flag names (not shown: the file may be any file)")
    assert SECRET_HASH not in run.out and "saltsalt" not in run.out and "AnotherSecret" not in run.out, run
    assert "unknown flag" not in run.out, run


def test_a_yaml_list_is_refused_before_any_flag_error(sim, python_spy, tmp_path):
    path = write_config(tmp_path, "list", f"- model-path: m\n- {SECRET_HASH}\n")
    run = refused_file(sim, python_spy, path, f"[*] <file>: {path}: expected a mapping of flags, got list")
    assert SECRET_HASH not in run.out, run


@pytest.mark.parametrize("text, where", [
    (f"model-path: m\napi-key: {SECRET_HASH}: [\n", "line 2, column"),
    (f"model-path: m\n\tapi-key: {SECRET_HASH}\n", "line 2, column 1"),
    (f"model-path: *{SECRET_HASH[3:11]}\n", "line 1, column 13"),  # an undefined alias: its name is blanked
    (f"model-path: \"{SECRET_HASH}\\q\"\n", "line 1, column"),
], ids=["syntax", "tab", "alias", "escape"])
def test_yaml_syntax_errors_give_line_and_column_never_the_line(text, where, sim, python_spy, tmp_path):
    path = write_config(tmp_path, "broken", text)
    run = refused_file(sim, python_spy, path, f"[*] config: {path}: invalid YAML at {where}")
    assert SECRET_HASH not in run.out and SECRET_HASH[3:11] not in run.out, run


def test_unreadable_files_in_python(tmp_path):
    """The same rules for callers of configs.load (sweep, server.running with a path)."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is not a regular file"):
        configs.load(str(fifo))  # a FIFO would block a read forever
    (tmp_path / "ctl.yaml").write_text("model-path: m\x00\n")
    with pytest.raises(ConfigError, match=r"invalid YAML: character #x0000 at offset 13"):
        configs.load(str(tmp_path / "ctl.yaml"))
    (tmp_path / "merge.yaml").write_text("model-path: m\nspecops:\n  <<: {ready_timeout_s: 5, stop_grace_s: 3}\n"
                                         "  ready_timeout_s: 40\n")  # a merge key overridden: no duplicate
    cfg = configs.load(str(tmp_path / "merge.yaml"))
    assert (cfg.ready_timeout_s, cfg.stop_grace_s) == (40, 3)


# --- 4. api keys that cannot be an HTTP header value ---------------------------------------------------------

@pytest.mark.parametrize("key, kind", [
    ("sk-live\nX-Injected: 1", "a newline (LF)"),
    ("sk-live\rX", "a carriage return (CR)"),
    ("sk-live\x07", "a control character (0x07)"),
    ("sk-l\u00efve", "a non-ASCII character"),
], ids=["newline", "cr", "bell", "non-ascii"])
def test_api_key_from_the_environment_that_no_header_can_carry_is_refused(key, kind, sim, python_spy, configs,
                                                                          tmp_path, monkeypatch):
    monkeypatch.setenv("SPECOPS_HI_API_KEY", key)
    data = shipped(configs)
    data["api-key"] = "${SPECOPS_HI_API_KEY}"
    path = write_config(tmp_path, "key", data)
    run = refused_file(sim, python_spy, path, f"[@local] api-key: contains {kind}, which an HTTP header value "
                                              f"cannot carry; not shown, as it is a secret")
    assert "sk-l" not in run.out and "Injected" not in run.out, run


def test_admin_api_key_with_nul_and_vllm_api_key_are_checked_too():
    got = [str(i) for i in validate(from_mapping({"model-path": "m", "admin-api-key": "ab\x00cd"}, "t"))]
    assert got == ["[*] admin-api-key: contains a NUL character, which an HTTP header value cannot carry; "
                   "not shown, as it is a secret"]
    vllm = from_mapping({"model": "m", "api-key": "abc ", "specops": {"engine": "vllm"}}, "t")
    assert [i.field for i in validate(vllm)] == ["api-key"] and "abc" not in str(validate(vllm))
    assert validate(from_mapping({"model-path": "m", "api-key": "sk tab\tand space ok"}, "t")) == []


# --- 5. server.stopped with a port that cannot be a server's ---------------------------------------------------

@pytest.mark.parametrize("port, shown", [("0", "0"), ("70000", "70000"), ("abc", "'abc'"), ("-1", "-1")])
def test_server_stopped_refuses_a_port_outside_1_to_65535(port, shown, sim, python_spy):
    holder, before, spy, calls = guarded(sim, python_spy)
    run = run_pyinfra(sim, f"port={port}", *spy, deploy="operations.server.stopped")
    assert_refused(run, f"[@local] port: port must be an integer 1-65535, got {shown}")
    assert "not running" not in run.out, run
    assert_untouched(sim, calls, holder, before)


def test_port_checker_accepts_strings_and_ints():
    h = FakeHost()
    assert hostdata.as_port(h, "8000") == 8000 and hostdata.as_port(h, 65535) == 65535
    for bad in (0, 65536, True, "1.5", None, 30000.5):
        with pytest.raises(ConfigError, match=r"\[gpu-a\] port: port must be an integer 1-65535"):
            hostdata.as_port(h, bad)


def test_yaml_aliases_are_refused_so_a_billion_laughs_config_cannot_expand(tmp_path):
    """Nine levels of ten aliases: a few hundred bytes that would expand to 10^9 entries when hashed."""
    from operations.model.config import load
    from operations.errors import ConfigError

    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(levels) + "\nmodel-path: *a9\n")
    with pytest.raises(ConfigError) as err:
        load(str(path))
    assert "YAML aliases (*name) are not allowed in a config" in str(err.value)
    assert "line 2, column" in str(err.value)


@pytest.mark.parametrize("reader,value", [(hostdata.as_port, "³"), (hostdata.as_indices, "0,²"),
                                          (hostdata.as_integer, "²")])
def test_non_ascii_digits_are_a_config_error_not_a_traceback(reader, value):
    """``"²".isdigit()`` is True but ``int("²")`` raises: only ASCII digits count."""
    h = FakeHost()
    with pytest.raises(ConfigError, match=r"\[gpu-a\]"):
        reader(h, "x", value) if reader is not hostdata.as_port else reader(h, value)
