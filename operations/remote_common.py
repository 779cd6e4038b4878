"""Shared by the remote scripts (probe_gpu, server_ctl, signal_procs): ``remote.python_script`` sends this file
ahead of each script, so on the host they are one self-contained program; locally, scripts import it."""
import re

SECRET_FLAG = re.compile(r"^--?[\w-]*(api[-_]?key|token|secret|password)[\w-]*$", re.I)


def masked(argv):
    """argv with the values of secret-looking flags replaced (servers take --api-key on the command line)."""
    out, hide = [], False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        if hide:
            out.append("<secret>")
        elif eq and SECRET_FLAG.match(flag):
            out.append(flag + "=<secret>")
        else:
            out.append(arg)
        hide = not hide and not eq and bool(SECRET_FLAG.match(arg))
    return out
