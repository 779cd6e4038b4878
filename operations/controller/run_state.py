"""Run-scoped objects, kept on the run's own pyinfra ``State`` rather than in module globals keyed by ``id()``:
they live and die with the run, and two runs in one process (an API user, a test harness) never share one.

pyinfra offers no public slot for a library's per-run data, so specops keeps exactly one attribute on the State,
``_specops_run`` (a dict: name -> object), and touches nothing else of it here.
"""
from __future__ import annotations

from pyinfra.context import ContextObject, ctx_state

ATTR = "_specops_run"


def real(state):
    """The State itself, not pyinfra's context proxy (``from pyinfra import state``) that stands for it."""
    return ctx_state.get() if isinstance(state, ContextObject) else state


def scoped(state, name: str, factory):
    """This run's ``name`` object, made by ``factory(state)`` the first time the run asks for it."""
    state = real(state)
    store = state.__dict__.setdefault(ATTR, {})
    if name not in store:
        store[name] = factory(state)
    return store[name]


def peek(state, name: str):
    """This run's ``name`` object if one was made, else None."""
    return real(state).__dict__.get(ATTR, {}).get(name)
