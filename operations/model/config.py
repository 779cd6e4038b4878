"""Config X: the engine's own ``--config`` YAML file, unchanged, plus specops' settings beside it.

``configs/eagle3-llama3.1-8b.yaml`` is a file ``sglang serve --config`` accepts as it is; specops' settings
live in ``configs/eagle3-llama3.1-8b.specops.yaml`` (or in a ``specops:`` section of the file, which specops strips
before the engine sees it). On the host the engine is started from ``engine.yaml``, rendered from the engine part
with ``${VAR}`` references resolved and secrets left out (they go on the command line from a 0600 file).

.. code:: yaml

    model-path: meta-llama/Llama-3.1-8B-Instruct
    speculative-algorithm: EAGLE3
    speculative-draft-model-path: jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B
    speculative-num-steps: 3
    speculative-eagle-topk: 4
    speculative-num-draft-tokens: 16
    api-key: ${SGLANG_API_KEY}          # secret: resolved from the controller's environment
    specops:
      engine: sglang                    # or vllm
      min_accept_length: 2.0            # readiness: reported average accept length must reach this
      ready_timeout_s: 900
      env: {HF_TOKEN: "${HF_TOKEN}"}    # environment for the server; *TOKEN*/*KEY*/*SECRET* names are secret

Keys outside ``specops:`` are server arguments (``model-path``, ``model_path`` and aliases like ``model`` are the
same key). A config is selected with ``--data config=<name or path>`` (names look in ``configs/``) or passed as
a :class:`ServerConfig` to ``server.running``.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import yaml

from operations.errors import ConfigError, Issue
from operations.model.engines import engine_for
from operations.model.server_config import ENGINES, SPECOPS_KEYS, ServerConfig
from operations.model.shipped import ship
from operations.model.validation import specops_value_issues, validate

__all__ = ["ServerConfig", "from_mapping", "load", "known_configs"]  # ServerConfig: built here, defined in server_config
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

def _resolve_env_refs(value, where: str, issues: list[Issue], environ):
    if not isinstance(value, str):
        return value

    def sub(m):
        if m.group(1) not in environ:
            issues.append(Issue(where, f"environment variable {m.group(1)} is not set on the controller"))
            return ""
        return environ[m.group(1)]

    return _ENV_REF.sub(sub, value)


def _field(name: str) -> str:
    return name.replace("_", "-")


def from_mapping(data: dict, name: str, source: str = "<python>", environ=None,
                 base: Path | None = None) -> ServerConfig:
    """Build a config from a parsed YAML mapping; raises ConfigError listing every problem found here. ``base``:
    the config file's directory, where the files it names by relative path are read (``operations.model.shipped``)."""
    environ = os.environ if environ is None else environ
    issues: list[Issue] = []
    if not isinstance(data, dict):
        raise ConfigError([Issue("<file>", f"{source}: expected a mapping of flags, got {type(data).__name__}")])
    meta = data.get("specops") or {}
    if not isinstance(meta, dict):
        issues.append(Issue("specops", f"must be a mapping of specops keys, got {type(meta).__name__}"))
        meta = {}
    unknown = set(meta) - SPECOPS_KEYS
    issues += [Issue(f"specops.{k}", f"unknown specops key (known: {', '.join(sorted(SPECOPS_KEYS))})")
               for k in sorted(unknown, key=str)]
    value_issues = specops_value_issues(meta)
    issues += value_issues
    invalid = {i.field[len("specops."):] for i in value_issues}  # these fall back to defaults below
    meta = {k: v for k, v in meta.items() if k not in invalid}
    if isinstance(meta.get("env"), dict):
        meta["env"] = {k: v for k, v in meta["env"].items() if f"env.{k}" not in invalid}
    engine = meta.get("engine", "sglang")
    engine_known = engine in ENGINES
    if not engine_known:
        issues.append(Issue("specops.engine", f"{engine!r} is not one of {ENGINES}"))
        engine = "sglang"
    args = {}
    for key, value in data.items():
        if key == "specops":
            continue
        dest = engine_for(engine).dest(str(key))
        if dest in args:
            issues.append(Issue(str(key), f"given twice (also as another spelling of {dest})"))
        args[dest] = _resolve_env_refs(value, str(key), issues, environ)
    env = {str(k): str(_resolve_env_refs(v, f"specops.env.{k}", issues, environ))
           for k, v in (meta.get("env") or {}).items()}
    issues += [Issue(f"specops.env.{k}", "not a valid environment variable name") for k in env if not _ENV_NAME.match(k)]
    # a value taken from the controller's environment is treated as secret, whatever its key is called
    from_env = {engine_for(engine).dest(str(k)) for k, v in data.items() if isinstance(v, str) and _ENV_REF.search(v)}
    from_env |= {str(k) for k, v in (meta.get("env") or {}).items() if isinstance(v, str) and _ENV_REF.search(v)}
    shipped, ship_issues = ship(engine, args, base, _read_config)
    issues += ship_issues
    launcher = meta.get("launcher") or ()
    if isinstance(launcher, str):
        launcher = tuple(launcher.split())
    gpus = meta.get("gpus")
    cfg = ServerConfig(
        name=str(meta.get("name", name)), engine=engine, args=args, env=env,
        secret_fields=frozenset(engine_for(engine).dest(str(f)) if str(f) not in env else str(f)
                                for f in meta.get("secret_fields") or ()) | from_env, launcher=tuple(launcher),
        min_accept_length=meta.get("min_accept_length"), ready_timeout_s=float(meta.get("ready_timeout_s", 900)),
        prompt=str(meta.get("prompt", ServerConfig.prompt)), stop_grace_s=float(meta.get("stop_grace_s", 30)),
        gpus=tuple(int(g) for g in gpus) if gpus is not None else None, source=source, shipped=shipped)
    if issues:
        # list every error in one go: the engine's rules that need no host (flags, types, speculative settings,
        # ports) too, except on fields already reported here (an unset ${VAR} is not also "required")
        if engine_known:
            seen = {_field(i.field) for i in issues}
            issues += [i for i in validate(cfg) if _field(i.field) not in seen]
        raise ConfigError(issues)
    return cfg


