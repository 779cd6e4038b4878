"""The run summary: which hosts converged, which failed (and in which operation), which were unreachable.

pyinfra reports each failure where it happens; with many hosts those lines scroll away, so specops operations
register this watcher and one summary line per outcome is printed when the run ends. It also tells a rolling
update which hosts already failed the current operation (``failed_in``).

Failures an operation can already see while pyinfra prepares (``--dry``, or before the confirmation prompt) go
through ``failure()``: the host is printed as "will fail" with the reason, counted in pyinfra's
``state.failed_hosts`` so ``--dry`` exits 1 (pyinfra's own rule for failed hosts), and listed in the summary and
by ``python -m operations.plan``. When the run goes on to execute, those predictions are withdrawn again: what
happens then decides.
"""
from __future__ import annotations

import atexit

from pyinfra import logger
from pyinfra.api import FunctionCommand
from pyinfra.api.state import BaseStateCallback, State
from pyinfra.context import ctx_host, ctx_state

from operations.controller import run_state


class RunSummary(BaseStateCallback):
    def __init__(self, state):
        self.state = state
        self.errors: dict[str, list[str]] = {}  # host -> names of the operations it failed
        self.failed_ops: dict[str, set[str]] = {}  # op hash -> hosts that failed it
        self.predicted: dict[str, list[str]] = {}  # host -> why it will fail (seen while preparing)
        self._counted: set = set()  # hosts this watcher put in state.failed_hosts while preparing

    def predict(self, host, message: str) -> None:
        if message in self.predicted.get(host.name, ()):
            return
        self.predicted.setdefault(host.name, []).append(message)
        host.log_styled(f"will fail: {message}", fg="red", log_func=logger.error)
        if isinstance(self.state, State) and host not in self.state.failed_hosts:
            self.state.failed_hosts.add(host)  # pyinfra's CLI exits 1 with failed hosts (--dry included)
            self._counted.add(host)

    def operation_start(self, state, op_hash):
        # execution begins: withdraw the predictions, the real outcome counts from here (a host pyinfra itself
        # failed meanwhile, e.g. on a fact error, has left active_hosts and stays failed)
        for host in self._counted:
            if host in state.active_hosts:
                state.failed_hosts.discard(host)
        self._counted.clear()
        self.predicted.clear()

    def operation_host_start(self, state, host, op_hash):
        if self._counted or self.predicted:  # --serial and --no-wait start hosts without an operation_start
            self.operation_start(state, op_hash)

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
        gone = [f"UNREACHABLE {name}: could not connect (the error is printed above); nothing was done there"
                for name in unreachable]
        if not state.is_executing and self.predicted:  # a dry run: what would fail, not what converged
            return [f"WOULD FAIL {name}: {'; '.join(why)}" for name, why in self.predicted.items()] + gone
        return out + gone

    def _unfinished(self) -> dict[str, str]:
        """Hosts with an operation that never completed (it raised, e.g. a config error found on the host, so
        pyinfra reported no host error for it): host -> that operation's name."""
        out = {}
        for h in self.state.activated_hosts:
            for op_hash in self.state.get_op_order():
                try:
                    data = self.state.get_op_data_for_host(h, op_hash)
                except KeyError:  # not an operation of this host
                    continue
                # operation_meta.is_complete() is the only record of "never finished": no public accessor for it
                if not data.operation_meta.is_complete():
                    out[h.name] = ", ".join(sorted(self.state.get_op_meta(op_hash).names)) or op_hash[:8]
                    break
        return out

    def print(self) -> None:
        if not (self.state.is_executing or self.predicted
                or len(self.state.activated_hosts) < len(list(self.state.inventory))):
            return
        logger.info("--> specops summary:")
        for line in self.lines():
            logger.info(f"    {line}")


def watch(state) -> RunSummary:
    """The run's summary watcher (made once per run, kept on its State; printed at exit)."""
    return run_state.scoped(state, "summary", _new_watcher)


def _new_watcher(state) -> RunSummary:
    summary = RunSummary(state)
    state.add_callback_handler(summary)
    if isinstance(state, State):  # a real run (not an op-fixture harness): print when pyinfra exits
        atexit.register(summary.print)  # pyinfra has no public end-of-run hook that also fires on an abort
        from operations.controller.interrupt import install

        install()  # Ctrl-C stops signalling and starts (see operations/controller/interrupt.py)
    return summary


def failed_in(state, op_hash: str) -> set[str]:
    """Hosts that have already failed operation ``op_hash`` in this run (earlier batches of a rollout)."""
    return set(watch(state).failed_ops.get(op_hash, ()))


def failure(message: str) -> FunctionCommand:
    """The command that fails this host with ``message``; while preparing, also the prediction (see above)."""
    state, host = ctx_state.get(), ctx_host.get()
    if not state.is_executing:
        watch(state).predict(host, message)
    return FunctionCommand(_fail, (message,), {})


def _fail(state, host, message: str) -> bool:  # (state, host) signature: returning False fails this host only
    host.log_styled(message, fg="red", log_func=logger.error)
    return False
