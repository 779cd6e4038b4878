"""Profile one pyinfra run: every SSH command and upload per host, with its wall time and what ran on the host.

    SPECOPS_CLUSTER=DIR/cluster.json .venv/bin/python bench/profile_run.py [--json OUT] -- -y inventory/cluster_sim.py deploy.py ...

Runs pyinfra's own CLI in this process with its SSH connector's ``run_shell_command`` and ``put_file`` timed
and the streamed transition (``remote.Conversation``: to its document, then the reply on its channel) timed (nothing else changes), then prints, per host, each command's start (seconds since the run began), wall time and
a readable form (host programs as ``<module>``, long arguments cut), followed by the controller's CPU seconds and
the run's wall time. Used to write the breakdown in bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import re
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

from pyinfra.connectors.ssh import SSHConnector  # noqa: E402

from operations.controller.remote import readable  # noqa: E402

T0 = time.monotonic()
EVENTS: list[dict] = []


def _short(command) -> str:
    text = readable(str(command.get_masked_value() if hasattr(command, "get_masked_value") else command))
    text = re.sub(r"\S{80,}", lambda m: m.group(0)[:24] + f"…[{len(m.group(0))} chars]", text)
    return text[:200]


def _timed(kind, original):
    def wrapper(self, *args, **kwargs):
        start = time.monotonic()
        try:
            return original(self, *args, **kwargs)
        finally:
            what = _short(args[0]) if kind == "run" else f"upload -> {args[1]}"
            EVENTS.append({"host": self.host.name, "start": start - T0, "wall": time.monotonic() - start,
                           "what": what})
    return wrapper


def report(wall: float) -> str:
    lines = []
    by_host = defaultdict(list)
    for e in EVENTS:
        by_host[e["host"]].append(e)
    for name, events in sorted(by_host.items()):
        total = sum(e["wall"] for e in events)
        lines.append(f"## {name}: {len(events)} SSH commands, {total:.2f} s in them")
        for e in sorted(events, key=lambda e: e["start"]):
            lines.append(f"  {e['start']:7.2f}  {e['wall']:6.2f}s  {e['what']}")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    lines.append(f"controller: wall {wall:.2f} s, CPU {usage.ru_utime + usage.ru_stime:.2f} s "
                 f"(user {usage.ru_utime:.2f}, sys {usage.ru_stime:.2f}), peak RSS {usage.ru_maxrss // 1024} MiB")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="also write the events as JSON")
    p.add_argument("pyinfra_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    args = [x for x in a.pyinfra_args if x != "--"]
    SSHConnector.run_shell_command = _timed("run", SSHConnector.run_shell_command)
    SSHConnector.put_file = _timed("put", SSHConnector.put_file)
    from operations.controller.remote import Conversation  # the streamed transition reads its channel itself

    def timed(name, original):
        def wrapper(self, *args, **kwargs):
            start = time.monotonic()
            try:
                return original(self, *args, **kwargs)
            finally:
                what = ("(streamed, to its document) " + _short(self.command) if name == "_run" else
                        f"(same channel) reply {args[0]!r}" if name == "reply" else "(same channel) end")
                EVENTS.append({"host": self.on_host.name, "start": start - T0, "wall": time.monotonic() - start,
                               "what": what})
        return wrapper

    Conversation._run = timed("_run", Conversation._run)
    Conversation.reply = timed("reply", Conversation.reply)
    from pyinfra_cli.main import cli

    rc = 0
    try:
        cli.main(args=args, prog_name="pyinfra", standalone_mode=False)
    except SystemExit as exc:
        rc = exc.code or 0
    wall = time.monotonic() - T0
    print(report(wall), file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(EVENTS, indent=1))
    return rc if isinstance(rc, int) else 1


if __name__ == "__main__":
    sys.exit(main())
