"""Host side: does the host's own engine accept this command line?

``ENGINE_PYTHON run.py engine_check FLAGS_JSON ENGINE_YAML`` runs with the interpreter the server will be launched with
(the launcher's Python), imports that SGLang and parses the flags with its own parser -- including its own
``--config`` loader on ENGINE_YAML (written to a private temporary file, since the real engine.yaml is uploaded
later) -- without resolving them (resolution reads the model and wants the GPUs). Prints one JSON document:
``{"engine": "sglang", "version": "0.5.23", "ok": true, "error": null}``. Secret values never come here: the
controller sends a placeholder in their place. With KEY (``... FLAGS_JSON ENGINE_YAML KEY``) a verdict of the
parser (accepted, or refused with its message) is kept for ``observe`` (``engine_cache``), witnessed by this
interpreter and the SGLang files the parser came from.
"""
import argparse
import contextlib
import io
import json
import os
import sys
import tempfile

from . import engine_cache


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit 2: keep its message instead
        raise _Refused(message)


def _parse(flags, engine_yaml):
    from sglang.srt.server_args import ServerArgs

    parser = _Parser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    if "--config" not in flags:
        parser.parse_args(flags)
        return
    try:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
    except ImportError:
        raise _Refused("this SGLang has no --config loader (sglang.srt.utils.server_args_config_parser)") from None
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="specops-engine-check-")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(engine_yaml or "")
        at = flags.index("--config")
        flags = flags[:at + 1] + [path] + flags[at + 2:]
        try:
            merged = ConfigArgumentMerger(parser).merge_config_with_args(flags)
        except ValueError as exc:  # SGLang's loader raises ValueError for what it does not take
            raise _Refused(f"its --config loader: {exc}") from None
        parser.parse_args(merged)
    finally:
        os.unlink(path)


def _witness():
    """The files a verdict depends on: the interpreter, and SGLang's package, parser and config loader (a pip
    upgrade or reinstall writes new ones, an edit changes their mtime)."""
    paths = [os.path.realpath(sys.executable)]
    for name in ("sglang", "sglang.srt.server_args", "sglang.srt.utils.server_args_config_parser"):
        module = sys.modules.get(name)
        if getattr(module, "__file__", None):
            paths += [module.__file__] + ([os.path.dirname(module.__file__)] if name == "sglang" else [])
    return paths


def check(flags, engine_yaml, key=None):
    out = {"engine": "sglang", "python": sys.executable, "version": None, "ok": False, "error": None}
    noise = io.StringIO()  # SGLang logs while importing; the controller reads only this program's JSON
    judged = False  # the parser itself answered (accepted or refused): a verdict worth keeping
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            import sglang

            out["version"] = getattr(sglang, "__version__", None)
            _parse(flags, engine_yaml)
        out["ok"] = judged = True
    except _Refused as exc:
        out["error"], judged = str(exc), True
    except SystemExit as exc:  # a parser that exits after all (a custom action): what it printed is the reason
        out["error"] = noise.getvalue().strip().splitlines()[-1:] or [f"exit {exc.code}"]
        out["error"] = out["error"][0]
    except Exception as exc:  # ImportError (no SGLang in this interpreter), or the parser itself broke
        out["error"] = f"{type(exc).__name__}: {exc}"
    if key and judged:
        engine_cache.store(key, out, _witness())
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.stdout.write(json.dumps(check(json.loads(args[0]), args[1] if len(args) > 1 else "",
                                      args[2] if len(args) > 2 else None)) + "\n")
