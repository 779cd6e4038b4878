"""The benchmark sweep end to end (sweep.py over inventory/sim.py: the SGLang stand-in and its bench_serving
stand-in), resumability, a failed config, and the report's arithmetic."""
import csv
import json
import struct
import subprocess
import sys

import pytest

from conftest import REPO, changed, run_pyinfra
from operations.model import config as server_configs
from operations.reporting import tables as sweep_report
from operations.errors import ConfigError
from operations.sweep import Workload

LEVELS = (1, 4, 16)


def sweep(sim, results, cfgs, *args, levels=LEVELS):
    return run_pyinfra(sim, "--data", f"configs={','.join(map(str, cfgs))}",
                       "--data", f"concurrency={','.join(map(str, levels))}", "--data", "num_prompts=16",
                       "--data", "input_len=64", "--data", "output_len=24", "--data", f"results={results}",
                       *args, deploy="sweep.py", timeout=300)


def launches(sim) -> list[dict]:
    path = sim.root / "timeline.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in events if e["event"] == "launch"]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_sweep_measures_every_level_then_resumes_and_reports(server_sim, configs, tmp_path):
    sim, results = server_sim, tmp_path / "results"
    eagle3, baseline = configs["eagle3-llama3.1-8b"], configs["baseline-llama3.1-8b"]
    first = sweep(sim, results, [baseline, eagle3])
    assert first.rc == 0, first
    folder = results / "@local"
    records = sweep_report.load(folder)
    assert [(r["config"]["name"], r["workload"]["concurrency"]) for r in records] == \
        [(name, c) for name in ("baseline-llama3.1-8b", "eagle3-llama3.1-8b") for c in LEVELS]
    running_hash = json.loads((sim.root / "servers" / "llm" / "state.json").read_text())["config_hash"]
    assert {r["config"]["hash"] for r in records if r["config"]["speculative"]} == {running_hash}  # the last one
    assert len({r["config"]["hash"] for r in records}) == 2
    for r in records:
        cfg = server_configs.load(str(eagle3 if r["config"]["speculative"] else baseline))
        assert r["config"]["args"]["model_path"] == cfg.args["model_path"]
        assert r["server_info"]["speculative_algorithm"] == ("EAGLE3" if cfg.speculative else None)
        assert r["result"]["completed"] == 16 and r["result"]["max_concurrency"] == r["workload"]["concurrency"]
        assert r["result"]["total_output_tokens"] == 16 * 24
        assert ("--max-concurrency", str(r["workload"]["concurrency"])) in zip(r["runner"], r["runner"][1:])
    assert all(r["result"]["accept_length"] > 3 for r in records if r["config"]["speculative"])
    assert len(launches(sim)) == 2  # one server per config, however many levels

    # the stand-in makes speculation pay at low concurrency and cost at high (verification dominates)
    (cross,) = sweep_report.crossovers(records)
    assert cross.speedups[1] > 1.3 and cross.speedups[16] < 1.0, cross
    assert cross.between == (4, 16) and 4 < cross.at < 16
    report = (folder / "REPORT.md").read_text()
    assert "stops paying at concurrency ~" in report and "| 16 |" in report
    rows = list(csv.DictReader((folder / "results.csv").open()))
    assert len(rows) == 6 and {r["config"] for r in rows} == {"baseline-llama3.1-8b", "eagle3-llama3.1-8b"}
    assert all(float(r["output_tok_s"]) > 0 for r in rows) and rows[0]["accept_length"] == ""
    assert png_size((folder / "throughput.png").read_bytes()) == (800, 500)

    again = sweep(sim, results, [baseline, eagle3])
    assert again.rc == 0 and changed(again) == 0, again
    assert len(launches(sim)) == 2

    (folder / "eagle3-llama3.1-8b" / "c4.json").unlink()
    (folder / "eagle3-llama3.1-8b" / "c16.json").unlink()
    dry = sweep(sim, results, [baseline, eagle3], "--dry")
    assert dry.rc == 0 and "eagle3-llama3.1-8b (" in dry.out and "at concurrency 16" in dry.out, dry
    assert "baseline-llama3.1-8b (" not in dry.out  # nothing left to measure there: not even started
    assert not (folder / "eagle3-llama3.1-8b" / "c16.json").exists()
    resumed = sweep(sim, results, [baseline, eagle3])
    assert resumed.rc == 0 and changed(resumed) == 3, resumed  # two benchmarks and the report
    assert len(launches(sim)) == 2  # the eagle3 server was still running that config: measured as it was
    assert (folder / "eagle3-llama3.1-8b" / "c16.json").exists()


def test_a_config_that_fails_does_not_stop_the_others_and_the_rerun_fills_it_in(server_sim, configs, tmp_path):
    sim, results = server_sim, tmp_path / "results"
    eagle3, baseline = configs["eagle3-llama3.1-8b"], configs["baseline-llama3.1-8b"]
    sim.configure(accept_length=1.2)  # below eagle3's min_accept_length 2.0: its verification fails
    first = sweep(sim, results, [eagle3, baseline], levels=(1, 4))
    assert first.rc != 0, first
    assert "avg accept length 1.2" in first.out, first
    assert "no result for eagle3-llama3.1-8b c=1, eagle3-llama3.1-8b c=4" in first.out, first
    names = {(r["config"]["name"], r["workload"]["concurrency"]) for r in sweep_report.load(results / "@local")}
    assert names == {("baseline-llama3.1-8b", 1), ("baseline-llama3.1-8b", 4)}

    sim.configure(accept_length=3.4)
    second = sweep(sim, results, [eagle3, baseline], levels=(1, 4))
    assert second.rc == 0, second
    assert len(sweep_report.load(results / "@local")) == 4
    assert [e["port"] for e in launches(sim)].count(configs["port"]) == 3  # eagle3 (failed), baseline, eagle3
    third = sweep(sim, results, [eagle3, baseline], levels=(1, 4))
    assert third.rc == 0 and changed(third) == 0, third


