"""Remote signal sender: ``run.py signalling TERM|KILL PID:START:PGID ...``.

Signals a process (or its whole group when PGID is not 0) only if /proc still shows that PID with the same start
time, so a PID the kernel reused is never hit. Prints one line per target; exits 1 if a signal was refused.
"""
import os
import signal
import sys


from .common import start_time


def main(argv):
    sig = getattr(signal, "SIG" + argv[0])
    failed = False
    for spec in argv[1:]:
        pid, start, pgid = (int(x) for x in spec.split(":"))
        if start_time(pid) != start:
            print(f"{argv[0]} pid {pid}: already gone")
            continue
        try:
            if pgid and os.getpgid(pid) == pgid:  # still in the group the plan approved
                os.killpg(pgid, sig)
                print(f"{argv[0]} process group {pgid} (pid {pid})")
            else:
                os.kill(pid, sig)
                print(f"{argv[0]} pid {pid}" + (" (left its process group: pid only)" if pgid else ""))
        except ProcessLookupError:
            print(f"{argv[0]} pid {pid}: already gone")
        except PermissionError as exc:
            print(f"{argv[0]} pid {pid}: {exc}", file=sys.stderr)
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
