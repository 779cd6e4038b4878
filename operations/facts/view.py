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
    + engine_key: also return, as ``engine``, the verdict the host kept from its engine's check of the command
      line with this key (``operations.facts.engine.engine_key``; null when none is kept or SGLang changed since)

    **Example:**

    .. code:: python

        doc = host.get_fact(HostView, server_name="llm", port=30000)
        gpus, server = parse_probe(doc["gpus"]), parse_status(doc["server"])
    """

    @staticmethod
    def default() -> dict:
        return {"gpus": {"source": "none", "errors": ["no output"]}, "server": {"error": "no output"}}

    def command(self, server_name: str = "llm", port: int = 30000, directory: str | None = None,
                unit: str | None = None, python: str | None = None, devices: str | None = None,
                engine_key: str | None = None):
        from pyinfra import host  # the host this fact is read on (the CLI and operations both set it)

        python = host_python(python, host)
        if directory is None:
            sup = supervisors.for_host(server_name, None, None, python, host)
            directory, unit = sup.directory, unit or sup.unit
        missing = f"{python} not found on host"
        fallback = json.dumps({"gpus": {"source": "none", "errors": [missing]}, "server": {"error": missing}})
        args = [devices or gpu_devices(host), directory, str(port)] + ([unit] if unit else []) + (
            ["--engine", engine_key] if engine_key else [])
        return guarded(python, python_script(python, "observe.py", *args, install=True), fallback)

    def process(self, output: list[str]) -> dict:
        return read_document(output, _check, "host view")


def read_view(on_host, sup, port: int, python: str, engine_key: str | None = None
              ) -> tuple[GpuState, ServerStatus, dict | None]:
    """GPUs, supervisor ``sup``'s server and the kept engine verdict for ``engine_key`` on ``on_host``, in one
    round trip."""
    doc = on_host.get_fact(HostView, directory=sup.directory, port=port, unit=sup.unit, python=python,
                           devices=gpu_devices(on_host), **({"engine_key": engine_key} if engine_key else {}))
    return parse_probe(doc["gpus"]), parse_status(doc["server"]), doc.get("engine")
