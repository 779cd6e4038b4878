"""Build the libnvidia-ml.so.1 stand-in (nvml_stub.c) with gcc, so pynvml can run against simulated GPUs."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

SOURCE = pathlib.Path(__file__).with_name("nvml_stub.c")
LIB_NAME = "libnvidia-ml.so.1"  # the soname pynvml dlopens
CFLAGS = ["-shared", "-fPIC", "-O2", "-Wall", "-Wextra"]


def build_nvml(out_dir: str | os.PathLike) -> pathlib.Path:
    """Compile nvml_stub.c into ``out_dir/libnvidia-ml.so.1`` unless an up-to-date build is there; return its path."""
    out = pathlib.Path(out_dir)
    lib = out / LIB_NAME
    if lib.exists() and lib.stat().st_mtime >= SOURCE.stat().st_mtime:
        return lib
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError(f"cannot build {LIB_NAME}: gcc not found on PATH")
    out.mkdir(parents=True, exist_ok=True)
    # Temp name in the same directory, then os.replace: concurrent builders and readers never see a partial file.
    fd, tmp = tempfile.mkstemp(prefix=f".{LIB_NAME}.", suffix=".tmp", dir=out)
    os.close(fd)
    try:
        proc = subprocess.run([gcc, *CFLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"gcc failed building {LIB_NAME} (rc={proc.returncode}):\n{proc.stderr}")
        os.chmod(tmp, 0o755)  # mkstemp made it 0600; other users (sim holders) must be able to dlopen it
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    print(build_nvml(sys.argv[1]))
