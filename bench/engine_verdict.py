"""What the host's kept engine verdict saves: the host's own SGLang parsing a config's command line
(``engine_check``, what ``EngineParse`` runs) against ``observe`` returning the kept verdict with the GPUs and the
server (what a switch to an already-judged config reads instead), both run as on a host (the bundle under a
private HOME), medians of ``--runs``, in one run.

    .venv/bin/python bench/engine_verdict.py [--python .venv-sglang/bin/python] [--config eagle3-llama3.1-8b]

``--python`` is the engine's interpreter (default: the real SGLang 0.5.23 in ``.venv-sglang``, built by
``scripts/sglang_venv.sh``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

from operations.controller.remote import python_script  # noqa: E402
from operations.model import config as configs  # noqa: E402
from operations.model.engine_check import cache_key, check_input  # noqa: E402


def timed(argv: list[str], env: dict) -> tuple[float, dict]:
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    took = time.monotonic() - t0
    if done.returncode:
        raise SystemExit(f"{argv[:3]}...: exit {done.returncode}: {done.stderr[-800:]}")
    return took, json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default=str(REPO / ".venv-sglang" / "bin" / "python"))
    p.add_argument("--config", default="eagle3-llama3.1-8b")
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    cfg = configs.load(a.config)
    flags, engine_yaml = check_input(cfg, "/var/lib/specops/servers/llm/engine.yaml")
    key = cache_key(a.python, flags, engine_yaml)
    with tempfile.TemporaryDirectory() as home:
        env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        check = ["sh", "-c", python_script(a.python, "engine_check.py", flags, engine_yaml, key,
                                           install=True).get_raw_value()]
        look = ["sh", "-c", python_script(sys.executable, "observe.py", f"{home}/dev*", f"{home}/srv", "1",
                                          "--engine", key, install=True).get_raw_value()]
        parses = [timed(check, env) for _ in range(a.runs)]
        verdict = parses[-1][1]
        if not verdict.get("ok"):
            raise SystemExit(f"the engine refused {a.config}: {verdict}")
        lookups = [timed(look, env) for _ in range(a.runs)]
        assert all(doc.get("engine", {}).get("cached") for _, doc in lookups), lookups[-1][1]
    parse = statistics.median(t for t, _ in parses)
    kept = statistics.median(t for t, _ in lookups)
    print(f"engine: SGLang {verdict.get('version')} ({a.python}), config {a.config}, medians of {a.runs} runs")
    print(f"| engine_check (the host's SGLang parses the command line) | {parse:.2f} s | 1.00x |")
    print(f"| observe with the kept verdict (GPUs + server + verdict)   | {kept:.2f} s | {kept / parse:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
