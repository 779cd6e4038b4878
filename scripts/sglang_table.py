"""Regenerate operations/model/engines/data/sglang-<version>-server-args.tsv from an installed SGLang's own argparse parser.

Run it with the SGLang interpreter (e.g. .venv-sglang/bin/python scripts/sglang_table.py):

    python scripts/sglang_table.py           # (re)write operations/model/engines/data/sglang-<version>-server-args.tsv
    python scripts/sglang_table.py --check   # compare with that file: print a unified diff and exit 1 if different
    python scripts/sglang_table.py --stdout  # print the table

The parser is built exactly as ``sglang.srt.server_args.prepare_server_args`` builds it
(``argparse.ArgumentParser(prog="sglang serve")`` + ``ServerArgs.add_cli_args``); one line per argparse action, in
declaration order: ``option|alias \\tdest= D \\tdefault= repr \\tchoices= repr \\ttype= name \\tnargs= N
\\taction= ClassName`` (the format operations/model/engines/sglang_args.py reads). Choices are written as a list; SGLang keeps a
few in a set, which has no order: those are written sorted, and ``--check`` accepts any order for them.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import logging
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "operations" / "model" / "engines" / "data"


def _type_name(action: argparse.Action) -> str:
    typ = action.type
    if typ is None:
        return "None"
    return getattr(typ, "__name__", None) or type(typ).__name__


def _nargs(action: argparse.Action) -> str:
    return str(action.nargs)


def _choices(action: argparse.Action):
    """Choices as a list: tuples as lists, sets sorted (a set's order changes with the hash seed)."""
    choices = action.choices
    if isinstance(choices, (set, frozenset)):
        return sorted(choices, key=repr)
    if isinstance(choices, tuple):
        return list(choices)
    return choices


def row(action: argparse.Action) -> str:
    cells = ["|".join(action.option_strings), f"dest= {action.dest}", f"default= {action.default!r}",
             f"choices= {_choices(action)!r}", f"type= {_type_name(action)}", f"nargs= {_nargs(action)}",
             f"action= {type(action).__name__}"]
    return " \t".join(cells)


def _unordered_key(line: str) -> str:
    """The line with its choices cell sorted: for flags whose choices SGLang keeps in a set (no order)."""
    cells = line.rstrip("\n").split(" \t")
    for i, cell in enumerate(cells):
        if cell.startswith("choices= "):
            try:
                cells[i] = "choices= " + repr(sorted(ast.literal_eval(cell[len("choices= "):]), key=repr))
            except (ValueError, SyntaxError, TypeError):
                pass
    return " \t".join(cells)


def build_table() -> tuple[str, str, set[str]]:
    """(version, table text, dests whose choices are unordered) from the running interpreter's SGLang."""
    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sglang
        from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args builds it
    ServerArgs.add_cli_args(parser)
    actions = [a for a in parser._actions if a.option_strings]
    unordered = {a.dest for a in actions if isinstance(a.choices, (set, frozenset))}
    return sglang.__version__, "\n".join(row(a) for a in actions) + "\n", unordered


def _dest(line: str) -> str | None:
    return next((c[len("dest= "):] for c in line.split(" \t") if c.startswith("dest= ")), None)


def same_table(shipped: str, live: str, unordered: set[str]) -> bool:
    """Equal line for line, except that a set-valued choices cell may list its members in any order."""
    a, b = shipped.splitlines(), live.splitlines()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        if _dest(y) not in unordered or _unordered_key(x) != _unordered_key(y):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="diff against the shipped table; exit 1 when different")
    mode.add_argument("--stdout", action="store_true", help="print the table instead of writing it")
    p.add_argument("--output", type=Path, help="table file (default operations/model/engines/data/sglang-<version>-server-args.tsv)")
    args = p.parse_args(argv)
    version, text, unordered = build_table()
    target = args.output or DATA / f"sglang-{version}-server-args.tsv"
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        if not target.is_file():
            print(f"{target}: missing (SGLang {version} has {text.count(chr(10))} flags)", file=sys.stderr)
            return 1
        shipped = target.read_text()
        if same_table(shipped, text, unordered):
            print(f"{target}: matches SGLang {version}'s parser ({text.count(chr(10))} lines)")
            return 0
        def norm(t):  # set-valued choices sorted on both sides: their order is not a difference
            return [_unordered_key(x) + "\n" if _dest(x) in unordered else x + "\n" for x in t.splitlines()]
        sys.stdout.writelines(difflib.unified_diff(norm(shipped), norm(text),
                                                   fromfile=f"{target} (shipped)",
                                                   tofile=f"SGLang {version} argparse"))
        return 1
    target.write_text(text)
    print(f"wrote {target} ({text.count(chr(10))} lines, SGLang {version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
