"""Run under the REAL SGLang interpreter: parse and resolve command lines with SGLang's own code, many per run.

Importing ``sglang.srt.server_args`` takes seconds, so one run answers every case. Input (stdin), one JSON document::

    {"warm_up": {...a case...},   # optional (default: the first case that resolves): resolved before forking
     "cases": [{"id": "eagle3-8b",
                "argv": ["--config", "@engine.yaml", "--device", "cpu"],   # "@NAME" -> path of files[NAME]
                "files": {"engine.yaml": "model-path: ...\\n"},             # optional, written to a temp dir
                "mode": "resolve",           # "resolve" (default) | "parse" | "merge" | "algorithms"
                "keys": ["tp_size", ...]}]}  # optional: resolved_dict restricted to these keys

- ``resolve``: ``prepare_server_args(argv)`` (SGLang's parser, with its own ``--config`` loader when argv has
  ``--config``), then ``.resolve_once()`` and ``.resolved_dict()``;
- ``parse``: ``prepare_server_args(argv)`` only;
- ``merge``: ``ConfigArgumentMerger(parser).merge_config_with_args(argv)`` on the parser ``prepare_server_args``
  builds: the argv SGLang turns the YAML into;
- ``algorithms``: the speculative algorithm names SGLang knows (``SpeculativeAlgorithm`` and its reserved aliases).

Output (stdout), one JSON document: ``{"version": "0.5.23", "results": [{"id", "ok", "stage", "resolved" | "merged"
| "error"}]}`` where a failure's ``error`` is ``"ExceptionType: message"`` (argparse's own ``error: ...`` line for a
rejected command line) and ``stage`` says where it failed (``parse``, ``resolve``, ``merge``). Each case runs in a
forked child, so no state of one resolution leaks into the next. SGLang's logs go to stderr.

The model configs come from the Hugging Face cache the environment names (tests/real_sglang/models.py).
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import tempfile
import traceback
import warnings


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        return str(value)


def _argv(case: dict, directory: str) -> list[str]:
    files = case.get("files") or {}
    paths = {}
    for name, text in files.items():  # "@DIR" in a file or argument: this directory (a file names another)
        path = os.path.join(directory, os.path.basename(name))
        with open(path, "w") as fh:
            fh.write(text.replace("@DIR", directory))
        paths[name] = path
    out = []
    for item in case["argv"]:
        item = str(item)
        out.append(paths[item[1:]] if item.startswith("@") and item[1:] in paths else item.replace("@DIR", directory))
    return out


def _argparse_message(noise: str, exc: SystemExit) -> str:
    lines = [line for line in noise.strip().splitlines() if "error:" in line]
    return lines[-1].strip() if lines else f"SystemExit: {exc.code}"


def algorithms() -> list[str]:
    """The algorithm names SGLang accepts: its builtin enum (speculative/spec_info.py) and reserved aliases (NEXTN)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import _RESERVED_ALIASES

    return [a.name for a in SpeculativeAlgorithm if a.name != "NONE"] + sorted(_RESERVED_ALIASES)


def run_case(case: dict) -> dict:
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    result = {"id": case.get("id"), "ok": False, "stage": "parse"}
    mode = case.get("mode", "resolve")
    if mode == "algorithms":
        return {**result, "ok": True, "stage": "algorithms", "algorithms": algorithms()}
    with tempfile.TemporaryDirectory(prefix="specops-real-sglang-") as directory:
        argv = _argv(case, directory)
        noise = io.StringIO()
        try:
            if mode == "merge":
                import argparse

                from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

                result["stage"] = "merge"
                parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args builds it
                ServerArgs.add_cli_args(parser)
                with contextlib.redirect_stderr(noise):
                    result["merged"] = ConfigArgumentMerger(parser).merge_config_with_args(argv)
                result["ok"] = True
                return result
            with contextlib.redirect_stderr(noise):
                args = prepare_server_args(argv)
            if mode == "parse":
                result["ok"] = True
                return result
            result["stage"] = "resolve"
            args.resolve_once()
            resolved = args.resolved_dict()
            keys = case.get("keys")
            result["resolved"] = _jsonable({k: resolved.get(k) for k in keys} if keys else resolved)
            result["ok"] = True
        except SystemExit as exc:  # argparse: usage + "error: ..." on stderr, exit 2
            result["error"] = _argparse_message(noise.getvalue(), exc)
        except BaseException as exc:  # noqa: BLE001 -- any failure of SGLang's code is the answer
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["where"] = traceback.format_exc().strip().splitlines()[-3:-1]
        finally:
            sys.stderr.write(noise.getvalue())
    return result


def _in_child(case: dict) -> dict:
    """``run_case`` in a forked child (a fresh copy of the imported SGLang for every case)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read)
        try:
            doc = json.dumps(run_case(case)).encode()
        except BaseException as exc:  # noqa: BLE001
            doc = json.dumps({"id": case.get("id"), "ok": False, "stage": "bridge",
                              "error": f"{type(exc).__name__}: {exc}"}).encode()
        with os.fdopen(write, "wb") as fh:
            fh.write(doc)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return {"id": case.get("id"), "ok": False, "stage": "bridge",
                "error": f"the case's process died (wait status {status})"}
    return json.loads(data)


def main() -> int:
    request = json.load(sys.stdin)
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything SGLang prints goes to stderr: stdout carries only our JSON
    logging.disable(logging.WARNING)  # SGLang's hooks warn on every rewrite; the answer is the resolved values
    warnings.simplefilter("ignore")
    import sglang
    import sglang.srt.server_args  # noqa: F401 -- import once, before forking

    fork = hasattr(os, "fork") and not request.get("no_fork")
    cases = request.get("cases", [])
    if fork:  # resolve one case here first, so that the children share its lazy imports (5x faster)
        warm = [request["warm_up"]] if request.get("warm_up") else [
            c for c in cases if c.get("mode", "resolve") == "resolve"][:5]
        for case in warm:
            if run_case(case)["ok"]:  # one that resolved to the end has imported what resolving imports
                break
    results = [(_in_child if fork else run_case)(case) for case in cases]
    real_stdout.write(json.dumps({"version": sglang.__version__, "python": sys.executable, "results": results}))
    real_stdout.write("\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
