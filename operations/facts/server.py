"""The ``Server`` fact: what the server specops manages in a directory is doing, as server_ctl's JSON document."""
from __future__ import annotations

import json

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from operations.controller.remote import guarded, python_script
from operations.model.server_state import ServerStatus, parse_status


class Server(FactBase):
    """
    The server specops manages in ``directory``: liveness, recorded config hash, /health and /server_info.

    + directory: the server's state directory on the host
    + port: the port it serves on
    + unit: systemd unit name when supervised by systemd
    + python: interpreter on the host that runs the check
    """

    @staticmethod
    def default() -> dict:
        return {"error": "no output"}

    def command(self, directory: str, port: int, unit: str | None = None, python: str = "python3"):
        args = ["status", directory, str(port)] + ([unit] if unit else [])
        missing = json.dumps({"error": f"{python} not found on host"})
        return guarded(python, python_script(python, "server_ctl.py", *args), missing)

    def process(self, output: list[str]) -> dict:
        try:
            doc = json.loads("\n".join(output))
            parse_status(doc)  # refuse a document the model cannot read here, where the output is at hand
            return doc
        except (ValueError, KeyError, TypeError) as exc:
            raise FactProcessError(f"unreadable server status: {exc}") from exc


def read_server(on_host, sup, port: int, python: str) -> ServerStatus:
    """The Server fact of ``on_host`` for supervisor ``sup``'s directory and unit, as a ServerStatus."""
    return parse_status(on_host.get_fact(Server, directory=sup.directory, port=port, unit=sup.unit, python=python))
