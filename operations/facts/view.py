"""The ``HostView`` fact: a host's GPUs and one server's status in one round trip (what ``server.running``
reads first; a no-op converge is this one SSH command)."""
from __future__ import annotations

import json

from pyinfra.api import FactBase

from operations.controller import supervisors
from operations.controller.remote import guarded, host_python, python_script
from operations.facts.document import read_document
from operations.facts.gpu import gpu_devices
from operations.model.gpus import GpuState, parse_probe
from operations.model.server_state import ServerStatus, parse_status


def _check(doc: dict) -> None:
    parse_probe(doc["gpus"]), parse_status(doc["server"])


class HostView(FactBase):
    """
    The host's GPUs (as the ``Gpus`` fact) and the server specops manages in ``directory`` (as the ``Server``
    fact), read by one host program: ``{"gpus": ..., "server": ...}``.

    + server_name, port, directory, unit, python: as for ``operations.facts.server.Server``
    + devices: GPU device glob, as for ``operations.facts.gpu.Gpus``

    **Example:**

    .. code:: python

        doc = host.get_fact(HostView, server_name="llm", port=30000)
        gpus, server = parse_probe(doc["gpus"]), parse_status(doc["server"])
    """

    @staticmethod
    def default() -> dict:
        return {"gpus": {"source": "none", "errors": ["no output"]}, "server": {"error": "no output"}}

    def command(self, server_name: str = "llm", port: int = 30000, directory: str | None = None,
                unit: str | None = None, python: str | None = None, devices: str | None = None):
        from pyinfra import host  # the host this fact is read on (the CLI and operations both set it)

        python = host_python(python, host)
        if directory is None:
            sup = supervisors.for_host(server_name, None, None, python, host)
            directory, unit = sup.directory, unit or sup.unit
        missing = f"{python} not found on host"
        fallback = json.dumps({"gpus": {"source": "none", "errors": [missing]}, "server": {"error": missing}})
        args = [devices or gpu_devices(host), directory, str(port)] + ([unit] if unit else [])
        return guarded(python, python_script(python, "observe.py", *args, install=True), fallback)

    def process(self, output: list[str]) -> dict:
        return read_document(output, _check, "host view")


def read_view(on_host, sup, port: int, python: str) -> tuple[GpuState, ServerStatus]:
    """GPUs and supervisor ``sup``'s server on ``on_host``, in one round trip."""
    doc = on_host.get_fact(HostView, directory=sup.directory, port=port, unit=sup.unit, python=python,
                           devices=gpu_devices(on_host))
    return parse_probe(doc["gpus"]), parse_status(doc["server"])
