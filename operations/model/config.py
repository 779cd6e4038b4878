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

import hashlib
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from operations.errors import ConfigError

# SGLang's own secret flags (the host masks fields named like these in what the server reports: remote_common)
SECRET_ARGS = frozenset({"api_key", "admin_api_key", "ssl_keyfile_password", "watermark_config"})
# HF_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD; not TOKENIZERS_PARALLELISM
SECRET_ENV = re.compile(r"(^|_)(TOKEN|KEY|SECRET|PASSWORD|PASSWD)(_|$)", re.I)
ENGINES = ("sglang", "vllm")
DEFAULT_LAUNCHER = {"sglang": ("python3", "-m", "sglang.launch_server"), "vllm": ("vllm", "serve")}
# specops keys whose change needs no restart: they only steer verification
VERIFY_KEYS = ("min_accept_length", "ready_timeout_s", "prompt", "stop_grace_s")
SPECOPS_KEYS = frozenset({"engine", "launcher", "env", "secret_fields", "gpus", "name", *VERIFY_KEYS})
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Issue:
    field: str
    message: str
    host: str = "*"

    def __str__(self) -> str:
        return f"[{self.host}] {self.field}: {self.message}"


@dataclass(frozen=True)
class ServerConfig:
    """A desired server: engine, its arguments (by dest), environment, secrets and verification settings."""

    name: str
    engine: str = "sglang"
    args: dict = field(default_factory=dict)  # dest -> value (sglang) / option name -> value (vllm)
    env: dict = field(default_factory=dict)
    secret_fields: frozenset = frozenset()  # arg dests and env names whose values are secret
    launcher: tuple = ()
    min_accept_length: float | None = None
    ready_timeout_s: float = 900.0
    prompt: str = "The capital of France is"
    stop_grace_s: float = 30.0
    gpus: tuple | None = None  # GPU indices the server uses (default: 0 .. tp*dp-1 on the node)
    source: str = "<python>"

    def __post_init__(self):
        if not self.launcher:
            object.__setattr__(self, "launcher", DEFAULT_LAUNCHER.get(self.engine, ()))

    # --- secrets -----------------------------------------------------------------------------------
    def is_secret(self, key: str) -> bool:
        return key in self.secret_fields or key in SECRET_ARGS or (key in self.env and bool(SECRET_ENV.search(key)))

    # an env var that is secret but not passed as a flag still needs exporting from secrets.env

    def redact(self, text: str) -> str:
        """``text`` with every secret value of this config replaced by ``<secret>`` (for server log lines, which
        may echo the server's own arguments or environment)."""
        values = {str(v) for k, v in self.args.items() if self.is_secret(k) and v not in (None, "")}
        values |= {str(v) for k, v in self.env.items() if self.is_secret(k) and v != ""}
        for value in sorted(values, key=len, reverse=True):
            text = text.replace(value, "<secret>")
        return text

    def masked_args(self) -> dict:
        return {k: "<secret>" if self.is_secret(k) and v is not None else v for k, v in self.args.items()}

    # --- identity ------------------------------------------------------------------------------------
    def restart_identity(self) -> dict:
        """Everything whose change needs a restart (secrets by digest only)."""
        def digest(v):
            return "sha256:" + hashlib.sha256(str(v).encode()).hexdigest()[:16]
        args = {k: digest(v) if self.is_secret(k) else v for k, v in sorted(self.args.items())}
        env = {k: digest(v) if self.is_secret(k) else v for k, v in sorted(self.env.items())}
        return {"engine": self.engine, "launcher": list(self.launcher), "args": args, "env": env,
                "gpus": list(self.gpus) if self.gpus is not None else None}

    @property
    def config_hash(self) -> str:
        blob = json.dumps(self.restart_identity(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # --- convenience ---------------------------------------------------------------------------------
    @property
    def speculative(self) -> bool:
        if self.engine == "vllm":
            return bool(self.args.get("speculative_config"))
        return bool(self.args.get("speculative_algorithm"))

    @property
    def port(self) -> int:
        return int(self.args.get("port", 30000 if self.engine == "sglang" else 8000))

    def gpu_count(self) -> int:
        if self.engine == "vllm":
            return int(self.args.get("tensor_parallel_size", 1)) * int(self.args.get("data_parallel_size", 1))
        # with attention DP the dp ranks share the tp GPUs (SGLang reports dp_size 1, attn_dp_size = dp)
        dp = 1 if self.args.get("enable_dp_attention") else int(self.args.get("dp_size") or 1)
        return int(self.args.get("tp_size") or 1) * dp // int(self.args.get("nnodes") or 1)

    def gpu_indices(self) -> list[int]:
        """The host's GPUs this server runs on (CUDA_VISIBLE_DEVICES at launch): ``specops.gpus``, else SGLang's
        base-gpu-id and gpu-id-step counted from GPU 0, else the first tp x dp / nnodes GPUs."""
        if self.gpus is not None:
            return list(self.gpus)
        base, step = 0, 1
        if self.engine == "sglang":
            base, step = int(self.args.get("base_gpu_id") or 0), int(self.args.get("gpu_id_step") or 1)
        return [base + i * step for i in range(max(1, self.gpu_count()))]

    def with_args(self, **changes) -> "ServerConfig":
        return replace(self, args={**self.args, **changes})


def _resolve_env_refs(value, where: str, issues: list[Issue], environ):
    if not isinstance(value, str):
        return value

    def sub(m):
        if m.group(1) not in environ:
            issues.append(Issue(where, f"environment variable {m.group(1)} is not set on the controller"))
            return ""
        return environ[m.group(1)]

    return _ENV_REF.sub(sub, value)


def _is_number(value) -> bool:
    """A finite int or float (YAML's ``.nan`` and ``.inf`` are floats too, and would make a wait never end)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _specops_value_issues(meta: dict) -> list[Issue]:
    """Types of the specops section's values (a wrong one would otherwise surface as a traceback, or worse)."""
    issues = []

    def bad(key, message):
        issues.append(Issue(f"specops.{key}", message))

    for key, low, optional in (("ready_timeout_s", 0, False), ("stop_grace_s", 0, False),
                               ("min_accept_length", 0, True)):
        if key not in meta or (optional and meta[key] is None):
            continue
        value = meta[key]
        if not _is_number(value) or value < low or (key == "ready_timeout_s" and value == 0):
            bad(key, f"must be a finite number {'>' if key == 'ready_timeout_s' else '>='} {low}, got {value!r}")
    for key in ("prompt", "name"):
        if key in meta and not (isinstance(meta[key], str) and meta[key]):
            bad(key, f"must be a non-empty string, got {meta[key]!r}")
    env = meta.get("env")
    if env is not None and not isinstance(env, dict):
        bad("env", f"must be a mapping of NAME: value, got {type(env).__name__}")
    elif env:
        for k, v in env.items():
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                bad(f"env.{k}", f"must be a string or a number, got {type(v).__name__}")  # no value: may be secret
    launcher = meta.get("launcher")
    if launcher is not None and not (
            (isinstance(launcher, str) and launcher.split())
            or (isinstance(launcher, list) and launcher and all(isinstance(a, str) and a for a in launcher))):
        bad("launcher", f"must be a command: a string or a non-empty list of strings, got {launcher!r}")
    secret_fields = meta.get("secret_fields")
    if secret_fields is not None and not (isinstance(secret_fields, list)
                                          and all(isinstance(f, str) for f in secret_fields)):
        bad("secret_fields", f"must be a list of field names, got {secret_fields!r}")
    gpus = meta.get("gpus")
    if gpus is not None and not (isinstance(gpus, list) and gpus and all(_is_number(g) and int(g) == g and g >= 0
                                                                         for g in gpus)
                                 and len(set(gpus)) == len(gpus)):
        bad("gpus", f"must be a list of distinct GPU indices (integers >= 0), got {gpus!r}")
    return issues


def _field(name: str) -> str:
    return name.replace("_", "-")


def from_mapping(data: dict, name: str, source: str = "<python>", environ=None) -> ServerConfig:
    """Build a config from a parsed YAML mapping; raises ConfigError listing every problem found here."""
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
    value_issues = _specops_value_issues(meta)
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
    from operations.model.engines import engine_for  # late: engines import this module

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
        gpus=tuple(int(g) for g in gpus) if gpus is not None else None, source=source)
    if issues:
        # list every error in one go: the engine's rules that need no host (flags, types, speculative settings,
        # ports) too, except on fields already reported here (an unset ${VAR} is not also "required")
        if engine_known:
            from operations.model.engines import validate

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
    return from_mapping(data, path.stem, source, environ)
