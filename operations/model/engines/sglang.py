"""SGLang: validated against SGLang 0.5.23's own argparse table (sglang_args), resolved as its server resolves
speculative settings (sglang_resolve)."""
from __future__ import annotations

import json

import yaml

from operations.errors import Issue
from operations.model.engines import adaptive, sglang_args, sglang_resolve
from operations.model.engines.checks import api_key_issues, int_at_least, is_int, placement_issues, port_issues
from operations.model.engines.secret_ref import SecretRef
from operations.model.server_config import HostContext, ServerConfig


SGLANG_ALGORITHMS = sglang_resolve.KNOWN
# need a draft model path (EAGLE / NEXTN without one use the target checkpoint's own MTP layers, DeepSeek-style)
DRAFTED = ("EAGLE3", "STANDALONE")
TREE = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")  # steps / topk / draft tokens are the config's to give
AUTO = sglang_resolve.AUTO


class SGLang:
    name = "sglang"

    def dest(self, key: str) -> str:
        flag = sglang_args.lookup(key)
        return flag.dest if flag else key.replace("-", "_")

    # ---- validation -------------------------------------------------------------------------------
    def _type_issue(self, flag: sglang_args.Flag, value) -> str | None:
        if value is None:
            return None
        if flag.is_switch:
            return None if isinstance(value, bool) else f"is a switch: true or false, got {value!r}"
        if flag.nargs in ("+", "*"):
            items = value if isinstance(value, list) else [value]
            bad = [self._scalar_issue(flag, item) for item in items]
            return next((b for b in bad if b), None)
        return self._scalar_issue(flag, value)

    def _scalar_issue(self, flag, value) -> str | None:
        if flag.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            return f"must be an integer, got {value!r}"
        if flag.type == "float" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return f"must be a number, got {value!r}"
        if flag.type in ("str", "nullable_str") and not isinstance(value, (str, int, float)):
            return f"must be a string, got {type(value).__name__}"
        if flag.type == "loads" and not isinstance(value, (dict, list, str)):
            return f"must be JSON (a mapping or a JSON string), got {value!r}"
        if flag.choices and value not in flag.choices:
            return f"{value!r} is not one of {list(flag.choices)}"
        return None

    def validate(self, cfg: ServerConfig, ctx: HostContext) -> list[Issue]:
        issues: list[Issue] = []
        table = sglang_args.flags()
        for dest, value in cfg.args.items():
            flag = table.get(dest)
            if flag is None:
                issues.append(Issue(dest.replace("_", "-"), f"unknown flag for SGLang {sglang_args.SGLANG_VERSION}"))
                continue
            problem = self._type_issue(flag, value)
            if problem:
                issues.append(Issue(flag.option.lstrip("-"), problem))
        if not cfg.args.get("model_path"):
            issues.append(Issue("model-path", "required"))
        issues += port_issues(cfg, "port") + api_key_issues(cfg)
        mem = cfg.args.get("mem_fraction_static")
        if isinstance(mem, (int, float)) and not isinstance(mem, bool) and not 0 < mem < 1:
            issues.append(Issue("mem-fraction-static", f"must be between 0 and 1, got {mem}"))
        issues += self._speculative_issues(cfg)
        issues += self._topology_issues(cfg, ctx) + placement_issues(cfg)
        return [Issue(i.field, i.message, ctx.name) for i in issues]

    def _speculative_issues(self, cfg: ServerConfig) -> list[Issue]:
        a = cfg.args
        given = a.get("speculative_algorithm")
        spec_keys = [k for k in ("speculative_draft_model_path", *sglang_resolve.TREE) if a.get(k) is not None]
        if given is None:
            return [Issue(k.replace("_", "-"), "set without speculative-algorithm (it would be ignored)")
                    for k in spec_keys]
        algo = given.upper() if isinstance(given, str) else given  # SGLang upper-cases the name
        if algo not in sglang_resolve.KNOWN:
            return [Issue("speculative-algorithm", f"{given!r} is not one of {list(sglang_resolve.KNOWN)} "
                                                   f"(any case)")]
        issues = []
        if algo in DRAFTED and not a.get("speculative_draft_model_path"):
            issues.append(Issue("speculative-draft-model-path",
                                f"required for {algo}: without it SGLang drafts with the target model itself and "
                                f"crashes after loading the weights twice"))
        if algo in TREE:
            issues += self._tree_issues(cfg, algo)
        issues += self._algorithm_needs(cfg, algo)
        if a.get("speculative_adaptive"):
            issues += self._adaptive_issues(cfg)
        return issues

    @staticmethod
    def _algorithm_needs(cfg: ServerConfig, algo: str) -> list[Issue]:
        """What SGLang's resolver refuses for one algorithm (speculative_hook.py), said before any host is touched."""
        a, issues = cfg.args, []
        if algo in ("NGRAM", "STANDALONE") and a.get("enable_dp_attention"):
            issues.append(Issue("enable-dp-attention", f"{algo} speculative decoding does not support attention DP "
                                                       f"(SGLang refuses to start)"))
        if algo == "DFLASH" and not a.get("speculative_draft_model_path"):
            issues.append(Issue("speculative-draft-model-path", "required for DFLASH (SGLang refuses to start)"))
        if algo == "UNO":
            if not a.get("uno_lora_path"):
                issues.append(Issue("uno-lora-path", "required for UNO (SGLang refuses to start)"))
            if a.get("tp_size", 1) != 1 or a.get("pp_size", 1) != 1:
                issues.append(Issue("tp-size", "UNO runs with tp-size 1 and pp-size 1 only (SGLang refuses to start)"))
        return issues

    @staticmethod
    def _adaptive_issues(cfg: ServerConfig) -> list[Issue]:
        a = cfg.args
        off = sglang_resolve.adaptive_off_reason({**a, "speculative_algorithm": a.get("speculative_algorithm")})
        if off:
            return [Issue("speculative-adaptive", f"{off}; SGLang would silently run without it")]
        steps, shipped = a.get("speculative_num_steps"), _shipped_table(cfg)
        if steps is None or (a.get("speculative_adaptive_config") and shipped is None):  # a table on the host:
            return []                                                                  # SGLang checks it there
        candidates = adaptive.candidate_steps(shipped)
        if steps not in candidates:
            return [Issue("speculative-num-steps", f"{steps} is not one of the adaptive candidate steps "
                                                   f"{list(candidates)} (SGLang refuses to start)")]
        return []

    def _tree_issues(self, cfg: ServerConfig, algo: str) -> list[Issue]:
        """Steps / topk / draft tokens: all omitted (SGLang chooses them for the model), or steps and topk given
        (draft tokens too when topk > 1); SGLang's resolver crashes on steps without topk and the reverse."""
        a = cfg.args
        steps, topk, draft = (a.get(k) for k in sglang_resolve.TREE)
        issues = (int_at_least(cfg, "speculative_num_steps", 1) + int_at_least(cfg, "speculative_eagle_topk", 1)
                  + int_at_least(cfg, "speculative_num_draft_tokens", 2))
        if a.get("speculative_adaptive") or (steps is None and topk is None and draft is None):
            return issues
        for key, value in (("speculative_num_steps", steps), ("speculative_eagle_topk", topk)):
            if value is None:
                issues.append(Issue(key.replace("_", "-"), f"required for {algo} once any of steps / topk / draft "
                                    f"tokens is set (SGLang's resolver crashes without it); or omit all three "
                                    f"and SGLang chooses them for the model"))
        if draft is None and is_int(topk) and topk > 1:
            issues.append(Issue("speculative-num-draft-tokens", f"required for {algo} when speculative-eagle-topk "
                                                                f"is > 1 (SGLang has no default for a tree)"))
        elif all(map(is_int, (steps, topk, draft))) and topk > 1 and steps >= 1 and not issues:
            room = 1 + topk + (steps - 1) * topk * topk
            if draft > room:  # eagle_utils.organize_draft_results: torch.topk(candidates, draft - 1) at decode
                issues.append(Issue("speculative-num-draft-tokens",
                                    f"{draft} exceeds the {room} tokens a tree of {steps} steps x topk {topk} can "
                                    f"propose (SGLang's draft step fails at the first decode)"))
        return issues

    def _topology_issues(self, cfg: ServerConfig, ctx: HostContext) -> list[Issue]:
        a = cfg.args
        issues = int_at_least(cfg, "tp_size", 1) + int_at_least(cfg, "dp_size", 1) + int_at_least(cfg, "nnodes", 1)
        issues += int_at_least(cfg, "base_gpu_id", 0) + int_at_least(cfg, "gpu_id_step", 1)
        if cfg.gpus is not None and (a.get("base_gpu_id") or a.get("gpu_id_step", 1) != 1):
            issues.append(Issue("specops.gpus", "given together with base-gpu-id / gpu-id-step: list the GPUs in "
                                                "one place (specops.gpus is what CUDA_VISIBLE_DEVICES is set to)"))
        keys = ("tp_size", "dp_size", "nnodes", "base_gpu_id", "gpu_id_step")
        issues += [Issue(k.replace("_", "-"), "must be an integer, got null") for k in keys if k in a and a[k] is None]
        if issues or not all(is_int(a.get(k, 1)) for k in keys):
            return issues
        nnodes = a.get("nnodes", 1)
        tp, dp = a.get("tp_size", 1), a.get("dp_size", 1)
        if a.get("enable_dp_attention"):  # attention-DP ranks share the tp GPUs (config.gpu_count)
            dp = 1
        if (tp * dp) % nnodes:
            issues.append(Issue("tp-size", f"tp-size x dp-size = {tp * dp} does not split over nnodes {nnodes}"))
        per_node = (tp * dp) // nnodes
        if cfg.gpus is not None and len(cfg.gpus) != per_node:
            issues.append(Issue("specops.gpus", f"{len(cfg.gpus)} GPUs listed but tp-size x dp-size / nnodes "
                                                f"= {per_node}"))
        if ctx.gpu_count is not None:
            need = max(cfg.gpu_indices(), default=-1) + 1
            if per_node > ctx.gpu_count or need > ctx.gpu_count:
                issues.append(Issue("tp-size", f"tp-size {tp} x dp-size {dp} / nnodes {nnodes} needs {per_node} "
                                               f"GPU(s) (up to index {need - 1}); host has {ctx.gpu_count}"))
        if ctx.group_size is not None and nnodes != ctx.group_size:
            issues.append(Issue("nnodes", f"{nnodes} but the inventory group serving this model has "
                                          f"{ctx.group_size} host(s)"))
        rank = a.get("node_rank", 0)
        if isinstance(rank, int) and not 0 <= rank < nnodes:
            issues.append(Issue("node-rank", f"{rank} is outside 0..{nnodes - 1}"))
        if nnodes > 1 and not a.get("dist_init_addr"):
            issues.append(Issue("dist-init-addr", "required when nnodes > 1 (rank 0's address:port)"))
        return issues

    # ---- rendering --------------------------------------------------------------------------------
    # GPU placement is CUDA_VISIBLE_DEVICES, rendered from cfg.gpu_indices() (supervisors.launch_env): inside it
    # the server counts GPUs from 0, so base-gpu-id / gpu-id-step are not passed on
    PLACEMENT = ("base_gpu_id", "gpu_id_step")

    def _launched(self, cfg: ServerConfig) -> list[tuple[str, object, sglang_args.Flag]]:
        """(dest, value, flag) of every flag the server is started with, in the table's order."""
        table = sglang_args.flags()
        order = {dest: i for i, dest in enumerate(table)}
        return [(dest, cfg.args[dest], table[dest]) for dest in sorted(cfg.args, key=lambda d: order.get(d, len(order)))
                if cfg.args[dest] is not None and dest not in self.PLACEMENT and dest in table]

    @staticmethod
    def _in_file(flag: sglang_args.Flag, dest: str, cfg: ServerConfig) -> bool:
        """Whether the flag goes into the engine file: SGLang's ``--config`` loader takes store and store_true
        flags only (a BooleanOptionalAction key makes it raise), and secrets stay in the 0600 secrets file."""
        if cfg.is_secret(dest):
            return False
        return flag.action == "_StoreTrueAction" or (flag.action == "_StoreAction" and flag.nargs in (None, "+"))

    def engine_file(self, cfg: ServerConfig) -> dict:
        """The engine part as SGLang's own ``--config`` YAML: primary option name (no dashes) -> value."""
        out = {}
        for dest, value, flag in self._launched(cfg):
            if not self._in_file(flag, dest, cfg) or (flag.is_switch and not value):
                continue
            if flag.type in ("loads", "json_list_type") and not isinstance(value, str):
                value = json.dumps(value, sort_keys=True)  # the loader would split a list into several values
            out[flag.option.lstrip("-")] = value
        return out

    def engine_yaml(self, cfg: ServerConfig) -> str:
        # the name is any string: JSON-quoted, a newline in it cannot end the comment and start YAML
        header = f"# SGLang --config file rendered by specops for config {json.dumps(cfg.name)}; the next converge " \
                 f"rewrites it.\n"
        return header + yaml.safe_dump(self.engine_file(cfg), sort_keys=False, default_flow_style=False,
                                       allow_unicode=True)

    def launch_argv(self, cfg: ServerConfig, config_path: str | None) -> list:
        """The command line: the launcher, ``--config config_path`` (the engine file), then what the file cannot
        carry (secrets as :class:`SecretRef`, ``--no-x`` switches). Without a path every flag is on the line."""
        out: list = list(cfg.launcher) + (["--config", config_path] if config_path else [])
        for dest, value, flag in self._launched(cfg):
            if config_path and self._in_file(flag, dest, cfg):
                continue
            if flag.is_switch:
                if value:
                    out.append(flag.option)
                elif flag.negated:
                    out.append(flag.negated)
                continue
            if cfg.is_secret(dest):  # one element, --flag=VALUE: a key starting with '-' is not taken for a flag
                out.append(SecretRef(dest, f"{flag.option}="))
                continue
            out.append(flag.option)
            if isinstance(value, list) and flag.type not in ("loads", "json_list_type"):
                out += [str(v) for v in value]
            elif isinstance(value, (dict, list)):
                out.append(json.dumps(value, sort_keys=True))
            else:
                out.append(str(value))
        return out

    def argv(self, cfg: ServerConfig) -> list:
        return self.launch_argv(cfg, None)

    # ---- what the live server reports -------------------------------------------------------------
    def desired_view(self, cfg: ServerConfig, keys=None) -> dict:
        """Desired values as SGLang resolves and reports them (``operations.model.engines.sglang_resolve``), defaults filled,
        for the fields compared against ``/server_info`` (or ``keys``); :data:`AUTO` where SGLang decides from
        the model."""
        defaults = sglang_args.defaults()
        full = {**defaults, **{k: v for k, v in cfg.args.items() if v is not None}}
        table = sglang_args.flags()
        full = {k: sglang_args.as_parsed(table[k], v) if k in table else v for k, v in full.items()}
        full.update(base_gpu_id=0, gpu_id_step=1)  # CUDA_VISIBLE_DEVICES places the server (see PLACEMENT)
        if full.get("enable_dp_attention"):  # SGLang turns dp into attention DP ranks over the same tp GPUs
            full.update(dp_size=1, attn_dp_size=full.get("dp_size"))
        table = _shipped_table(cfg)
        if table is not None:  # the steps SGLang starts from are the middle of this table's candidates
            full["adaptive_candidate_steps"] = adaptive.candidate_steps(table)
        full.update(sglang_resolve.speculative(full))
        return {k: _norm(k, full.get(k)) for k in (self.compared(cfg) if keys is None else keys)}

    def compared(self, cfg: ServerConfig) -> list[str]:
        core = ["model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                "speculative_eagle_topk", "speculative_num_draft_tokens", "tp_size", "dp_size", "port"]
        shipped = {f.dest for f in cfg.shipped}  # the host path differs; the content is in the config's version
        extra = [k for k in cfg.args if k not in core and not cfg.is_secret(k) and k in sglang_args.flags()
                 and k not in shipped]
        return core + sorted(extra)

    def reported_view(self, cfg: ServerConfig, server_info: dict) -> dict:
        # 0.5.23's /server_info has the arguments at the top level; older releases nested them in server_args
        args = server_info.get("server_args") if isinstance(server_info.get("server_args"), dict) else server_info
        return {k: _norm(k, args.get(k)) for k in self.compared(cfg)}


def _shipped_table(cfg: ServerConfig) -> dict | None:
    """The adaptive table the config ships (parsed), or None."""
    doc = next((adaptive.parse(f.content)[0] for f in cfg.shipped if f.dest == "speculative_adaptive_config"), None)
    return doc if isinstance(doc, dict) and not adaptive.problems(doc) else None


def _norm(key: str, value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if key == "speculative_algorithm" and isinstance(value, str):
        return value.upper()
    return value
