"""SGLang 0.5.23's launch-server command line, re-implemented for simulated hosts: the parser (every flag of the
table specops ships, operations/model/engines/data/sglang-0.5.23-server-args.tsv, with the action classes SGLang registers them
with), ``--config FILE.yaml`` merging (utils/server_args_config_parser.py), ``ServerArgs`` and
``prepare_server_args`` (srt/server_args.py).

The stand-in server and the stand-in ``sglang`` package (gpusim/engine/sglang, what ``DIR/bin/python`` puts on
PYTHONPATH) both use this module, so a simulated host parses exactly one way. Resolution (what SGLang decides
from the given flags) is gpusim/srt_resolve.py.

Host settings (``$GPUSIM_ROOT/host.json``): ``sglang_removed_flags``, a list of option strings (e.g.
``["--speculative-adaptive"]``) the simulated engine does not know, as an older SGLang would not.
"""
from __future__ import annotations

import argparse
import json
import os
import re
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

TABLE = "sglang-0.5.23-server-args.tsv"


# --- the action classes SGLang registers flags with (srt/arg_groups/argparse_actions.py) ----------------------
# Their class names matter: the config merger names them in "Unsupported config option" errors.

class LoRAPathAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        lora_paths = []
        for lora_path in values or []:
            lora_path = lora_path.strip()
            if lora_path.startswith("{") and lora_path.endswith("}"):
                obj = json.loads(lora_path)
                assert "lora_path" in obj and "lora_name" in obj, (
                    f"{repr(lora_path)} looks like a JSON str, "
                    "but it does not contain 'lora_name' and 'lora_path' keys.")
                lora_paths.append(obj)
            else:
                lora_paths.append(lora_path)
        setattr(namespace, self.dest, lora_paths)


def _deprecated_warning(message: str) -> None:
    import logging
    logging.getLogger("sglang.srt.arg_groups.argparse_actions").warning(f"\033[1;33m{message}\033[0m")


class DeprecatedStoreTrueAction(argparse.Action):
    """Deprecated flag that still stores True and prints a warning."""

    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        _deprecated_warning(f"'{option_string}' is deprecated and will be removed in a future release.{replacement}")
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    """An old valued flag whose one accepted value became a boolean (``--monokernel-backend amd``)."""

    def __init__(self, option_strings, dest, new_flag=None, const_value=None, nargs=0, default=None, **kwargs):
        self.new_flag = new_flag
        self.const_value = const_value
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        _deprecated_warning(f"'{option_string}' is deprecated and will be removed in a future release.{replacement}")
        setattr(namespace, self.dest, self.const_value)


# --- argparse types of the table (srt/utils/common.py, model_executor/cuda_graph_config.py) --------------------

def nullable_str(val: str):
    if not val or val == "None":
        return None
    return val


def human_readable_int(value: str) -> int:
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'.")
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes "
            "(1Ki, 1Mi). Suffixes are case-sensitive.") from None


def json_list_type(value):
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"Invalid JSON list: {value}. Please provide a valid JSON list.") from None


def parse_cuda_graph_backend_arg(raw: str) -> str:
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError("tc_piecewise was removed; select breakable, full, or disabled")
    return raw


def parse_cuda_graph_config_arg(raw: str) -> dict:
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}")
    return parsed


