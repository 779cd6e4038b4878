"""A host's GPUs and one server's status in one round trip (``run.py observe DEVICES DIR PORT [UNIT] [--engine
KEY]``): the documents of ``probe_gpu`` and ``server_ctl status``, as ``{"gpus": ..., "server": ...}``, and with
KEY the engine check's kept verdict for the command line about to be started (``engine_cache``; null when there is
none, or SGLang changed since). What a no-op run of ``server.running`` reads, so converging costs one SSH command
per host."""
import json
import sys

from . import engine_cache, probe_gpu
from .server_dir import cmd_status


def main(argv):
    key = None
    if "--engine" in argv:
        at = argv.index("--engine")
        key, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    devices, d, port = argv[0], argv[1], int(argv[2])
    doc = {"gpus": probe_gpu.probe(None, devices), "server": cmd_status(d, port, argv[3] if len(argv) > 3 else None)}
    if key:
        doc["engine"] = engine_cache.lookup(key)
    sys.stdout.write(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
