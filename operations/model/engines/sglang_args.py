"""SGLang 0.5.23's own ``launch_server`` argument table (data/sglang-0.5.23-server-args.tsv), as argparse declares
it: options, dest, default, choices, type, nargs, action. Used to validate and render flags without SGLang."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

TABLE = "sglang-0.5.23-server-args.tsv"
SGLANG_VERSION = "0.5.23"


@dataclass(frozen=True)
class Flag:
    options: tuple[str, ...]  # e.g. ("--model-path", "--model")
    dest: str
    default: object
    choices: tuple | None
    type: str | None  # "str" | "int" | "float" | "loads" | ... (the converter's name)
    nargs: str | None  # None | "0" | "+" | "*" | "?"
    action: str

    @property
    def option(self) -> str:
        return self.options[0]

    @property
    def is_switch(self) -> bool:
        return self.nargs == "0"

    @property
    def negated(self) -> str | None:
        """``--no-x`` for BooleanOptionalAction flags."""
        return next((o for o in self.options if o.startswith("--no-")), None)


def _value(cell: str) -> str:
    return cell.split("= ", 1)[1].strip()


_PLAIN = {"None": None, "True": True, "False": False, "[]": []}


def _literal(text: str):
    if text in _PLAIN:  # most cells: a quarter of a deploy's start-up went into literal_eval of these
        value = _PLAIN[text]
        return [] if value == [] else value
    if text.isdigit():
        return int(text)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


@lru_cache(maxsize=1)
def rows() -> tuple[dict, ...]:
    """Every flag of the table in the parser's order (-h left out): options, dest, default, choices, type, nargs,
    action. Two flags may share a dest (``--enable-amd-monokernel`` and the deprecated ``--monokernel-backend``)."""
    out = []
    for line in resources.files(__package__).joinpath("data", TABLE).read_text().splitlines():
        cells = line.split("\t")
        if len(cells) != 7:
            continue
        options = tuple(o.strip() for o in cells[0].split("|"))
        dest, default, choices, typ, nargs, action = (_value(c) for c in cells[1:])
        if action == "_HelpAction":
            continue
        out.append({"options": options, "dest": dest, "default": _literal(default), "choices": _literal(choices),
                    "type": None if typ == "None" else typ, "nargs": None if nargs == "None" else nargs,
                    "action": action})
    return tuple(out)


@lru_cache(maxsize=1)
def flags() -> dict[str, Flag]:
    """dest -> Flag. Where flags share a dest the first, the flag itself, is kept: a deprecated alias declared
    later (``--monokernel-backend`` for ``--enable-amd-monokernel``) would otherwise validate and render it."""
    table: dict[str, Flag] = {}
    for r in rows():
        table.setdefault(r["dest"], Flag(r["options"], r["dest"], r["default"],
                                         tuple(r["choices"]) if r["choices"] else None, r["type"], r["nargs"],
                                         r["action"]))
    return table


@lru_cache(maxsize=1)
def by_option() -> dict[str, Flag]:
    """every option string (and its dest spelled with dashes) -> Flag."""
    table = {}
    for flag in flags().values():
        for option in flag.options:
            table[option.lstrip("-")] = flag
    return table


def lookup(key: str) -> Flag | None:
    """A config key in SGLang ``--config`` style: ``model-path``, ``model_path`` or an alias like ``model``."""
    key = key.strip()
    return flags().get(key.replace("-", "_")) or by_option().get(key.replace("_", "-"))


def defaults() -> dict[str, object]:
    return {dest: flag.default for dest, flag in flags().items()}


_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def human_readable_int(text: str):
    """SGLang's ``human_readable_int``: ``16k`` -> 16000, ``4Ki`` -> 4096; the text itself when it is not one."""
    import re
    from decimal import Decimal, InvalidOperation

    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", text.strip())
    try:
        if m:
            number, suffix = m.groups()
            return int(number) * _IEC[suffix] if suffix in _IEC else int(Decimal(number) * _SI[suffix])
        return int(text)
    except (ValueError, InvalidOperation):
        return text


def as_parsed(flag: Flag, value):
    """``value`` as SGLang's parser turns it into the field it reports: the command line carries ``str(value)``,
    then the flag's type converts it (``served-model-name: 8`` -> ``'8'``, ``16k`` -> 16000, a JSON string -> its
    object, a single value of an ``nargs +`` flag -> a list)."""
    import json

    if value is None or flag.is_switch:
        return value
    if flag.nargs in ("+", "*"):
        items = value if isinstance(value, list) else [value]
        return [as_parsed(Flag(flag.options, flag.dest, None, flag.choices, flag.type, None, flag.action), v)
                for v in items]
    if flag.type in ("loads", "json_list_type") and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if flag.type in ("str", "nullable_str") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if flag.type == "human_readable_int" and isinstance(value, str):
        return human_readable_int(value)
    if flag.type == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
