"""The run summary: which hosts converged, which failed (and in which operation), which were unreachable.

pyinfra reports each failure where it happens; with many hosts those lines scroll away, so specops operations
register this watcher and one summary line per outcome is printed when the run ends. It also tells a rolling
update which hosts already failed the current operation (``failed_in``).
"""
from __future__ import annotations

import atexit

from pyinfra import logger
from pyinfra.api.state import BaseStateCallback, State
from pyinfra.context import ctx_state

_watchers: dict[int, "RunSummary"] = {}


class RunSummary(BaseStateCallback):
    def __init__(self, state):
        self.state = state
        self.errors: dict[str, list[str]] = {}  # host -> names of the operations it failed
        self.failed_ops: dict[str, set[str]] = {}  # op hash -> hosts that failed it

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):
        if retry_count < max_retries:
            return  # pyinfra retries it
        self.failed_ops.setdefault(op_hash, set()).add(host.name)
        names = state.get_op_meta(op_hash).names
        self.errors.setdefault(host.name, []).append(", ".join(sorted(names)) or op_hash[:8])

    def lines(self) -> list[str]:
        state = self.state
        everyone = [h.name for h in state.inventory]
        activated = {h.name for h in state.activated_hosts}
        unreachable = [name for name in everyone if name not in activated]
        unfinished = self._unfinished() if state.is_executing else {}
        failed = [name for name in everyone if name in self.errors or name in unfinished]
        fine = [name for name in everyone if name in activated and name not in failed]
        out = [f"converged: {len(fine)} host(s)" + (f" ({', '.join(fine)})" if 0 < len(fine) <= 8 else "")]
        out += [f"FAILED {name}: {'; '.join(self.errors[name])}" if name in self.errors else
                f"FAILED {name}: {unfinished[name]} (did not finish: the run stopped on the error printed above)"
                for name in failed]
        out += [f"UNREACHABLE {name}: could not connect (the error is printed above); nothing was done there"
                for name in unreachable]
        return out

    def _unfinished(self) -> dict[str, str]:
        """Hosts with an operation that never completed (it raised, e.g. a config error found on the host, so
        pyinfra reported no host error for it): host -> that operation's name."""
        out = {}
        for h in self.state.activated_hosts:
            for op_hash in self.state.get_op_order():
                data = self.state.ops.get(h, {}).get(op_hash)
                if data is not None and not data.operation_meta.is_complete():
                    out[h.name] = ", ".join(sorted(self.state.get_op_meta(op_hash).names)) or op_hash[:8]
                    break
        return out

    def print(self) -> None:
        if not (self.state.is_executing or len(self.state.activated_hosts) < len(list(self.state.inventory))):
            return
        logger.info("--> specops summary:")
        for line in self.lines():
            logger.info(f"    {line}")


def watch(state) -> RunSummary:
    """The run's summary watcher (registered once per pyinfra state; printed at exit)."""
    state = state if isinstance(state, State) else ctx_state.get()  # the real state, not the context proxy
    summary = _watchers.get(id(state))
    if summary is None or summary.state is not state:
        summary = _watchers[id(state)] = RunSummary(state)
        state.add_callback_handler(summary)
        if isinstance(state, State):  # a real run (not an op-fixture harness): print when pyinfra exits
            atexit.register(summary.print)
    return summary


def failed_in(state, op_hash: str) -> set[str]:
    """Hosts that have already failed operation ``op_hash`` in this run (earlier batches of a rollout)."""
    return set(watch(state).failed_ops.get(op_hash, ()))
