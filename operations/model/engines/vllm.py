"""vLLM: ``vllm serve`` with ``--speculative-config`` JSON (eagle3, eagle, ngram, mtp)."""
from __future__ import annotations

import json

from operations.errors import Issue
from operations.model.engines.checks import api_key_issues, is_int, placement_issues, port_issues
from operations.model.engines.secret_ref import SecretRef
from operations.model.server_config import HostContext, ServerConfig


VLLM_METHODS = ("eagle", "eagle3", "ngram", "mtp", "draft_model")
VLLM_TYPES = {"port": int, "host": str, "tensor_parallel_size": int, "data_parallel_size": int,
              "gpu_memory_utilization": float, "max_model_len": int, "max_num_seqs": int, "seed": int,
              "dtype": str, "served_model_name": str, "api_key": str, "trust_remote_code": bool,
              "enforce_eager": bool, "speculative_config": dict, "model": str, "quantization": str,
              "kv_cache_dtype": str, "enable_prefix_caching": bool}


class VLLM:
    name = "vllm"

    def dest(self, key: str) -> str:
        return key.replace("-", "_")

    def validate(self, cfg: ServerConfig, ctx: HostContext) -> list[Issue]:
        issues = []
        for key, value in cfg.args.items():
            want = VLLM_TYPES.get(key)
            if want is None:
                issues.append(Issue(key.replace("_", "-"), f"unknown vllm serve option (known: "
                                                           f"{', '.join(sorted(VLLM_TYPES))})"))
            elif value is not None and not (isinstance(value, want) and not (want is int and isinstance(value, bool))
                                            or (want is float and isinstance(value, int))):
                issues.append(Issue(key.replace("_", "-"), f"must be {want.__name__}, got {value!r}"))
        if not cfg.args.get("model"):
            issues.append(Issue("model", "required"))
        issues += port_issues(cfg, "port") + api_key_issues(cfg) + placement_issues(cfg)
        spec = cfg.args.get("speculative_config")
        if isinstance(spec, dict):
            method = spec.get("method")
            if method not in VLLM_METHODS:
                issues.append(Issue("speculative-config.method", f"{method!r} is not one of {list(VLLM_METHODS)}"))
            if method in ("eagle", "eagle3", "draft_model") and not spec.get("model"):
                issues.append(Issue("speculative-config.model", f"required for method {method}"))
            n = spec.get("num_speculative_tokens")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                issues.append(Issue("speculative-config.num_speculative_tokens", f"must be an integer >= 1, got {n!r}"))
            if method == "ngram":
                lo, hi = spec.get("prompt_lookup_min", 1), spec.get("prompt_lookup_max")
                if not isinstance(hi, int) or hi < 1:
                    issues.append(Issue("speculative-config.prompt_lookup_max", "required for ngram (an integer >= 1)"))
                elif isinstance(lo, int) and lo > hi:
                    issues.append(Issue("speculative-config.prompt_lookup_min", f"{lo} > prompt_lookup_max {hi}"))
        sizes = (cfg.args.get("tensor_parallel_size", 1), cfg.args.get("data_parallel_size", 1))
        if ctx.gpu_count is not None and all(map(is_int, sizes)) and cfg.gpu_count() > ctx.gpu_count:
            issues.append(Issue("tensor-parallel-size", f"needs {cfg.gpu_count()} GPU(s); host has {ctx.gpu_count}"))
        return [Issue(i.field, i.message, ctx.name) for i in issues]

    def engine_yaml(self, cfg: ServerConfig) -> None:
        return None  # every flag on the command line (vLLM's own --config format: issue 17)

    def launch_argv(self, cfg: ServerConfig, config_path: str | None) -> list:
        return self.argv(cfg)

    def argv(self, cfg: ServerConfig) -> list:
        out: list = [*cfg.launcher, str(cfg.args.get("model", ""))]
        for key in sorted(cfg.args):
            value = cfg.args[key]
            if key == "model" or value is None or value is False:
                continue
            option = "--" + key.replace("_", "-")
            if value is True:
                out.append(option)
            elif cfg.is_secret(key):
                out += [option, SecretRef(key)]
            elif isinstance(value, dict):
                out += [option, json.dumps(value, sort_keys=True)]
            else:
                out += [option, str(value)]
        return out

    def compared(self, cfg: ServerConfig) -> list[str]:
        return [k for k in cfg.args if not cfg.is_secret(k)]

    def desired_view(self, cfg: ServerConfig, keys=None) -> dict:
        return {k: cfg.args.get(k) for k in (self.compared(cfg) if keys is None else keys)}

    def reported_view(self, cfg: ServerConfig, server_info: dict) -> dict:
        args = server_info.get("vllm_config", server_info.get("server_args", server_info))
        return {k: args.get(k) for k in self.compared(cfg)}
