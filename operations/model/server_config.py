"""A desired server (``ServerConfig``): engine, arguments, environment, secrets and verification settings."""
from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass, field, replace

from operations.remote.common import secret_name  # the one secret rule: the host programs mask by it too

API_KEYS = ("api_key", "admin_api_key")  # the secrets clients send as HTTP headers
ENGINES = ("sglang", "vllm")
DEFAULT_LAUNCHER = {"sglang": ("python3", "-m", "sglang.launch_server"), "vllm": ("vllm", "serve")}
# specops keys whose change needs no restart: they only steer verification
VERIFY_KEYS = ("min_accept_length", "ready_timeout_s", "prompt", "stop_grace_s")
SPECOPS_KEYS = frozenset({"engine", "launcher", "env", "secret_fields", "gpus", "name", *VERIFY_KEYS})


@dataclass(frozen=True)
class ShippedFile:
    """A file the config names that travels with the launch files (e.g. SGLang's adaptive table): the argument
    ``dest`` points at ``leaf`` in the server's directory on the host."""

    dest: str
    leaf: str
    content: str

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.content.encode()).hexdigest()[:16]


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
    shipped: tuple = ()  # ShippedFile: uploaded with the launch files, their content part of the config's version

    def __post_init__(self):
        if not self.launcher:
            object.__setattr__(self, "launcher", DEFAULT_LAUNCHER.get(self.engine, ()))

    # --- secrets -----------------------------------------------------------------------------------
    def is_secret(self, key: str) -> bool:
        return key in self.secret_fields or secret_name(key)

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
        files = {f.dest: f.digest for f in self.shipped}  # the content, wherever the host keeps it
        args = {k: files.get(k) or (digest(v) if self.is_secret(k) else v) for k, v in sorted(self.args.items())}
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

    def placed(self, directory: str) -> "ServerConfig":
        """This config with every shipped file's argument pointing at its copy in the server's ``directory``."""
        return self.with_args(**{f.dest: posixpath.join(directory, f.leaf) for f in self.shipped})

    def with_args(self, **changes) -> "ServerConfig":
        return replace(self, args={**self.args, **changes})


@dataclass(frozen=True)
class HostContext:
    """What validation knows about the host a config is for."""

    name: str = "*"
    gpu_count: int | None = None  # GPUs on the host, when known
    group_size: int | None = None  # hosts in the inventory group that serves one model (multi-node)
