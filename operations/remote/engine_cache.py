"""The engine check's verdicts, kept on the host so a switch to a config the host's engine already judged costs
no parse (importing SGLang's parser takes seconds on a real host) and no round trip (``observe`` returns it).

``~/.cache/specops/engine-checks/KEY.json`` (0700 directory, 0600 files of the user who runs specops there):
the verdict of ``engine_check`` for KEY (a hash the controller makes of the interpreter, the flags and the engine
file; secrets are never in them), with a witness: (path, mtime, size, inode) of the interpreter and of the
engine's files it parsed with. A verdict is used only while every witness file is unchanged, so an upgraded,
reinstalled or edited SGLang is asked again.
"""
import os
import re

from .common import DICT, private_dir, read_doc, save_json

KEY = re.compile(r"[0-9a-f]{24}")


def _root():
    home = os.environ.get("HOME")
    return os.path.join(home, ".cache", "specops", "engine-checks") if home else None


def _path(key):
    root = _root()
    return os.path.join(root, key + ".json") if root and KEY.fullmatch(key or "") else None


def _stat(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [path, st.st_mtime_ns, st.st_size, st.st_ino]


def store(key, verdict, paths):
    """Keep ``verdict`` for ``key``, witnessed by ``paths``; best effort (an unwritable cache only costs speed)."""
    path = _path(key)
    witness = [_stat(p) for p in paths]
    if path is None or not witness or None in witness or private_dir(os.path.dirname(path)):
        return False
    try:
        save_json(path, {"verdict": verdict, "witness": witness})
    except (OSError, ValueError):
        return False
    return True


def lookup(key):
    """The verdict kept for ``key`` while its witness files are unchanged, else None."""
    path = _path(key)
    if path is None or not os.path.isfile(path):
        return None
    doc, _ = read_doc(path, {"verdict": (DICT, False)}, required=("verdict", "witness"))
    if not doc or not isinstance(doc["witness"], list) or not doc["witness"]:
        return None
    for entry in doc["witness"]:
        if not isinstance(entry, list) or len(entry) != 4 or not isinstance(entry[0], str) or _stat(entry[0]) != entry:
            return None
    return {**doc["verdict"], "cached": True}
