"""What a simulated cluster host's own machine would give it: root's own home (its ~/.cache, a fresh ~/.bashrc) and a
Python with nvidia-ml-py, not the developer machine's (whose pyenv-initialising ~/.bashrc and editable venv would
weigh on every SSH session and host program, and whose shared ~/.cache would let one host see another's files)."""
from __future__ import annotations

import shutil
from pathlib import Path


FRESH_BASHRC = """# ~/.bashrc of root on a simulated host (gpusim.cluster): a fresh machine's, quiet unless interactive
case $- in *i*) ;; *) return ;; esac
"""


def own_home(root: Path, seen_at: Path) -> None:
    """Root's own home on this host (``root/home``, seen at ``seen_at``) and an /etc/passwd saying so, bind-mounted
    in the host's mount namespace: its ~/.cache is its own, and its login shell does not run this machine's
    ~/.bashrc (a developer's pyenv init costs every SSH session ~0.3 s)."""
    home = root / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    (home / ".bashrc").write_text(FRESH_BASHRC)
    rows = []
    for line in Path("/etc/passwd").read_text().splitlines():
        f = line.split(":")
        if len(f) == 7 and f[0] == "root":
            f[5] = str(seen_at)
        rows.append(":".join(f))
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "passwd").write_text("\n".join(rows) + "\n")


def host_python(where: Path) -> None:
    """A venv at ``where`` of this interpreter's base with only pynvml (a GPU host's Python with nvidia-ml-py)."""
    import venv
    import pynvml
    if not (where / "bin" / "python").exists():
        venv.EnvBuilder(symlinks=True, with_pip=False).create(where)
    site = next((where / "lib").glob("python3*/site-packages"))
    shutil.copyfile(pynvml.__file__, site / "pynvml.py")