def test_bench_runner_is_attached_to_not_restarted_and_gets_the_key_from_secrets_env(server_sim, configs, tmp_path):
    """server_ctl bench: a second call with the same key attaches to the running benchmark (same pid); the API
    key reaches the runner from secrets.env, never its command line."""
    from factories import host_program

    sim = server_sim
    assert run_pyinfra(sim, "--data", f"config={configs['eagle3-llama3.1-8b']}").rc == 0
    state = json.loads((sim.root / "servers" / "llm" / "state.json").read_text())
    d = str(sim.root / "servers" / "llm")
    argv = [str(sim.root / "bin" / "sglang-bench-serving"), "--port", str(configs["port"]), "--num-prompts", "8",
            "--max-concurrency", "1", "--random-input-len", "16", "--random-output-len", "24"]
    opts = {"key": "k1", "argv": argv, "port": configs["port"], "config_hash": state["config_hash"]}

    def ctl(**extra):
        out = subprocess.run(host_program("bench_ctl.py", "bench", d, "t", json.dumps({**opts, **extra})),
                             capture_output=True, text=True, env={**sim.env(), "HOME": str(tmp_path)}, timeout=60)
        return json.loads(out.stdout)

    started = ctl(budget_s=0)
    assert started["done"] is False
    pid = json.loads((sim.root / "servers" / "llm" / "bench" / "t.run.json").read_text())["pid"]
    finished = ctl(budget_s=30)
    assert finished["done"] is True and finished["rc"] == 0, finished
    assert json.loads((sim.root / "servers" / "llm" / "bench" / "t.run.json").read_text())["pid"] == pid
    assert finished["result"]["completed"] == 8 and finished["server_info"]["speculative_algorithm"] == "EAGLE3"
    wrong = ctl(budget_s=0, key="k2", config_hash="0" * 16)
    assert "not benchmarking" in wrong["error"]


def test_workload_validation_lists_every_bad_field():
    with pytest.raises(ConfigError) as err:
        Workload.at(0, -1, "x", 8)
    assert [i.field for i in err.value.issues] == ["concurrency", "num_prompts", "input_len"]
    assert Workload.at(16).num_prompts == 64 and Workload.at(1).num_prompts == 8


def record(name, spec, c, tok_s, model="m"):
    return {"config": {"name": name, "hash": name[:4], "speculative": spec, "args": {"model_path": model}},
            "workload": {"concurrency": c, "num_prompts": 8, "input_len": 1, "output_len": 1},
            "result": {"output_throughput": tok_s, "mean_ttft_ms": 1.0, "mean_itl_ms": 2.0,
                       "accept_length": 3.0 if spec else None}}


def test_a_result_of_an_older_config_version_is_missing_not_present():
    from operations.sweep import missing

    rows = [record("spec", True, 1, 150), record("spec", True, 4, 300)]  # hash "spec"
    assert missing(rows, [("spec", "spec", 1), ("spec", "spec", 4)]) == []
    assert missing(rows, [("spec", "new0", 1), ("spec", "spec", 4), ("spec", "spec", 16)]) == ["spec c=1", "spec c=16"]


def test_crossover_is_interpolated_on_a_log2_scale():
    rows = [record("base", False, c, t) for c, t in ((1, 100), (4, 300), (16, 900))]
    rows += [record("spec", True, c, t) for c, t in ((1, 250), (4, 450), (16, 450))]
    (cross,) = sweep_report.crossovers(rows)
    assert cross.speedups == {1: 2.5, 4: 1.5, 16: 0.5} and cross.between == (4, 16)
    assert cross.at == pytest.approx(8.0)  # 1.5 -> 0.5 halfway between log2(4) and log2(16)
    assert "stops paying at concurrency ~8.0 (helps at c=4, not at c=16)" in cross.text()


def test_crossover_verdicts_when_speculation_always_or_never_pays():
    base = [record("base", False, c, 100 * c) for c in (1, 2)]
    always = sweep_report.crossover(base + [record("spec", True, c, 300 * c) for c in (1, 2)], "spec", "base")
    never = sweep_report.crossover(base + [record("spec", True, c, 50 * c) for c in (1, 2)], "spec", "base")
    assert always.at is None and "helps at every measured level (up to c=2)" in always.text()
    assert never.at is None and "does not help at any measured level" in never.text()


def test_baseline_is_matched_by_model_and_missing_values_render_as_dashes():
    rows = [record("base-a", False, 1, 100, "a"), record("base-b", False, 1, 100, "b"),
            record("spec-b", True, 1, 200, "b")]
    (cross,) = sweep_report.crossovers(rows)
    assert cross.baseline == "base-b"
    text = sweep_report.markdown(rows)
    assert "| 1 | 100 | 1.0 | - | 2.00 | - | - |" in text  # base: no p99s, no accept length


def test_report_command_rewrites_the_files(tmp_path):
    rows = [record("base", False, 1, 100), record("spec", True, 1, 150)]
    for r in rows:
        path = tmp_path / r["config"]["name"] / "c1.json"
        path.parent.mkdir()
        path.write_text(json.dumps(r))
    out = subprocess.run([sys.executable, "-m", "operations.reporting.tables", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "spec vs base: speculation helps at every measured level" in out.stdout
    assert sweep_report.unchanged(tmp_path, sweep_report.load(tmp_path))
