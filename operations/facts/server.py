"""The ``Server`` fact: what the server specops manages in a directory is doing, as server_ctl's JSON document."""
from __future__ import annotations

import json

from pyinfra.api import FactBase

from operations.controller import supervisors
from operations.controller.remote import guarded, host_python, python_script
from operations.facts.document import read_document
from operations.model.server_state import ServerStatus, parse_status


class Server(FactBase):
    """
    The server specops manages in ``directory``: liveness, recorded config hash, /health and /server_info.

    The fact is server_ctl's JSON document (``model.server_state.parse_status`` reads it). Without ``directory``,
    the server is found as ``server.running`` places it: ``server_name`` under host data ``specops_state_dir``
    with host data ``specops_supervisor``'s unit, so ``pyinfra INVENTORY fact operations.facts.server.Server``
    reads the default server.

    + server_name: the server's name (default ``llm``), when ``directory`` is not given
    + port: the port it serves on (default 30000, SGLang's)
    + directory: the server's state directory on the host
    + unit: systemd unit name when supervised by systemd
    + python: interpreter on the host that runs the check (default: host data ``specops_python``, else python3)
    """

    @staticmethod
    def default() -> dict:
        return {"error": "no output"}

    def command(self, server_name: str = "llm", port: int = 30000, directory: str | None = None,
                unit: str | None = None, python: str | None = None):
        from pyinfra import host  # the host this fact is read on (the CLI and operations both set it)

        python = host_python(python, host)
        if directory is None:
            sup = supervisors.for_host(server_name, None, None, python, host)
            directory, unit = sup.directory, unit or sup.unit
        args = ["status", directory, str(port)] + ([unit] if unit else [])
        missing = json.dumps({"error": f"{python} not found on host"})
        return guarded(python, python_script(python, "server_ctl.py", *args, install=True), missing)

    def process(self, output: list[str]) -> dict:
        return read_document(output, parse_status, "server status")


def read_server(on_host, sup, port: int, python: str) -> ServerStatus:
    """The Server fact of ``on_host`` for supervisor ``sup``'s directory and unit, as a ServerStatus."""
    return parse_status(on_host.get_fact(Server, directory=sup.directory, port=port, unit=sup.unit, python=python))
