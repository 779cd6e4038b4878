"""README command 1 (the main job on the embedded default) on a fresh copy of the repository."""
import re
import shutil
import subprocess

from conftest import REPO


def test_main_job_on_a_fresh_copy_converges_and_says_what_it_did(tmp_path):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    clone = tmp_path / "clone"
    for name in files:
        src = REPO / name
        if src.is_file():
            dst = clone / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    command = re.search(r"```sh\n\s*(sh scripts/demo\.sh)\n\s*```", (REPO / "README.md").read_text()).group(1)
    proc = subprocess.run(command, shell=True, cwd=clone, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"idle: GPU 0,1,2,3,4,5,6,7 idle after [\d.]+s \(pid \d+ stopped by SIGTERM, pid \d+ needed "
                     r"SIGKILL\)", out), out[-4000:]
    assert "ready after" in out and "avg accept length" in out and "noop: server llm running config" in out
    assert "~ speculative_num_draft_tokens: 16 -> (unset) (restart)" in out
    assert out.count("config confirmed") == 2
    assert "nvidia-persistenced, 300 MiB" in out.split("== 5.")[-1]  # the protected daemon survived it all
    sweep = out.split("== 6.")[-1]
    assert re.search(r"eagle3-llama3\.1-8b vs baseline-llama3\.1-8b: speculation stops paying at concurrency "
                     r"~\d+\.\d \(helps at c=\d+, not at c=\d+\)", sweep), sweep
    assert sweep.count("sweep.benchmarked") == 12 and "throughput.png" in sweep
    assert re.search(r"Grand total\s+1\s+-\s+-\s+1", sweep.split("== 7.")[-1]), sweep  # the re-run: no change


def test_fault_table_names_only_tests_that_exist():
    """Each README fault case names tests; every one of them is defined in tests/ (a renamed test breaks this)."""
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("## Faults and bad input"):readme.index("## The GPU host simulator")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) >= 10, rows
    source = "".join(p.read_text() for p in (REPO / "tests").glob("test_*.py"))
    for row in rows:
        named = re.findall(r"::(test_\w+)", row)
        assert named, row
        missing = [n for n in named if f"def {n}(" not in source]
        assert not missing, (row, missing)
