"""The plan as a CI gate, Terraform-style: ``python -m operations.plan INVENTORY DEPLOY [pyinfra options]``.

It runs pyinfra's own dry run (``pyinfra --dry INVENTORY DEPLOY ...``, in this process, so its output and
``--diff`` are pyinfra's), then sums it up and exits:

    0  converged: nothing would change
    2  changes pending (each listed: host and operation)
    1  would fail or failed: a host unreachable, a fact that could not be read, a failure an operation already
       sees (blocked GPUs, unreadable GPU memory, no driver, an unsafe state directory, ...), or a deploy that
       could not be prepared (a config error); each with the host and the reason

**Examples:**

.. code:: sh

    python -m operations.plan inventory/sim.py deploy.py --data config=baseline-llama3.1-8b
    python -m operations.plan inventory/prod.py deploy.py --diff || [ $? -eq 2 ]   # changes are fine, failures not
"""
from __future__ import annotations

import sys

CONVERGED, FAILING, PENDING = 0, 1, 2


def _pyinfra(argv: list[str]) -> int:
    from pyinfra_cli.main import main as pyinfra_main

    saved = sys.argv
    sys.argv = ["pyinfra", "--dry", *argv]
    try:
        pyinfra_main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def verdict(state, exit_code: int) -> tuple[int, list[str]]:
    """(exit code, lines) from pyinfra's state after its dry run."""
    from pyinfra_cli.prints import build_plan_json

    from operations.controller.summary import watch

    if state is None:
        return FAILING, ["! the deploy could not be prepared (the error is printed above)"]
    predicted = watch(state).predicted
    everyone = [h.name for h in state.inventory]
    activated = {h.name for h in state.activated_hosts}
    failed = {h.name for h in state.failed_hosts}
    lines = [f"! UNREACHABLE {name}: could not connect (the error is printed above)"
             for name in everyone if name not in activated]
    for name in everyone:
        if name in predicted:
            lines += [f"! {name}: {why}" for why in predicted[name]]
        elif name in failed and name in activated:
            lines.append(f"! {name}: failed while preparing (the error is printed above)")
    failing = set(predicted) | failed | (set(everyone) - activated)
    pending = [f"~ {name}: {op['name']}" for op in build_plan_json(state)
               for name in op["hosts_with_change"] + op["hosts_with_conditional_change"] if name not in failing]
    if lines or exit_code != 0:
        if not lines:
            lines.append("! the dry run failed (the error is printed above)")
        return FAILING, lines + pending
    return (PENDING, pending) if pending else (CONVERGED, [f"= {len(activated)} host(s) converged, nothing to change"])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else FAILING
    if any(a in ("-y", "--yes") for a in argv):
        print("operations.plan only plans (pyinfra --dry): drop -y/--yes", file=sys.stderr)
        return FAILING
    code = _pyinfra(argv)
    from pyinfra.context import ctx_state

    result, lines = verdict(ctx_state.get() if ctx_state.isset() else None, code)
    word = {CONVERGED: "converged", PENDING: "changes pending", FAILING: "would fail"}[result]
    print(f"--> specops plan: {word} (exit {result})")
    for line in lines:
        print(f"    {line}")
    return result


if __name__ == "__main__":
    sys.exit(main())
