"""The ``Gpus`` fact: a host's GPUs and their compute processes, as the GPU probe's JSON document."""
from __future__ import annotations

import json

from pyinfra.api import FactBase, StringCommand

from operations.controller.remote import guarded, host_python, python_script
from operations.facts.document import read_document
from operations.model.gpus import DEFAULT_DEVICES, GpuState, parse_probe


def probe_command(python: str = "python3", nvml: bool = True, wait: str | None = None, devices: str | None = None,
                  holders: bool = False) -> StringCommand:
    """One round trip: the probe if the host has that Python, else a 'none' document saying why."""
    missing = json.dumps({"source": "none", "errors": [f"{python} not found on host"]})
    args = ([] if nvml else ["--no-nvml"]) + ([] if wait is None else ["--wait", wait])
    args += ([] if not devices or devices == DEFAULT_DEVICES else ["--devices", devices])
    args += ["--fd-holders"] if holders else []
    return guarded(python, python_script(python, "probe_gpu.py", *args, install=True), missing)


class Gpus(FactBase):
    """
    GPUs and their compute processes, via pynvml with an nvidia-smi fallback, in one round trip.

    Every argument has a default from the host's data, so ``pyinfra INVENTORY fact operations.facts.gpu.Gpus``
    reads a host as specops' operations do; the fact is the probe's JSON document (``model.gpus.parse_probe``
    reads it).

    + python: the interpreter on the host that runs the probe (pynvml is used if it can import it; default: host
      data ``specops_python``, else python3)
    + nvml: set False to skip pynvml and read nvidia-smi only
    + wait: JSON condition the probe samples for on the host before answering (see probe_gpu.py)
    + devices: glob of the GPU device files a CUDA process holds open (default ``/dev/nvidia*``; host data
      ``specops_gpu_devices``)
    + holders: also list every local process that holds such a device open

    **Example:**

    .. code:: python

        doc = host.get_fact(Gpus, python="/opt/sglang/bin/python")
        state = parse_probe(doc)  # operations.model.gpus.GpuState
        if not state.available:
            print(state.error)
    """

    @staticmethod
    def default() -> dict:
        return {"source": "none", "errors": ["probe produced no output"]}

    def command(self, python: str | None = None, nvml: bool = True, wait: str | None = None,
                devices: str | None = None, holders: bool = False):
        from pyinfra import host  # the host this fact is read on (the CLI and operations both set it)

        return probe_command(host_python(python, host), nvml, wait, devices or gpu_devices(host), holders)

    def process(self, output: list[str]) -> dict:
        return read_document(output, parse_probe, "GPU probe output")


def gpu_devices(on_host) -> str:
    """The device glob for this host: host data ``specops_gpu_devices``, else /dev/nvidia*."""
    return on_host.data.get("specops_gpu_devices") or DEFAULT_DEVICES


def read_gpus(on_host, python: str, **kwargs) -> GpuState:
    """The Gpus fact of ``on_host`` with its device glob, as a GpuState (what every specops operation reads)."""
    return parse_probe(on_host.get_fact(Gpus, python=python, devices=gpu_devices(on_host), **kwargs))
