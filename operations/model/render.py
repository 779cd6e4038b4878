"""Rendering the jinja2 templates shipped with specops (top-level ``templates/``, ``operations.templates`` once
installed). Every value a template puts on a command line goes through the ``sh`` filter (shlex.quote)."""
from __future__ import annotations

import shlex
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2


def templates_root():
    try:
        return resources.files("operations.templates")
    except ModuleNotFoundError:  # running from a source checkout: templates/ beside operations/
        return Path(__file__).resolve().parents[2] / "templates"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    root = templates_root()

    def load(name: str) -> str:
        return root.joinpath(name).read_text()

    env = jinja2.Environment(loader=jinja2.FunctionLoader(load), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    env.filters["sh"] = lambda value: shlex.quote(str(value))
    return env


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)