_TYPES = {"int": int, "float": float, "str": str, "loads": json.loads, "human_readable_int": human_readable_int,
          "json_list_type": json_list_type, "nullable_str": nullable_str,
          "parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
          "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg}


# --- the table ----------------------------------------------------------------------------------------------

def rows() -> tuple[dict, ...]:
    """Every flag of the table in parser order (-h excluded), as operations.model.engines.sglang_args reads it: the flag table
    is SGLang's own, shipped with specops; rows (not its dest-keyed flags()) keep both flags sharing a dest."""
    from operations.model.engines import sglang_args

    return sglang_args.rows()


@lru_cache(maxsize=1)
def field_defaults() -> dict:
    """ServerArgs' fields (every dest but ``config``, which is no field) and their declared defaults."""
    out: dict = {}
    for row in rows():
        if row["dest"] != "config":
            out.setdefault(row["dest"], row["default"])
    return out


def host_settings() -> dict:
    root = os.environ.get("GPUSIM_ROOT")
    if not root:
        return {}
    try:
        return json.loads(Path(root, "host.json").read_text())
    except (OSError, ValueError):
        return {}


def removed_flags() -> set[str]:
    removed = host_settings().get("sglang_removed_flags") or []
    return {str(o) for o in removed} if isinstance(removed, list) else set()


# what the table does not record: argparse keywords SGLang passes besides options, dest, default, type, nargs,
# choices and action (checked against the real parser's actions)
_EXTRA_KW = {"model_path": {"required": True}, "model_checksum": {"const": ""}}


def add_table_args(parser: argparse.ArgumentParser, removed: set[str] | frozenset = frozenset()) -> None:
    for row in rows():
        options = [o for o in row["options"] if o not in removed]
        kw: dict = {"dest": row["dest"], "default": row["default"], **_EXTRA_KW.get(row["dest"], {})}
        action = row["action"]
        if action == "BooleanOptionalAction":
            positive = [o for o in options if not o.startswith("--no-")]
            if positive:
                parser.add_argument(*positive, action=argparse.BooleanOptionalAction, **kw)
            continue
        if not options:
            continue
        if action == "_StoreTrueAction":
            parser.add_argument(*options, action="store_true", **kw)
        elif action == "DeprecatedStoreTrueAction":
            parser.add_argument(*options, action=DeprecatedStoreTrueAction, **kw)
        elif action == "DeprecatedStoreConstAction":
            parser.add_argument(*options, action=DeprecatedStoreConstAction, nargs=None, const_value=True,
                                choices=list(row["choices"] or []) or None, **kw)
        else:
            kw["type"] = _TYPES.get(row["type"] or "str", str)
            if row["nargs"] in ("+", "*", "?"):
                kw["nargs"] = row["nargs"]
            if row["choices"]:
                kw["choices"] = list(row["choices"])
            if action == "LoRAPathAction":
                kw["action"] = LoRAPathAction
            parser.add_argument(*options, **kw)


# --- --config FILE.yaml (srt/utils/server_args_config_parser.py) ----------------------------------------------

def _config_keys(action: argparse.Action) -> set[str]:
    # YAML keys may use any long spelling of a flag, not just the one matching dest.
    return {action.dest} | {o[2:].replace("-", "_") for o in action.option_strings if o.startswith("--")}


def _takes_one_value(action: argparse.Action) -> bool:
    return isinstance(action, argparse._StoreAction) or action.nargs is None


class ConfigArgumentMerger:
    """Merges a YAML config file's keys into the command line: config arguments go first, so CLI > config >
    defaults. Only store_true, store and other single-value actions can be set from the file."""

    def __init__(self, parser: argparse.ArgumentParser = None, boolean_actions: list[str] = None):
        if parser is not None:
            self.parser = parser
            self.store_true_actions = [key for a in parser._actions if isinstance(a, argparse._StoreTrueAction)
                                       for key in _config_keys(a)]
            supported = [a for a in parser._actions if isinstance(a, argparse._StoreTrueAction) or _takes_one_value(a)]
            supported_keys = {key for a in supported for key in _config_keys(a)}
            self.unsupported_actions = {
                key: a for a in parser._actions
                if a.option_strings and a not in supported and "--config" not in a.option_strings
                and "--help" not in a.option_strings and "-h" not in a.option_strings
                for key in _config_keys(a) if key not in supported_keys}
        elif boolean_actions is not None:
            self.store_true_actions = boolean_actions
            self.unsupported_actions = {}
        else:
            self.store_true_actions = []
            self.unsupported_actions = {}

    def merge_config_with_args(self, cli_args: list[str]) -> list[str]:
        config_file_path = self._extract_config_file_path(cli_args)
        if not config_file_path:
            return cli_args
        config_args = self._convert_config_to_args(self._parse_yaml_config(config_file_path))
        index = cli_args.index("--config")
        return config_args + cli_args[:index] + cli_args[index + 2:]

    def _extract_config_file_path(self, args: list[str]) -> str | None:
        indices = [i for i, arg in enumerate(args) if arg == "--config"]
        if len(indices) > 1:
            raise ValueError("Multiple config files specified! Only one allowed.")
        if not indices:
            return None
        if indices[0] == len(args) - 1:
            raise ValueError("No config file specified after --config flag!")
        return args[indices[0] + 1]

    def _parse_yaml_config(self, file_path: str) -> dict:
        import yaml

        self._validate_yaml_file(file_path)
        with open(file_path) as fh:
            data = yaml.safe_load(fh)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ValueError("Config file must contain a dictionary at root level")
        return data

    def _validate_yaml_file(self, file_path: str) -> None:
        path = Path(file_path)
        if path.suffix.lower() not in (".yaml", ".yml"):
            raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
        if not path.exists():
            raise ValueError(f"Config file not found: {file_path}")

    def _convert_config_to_args(self, config: dict) -> list[str]:
        args: list[str] = []
        for key, value in config.items():
            key_norm = key.replace("-", "_")
            if key_norm in self.unsupported_actions:
                action = self.unsupported_actions[key_norm]
                raise ValueError(f"Unsupported config option '{key_norm}' with action '{action.__class__.__name__}'")
            if isinstance(value, bool):
                if key_norm in self.store_true_actions:
                    if value:
                        args.append(f"--{key}")
                else:
                    args.extend([f"--{key}", str(value).lower()])
            elif isinstance(value, list):
                if value:
                    args.append(f"--{key}")
                    args.extend(str(item) for item in value)
            elif isinstance(value, dict):
                args.extend([f"--{key}", json.dumps(value)])
            else:
                args.extend([f"--{key}", str(value)])
        return args


# --- ServerArgs -------------------------------------------------------------------------------------------

class ServerArgs:
    """The operator's input (every field of the table, its default where not given); ``resolve_once`` applies
    SGLang's resolution (gpusim/srt_resolve.py) and ``resolved_dict`` reports the result, as /server_info does."""

    def __init__(self, **fields):
        unknown = set(fields) - set(field_defaults())
        if unknown:
            raise TypeError(f"unexpected ServerArgs field(s): {sorted(unknown)}")
        for name, default in field_defaults().items():
            setattr(self, name, fields.get(name, _copy(default)))
        self._launch_command = None
        self._resolved = None
        self._resolution_failed = False

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, removed: set[str] | None = None) -> None:
        """Every flag of the table, less the host's ``sglang_removed_flags`` (or ``removed``)."""
        add_table_args(parser, removed_flags() if removed is None else set(removed))

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        return cls(**{name: getattr(args, name) for name in field_defaults() if hasattr(args, name)})

    @property
    def launch_command(self) -> str | None:
        return self._launch_command

    def fields(self) -> dict:
        return {name: getattr(self, name) for name in field_defaults()}

    def resolve_once(self) -> None:
        if self._resolved is not None:
            return
        if self._resolution_failed:
            raise RuntimeError("resolution already failed on this ServerArgs; build a new record from the "
                               "corrected arguments.")
        from .srt_resolve import resolve

        try:
            self._resolved = resolve(self.fields())
        except BaseException:
            self._resolution_failed = True
            raise

    def resolved_dict(self) -> dict:
        self.resolve_once()
        return {k: _copy(v) for k, v in self._resolved.items()}

    def __repr__(self) -> str:
        return "ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in self.fields().items()) + ")"