def configs_dir() -> Path:
    return Path(os.environ.get("SPECOPS_CONFIGS", Path.cwd() / "configs"))


MAX_CONFIG_BYTES = 1 << 20  # a config is a page of flags; anything bigger is the wrong file


def _file_issue(path, message: str) -> ConfigError:
    """A problem with the file itself: named by path, never quoting the file (it may be any file, secrets too)."""
    return ConfigError([Issue("config", f"{path}: {message}")])


def _read_config(path: Path) -> str:
    """The file's text, refused before reading when it is not a regular file of at most MAX_CONFIG_BYTES (a FIFO
    or /dev/zero would hang, a huge file would take minutes) and after reading when it is not UTF-8."""
    info = path.stat()  # FileNotFoundError: the caller lists the known configs
    if stat.S_ISDIR(info.st_mode):
        raise _file_issue(path, "is a directory, not a YAML config file")
    if not stat.S_ISREG(info.st_mode):
        raise _file_issue(path, "is not a regular file")
    if info.st_size > MAX_CONFIG_BYTES:
        raise _file_issue(path, f"is {info.st_size} bytes; a config may have at most {MAX_CONFIG_BYTES}")
    with path.open("rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)  # it may have grown since stat
    if len(raw) > MAX_CONFIG_BYTES:
        raise _file_issue(path, f"is over {MAX_CONFIG_BYTES} bytes; a config may have at most {MAX_CONFIG_BYTES}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _file_issue(path, f"is not UTF-8 text (invalid byte at offset {exc.start})") from None


_FLAG_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")  # model-path, tp_size, specops: what a flag looks like


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that records every key given twice in one mapping (PyYAML silently keeps the last one, so a
    second ``port:`` further down would win unseen). Local to config loading: yaml's own loaders are untouched."""

    def __init__(self, stream):
        super().__init__(stream)
        self.duplicates: list[tuple[str, int, int]] = []  # (dotted key, first line, second line)
        self.not_flags: list[int] = []  # lines of top-level keys that cannot be a flag name
        self._paths: dict[int, str] = {}  # id(mapping node) -> its dotted path ("" for the document)

    def compose_node(self, parent, index):
        # an alias re-uses a node: nine levels of ten make a billion-entry config out of a few hundred bytes, which
        # hashing it would expand; a flag file has no use for them
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not allowed in a config",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def construct_document(self, node):
        self._paths[id(node)] = ""
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        where, seen = self._paths.get(id(node)), {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if where == "" and not (isinstance(key_node, yaml.ScalarNode) and _FLAG_KEY.match(key_node.value)):
                self.not_flags.append(line)
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = str(self.construct_object(key_node))
            field = f"{where}.{key}" if where else key
            if key in seen:
                self.duplicates.append((field, seen[key], line))
            seen.setdefault(key, line)
            if isinstance(value_node, yaml.MappingNode):  # constructed after this one: hand it its path
                self._paths[id(value_node)] = field
        return super().construct_mapping(node, deep=deep)


_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"')  # 'x', "x" with escapes


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what kind of YAML error, without the snippet of the file that ``str(exc)`` quotes (and with
    quoted names, anchors or tags from the file blanked)."""
    problem = _QUOTED.sub("'...'", getattr(exc, "problem", None) or getattr(exc, "reason", None) or "")[:120]
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem or 'syntax error'}"
    if isinstance(exc, yaml.reader.ReaderError):
        return f"invalid YAML: character #x{exc.character:04x} at offset {exc.position}: {problem}"
    return f"invalid YAML: {problem or type(exc).__name__}"


def _parse(text: str, path: Path):
    """The YAML document (every duplicated key listed at once), or a ConfigError quoting nothing of the file."""
    try:
        loader = _UniqueKeyLoader(text)  # the reader refuses control characters here already
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise _file_issue(path, _yaml_problem(exc)) from None
    if isinstance(data, dict) and loader.not_flags:  # e.g. /etc/shadow: "root:$6$...:7:::" is a YAML key
        lines = ", ".join(map(str, loader.not_flags[:10])) + (", ..." if len(loader.not_flags) > 10 else "")
        raise ConfigError([Issue("<file>", f"{path}: not a config: the key(s) on line(s) {lines} cannot be flag "
                                           f"names (not shown: the file may be any file)")])
    if loader.duplicates:
        raise ConfigError([Issue(key, f"given twice in {path} (lines {first} and {second}); YAML would silently "
                                      f"keep the last") for key, first, second in loader.duplicates])
    if data is None:
        raise _file_issue(path, "is empty: no flags in it")
    return data


SETTINGS_SUFFIX = ".specops.yaml"


def settings_path(path: Path) -> Path:
    """Where specops' own settings for the engine file ``path`` live: ``NAME.specops.yaml`` beside it (for
    ``NAME.yaml``, ``NAME.yml`` or a file without a YAML suffix)."""
    stem = path.stem if path.suffix in (".yaml", ".yml") else path.name
    return path.with_name(stem + SETTINGS_SUFFIX)


def known_configs(search: Path | None = None) -> list[str]:
    return sorted(p.stem for p in (search or configs_dir()).glob("*.yaml") if not p.name.endswith(SETTINGS_SUFFIX))


def _read_yaml(path: Path):
    try:
        return _parse(_read_config(path), path)
    except FileNotFoundError:
        raise
    except OSError as exc:  # permission denied, a loop of links, ...: the reason, not the content
        raise _file_issue(path, f"cannot be read: {exc.strerror or type(exc).__name__}") from None


def load(name_or_path: str, search: Path | None = None, environ=None) -> ServerConfig:
    """``eagle3-llama3.1-8b`` (looked up in configs/) or a path to a YAML file. A file that is not a config
    (a directory, binary, huge, empty, not YAML, not a mapping) is refused without quoting any of it.

    The file is the engine's own ``--config`` YAML (SGLang's, unchanged); specops' settings come from
    ``NAME.specops.yaml`` beside it, or from a ``specops:`` section in the file itself (stripped before the
    engine sees it), not both."""
    path = Path(name_or_path)
    if "/" not in name_or_path and path.suffix not in (".yaml", ".yml"):  # a name: "eagle3-llama3.1-8b"
        path = (search or configs_dir()) / f"{name_or_path}.yaml"
    if path.name.endswith(SETTINGS_SUFFIX):
        raise _file_issue(path, f"holds specops settings, not a config: load the engine file beside it "
                                f"({path.name[: -len(SETTINGS_SUFFIX)]}.yaml)")
    try:
        data = _read_yaml(path)
    except FileNotFoundError:
        known = known_configs(search)
        raise ConfigError([Issue("config", f"no config {name_or_path!r} ({path}); known: {', '.join(known) or 'none'}")])
    sidecar = settings_path(path)
    source = str(path)
    if sidecar.with_suffix(".yml").exists():
        raise _file_issue(sidecar.with_suffix(".yml"), f"specops settings are read from {sidecar.name}: rename it")
    if os.path.lexists(sidecar):  # a dangling link is an error, not "no settings" (GPUs, secrets would be lost)
        try:
            settings = _read_yaml(sidecar)
        except FileNotFoundError:
            raise _file_issue(sidecar, "is a broken link: specops' settings for this config cannot be read") from None
        if isinstance(data, dict) and "specops" in data:
            raise ConfigError([Issue("specops", f"given both in {path} and in {sidecar}: keep one")])
        if isinstance(data, dict):
            data = {**data, "specops": settings}
        source = f"{path} + {sidecar.name}"
    return from_mapping(data, path.stem, source, environ, base=path.parent)