def _copy(value):
    return json.loads(json.dumps(value)) if isinstance(value, (list, dict)) else value


def redact_watermark_command_line(argv, watermark_config=None) -> str:
    """srt/sampling/watermarking/core.py: the command line joined by spaces, the watermark config redacted
    (nothing else is: ``--api-key VALUE`` stays in clear)."""
    result, redact_next = [], False
    for argument in argv:
        if redact_next:
            result.append("<redacted>")
            redact_next = False
        elif watermark_config is not None and argument == watermark_config:
            result.append("<redacted>")
        elif watermark_config is not None and "=" in argument and argument.split("=", 1)[1] == watermark_config:
            result.append(f"{argument.split('=', 1)[0]}=<redacted>")
        elif argument == "--watermark-config":
            result.append(argument)
            redact_next = True
        elif argument.startswith("--watermark-config="):
            result.append("--watermark-config=<redacted>")
        else:
            result.append(argument)
    return " ".join(result)


def build_parser(removed: set[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser, removed)
    return parser


def prepare_server_args(argv: list[str], removed: set[str] | None = None) -> ServerArgs:
    """srt/server_args.py prepare_server_args: merge ``--config FILE.yaml`` (config first, so the command line
    wins), parse (argparse exits 2 on an unknown flag, as SGLang does), and keep the merged command line as
    ``launch_command``."""
    argv = list(argv)
    parser = build_parser(removed)
    if "--config" in argv:
        argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
    raw = parser.parse_args(argv)
    server_args = ServerArgs.from_cli_args(raw)
    server_args._launch_command = redact_watermark_command_line(argv, getattr(raw, "watermark_config", None))
    return server_args
