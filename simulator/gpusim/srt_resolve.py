"""SGLang 0.5.23's resolution of server arguments, where a simulated host needs it: the speculative settings
(srt/arg_groups/speculative_hook.py, speculative/spec_info.py, speculative/adaptive_spec_params.py), the parallel
layout (parallel_hook.py) and the few defaults every launch fills in. ``resolve(fields) -> dict`` returns what
``ServerArgs.resolved_dict()`` returns after ``resolve_once()``, i.e. the top level of ``/server_info``;
a configuration SGLang rejects raises the same exception type with the same message (``TypeError`` for steps
given without topk, ``AssertionError`` for topk or draft tokens without steps, ``ValueError`` for the rest).

Model facts come from the model's ``config.json`` where the machine has it (a local model directory, or the
Hugging Face cache under ``$HF_HUB_CACHE`` / ``$HF_HOME/hub``, as SGLang reads it offline); without one the model
is taken to be a Llama (``LlamaForCausalLM``), the model every shipped config serves.

The simulated host is a CUDA host: ``--device`` unset resolves to ``cuda``. ``--device cpu`` (what a check with
the real SGLang on a machine without a GPU passes) gets SGLang's CPU rules: no overlap schedule with speculation,
and DFLASH / UNO / DSPARK refused.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from . import adaptive

logger = logging.getLogger("sglang.srt.arg_groups.speculative_hook")

ALGORITHMS = ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM")  # spec_info.py
RESERVED_ALIASES = ("NEXTN",)  # spec_registry.py: served as EAGLE
GEMMA4_DRAFTS = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")
# speculative_hook.py _handle_eagle_family: targets whose checkpoint carries its own MTP draft layer
SELF_DRAFT_ARCHS = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM", "Glm4MoeForCausalLM",
                    "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM",
                    "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM",
                    "PixtralForConditionalGeneration", "HYV3ForCausalLM", "HYV4ForCausalLM",
                    "Qwen4ExpForConditionalGeneration")
# speculative_hook.py _auto_choose_speculative_params
AUTO_5_4_8 = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
DRAFT_ATTENTION_BACKEND_CHOICES = ("flashinfer", "fa3", "fa4", "triton", "ascend", "trtllm_mha", "intel_xpu")
PAGE_TREE_SPEC_BACKENDS = ("flashinfer", "fa3", "triton")
DEFAULT_DSPARK_GAMMA = 7
DEFAULT_ARCH = "LlamaForCausalLM"
CUDA_ATTENTION_DEFAULT = "fa3"  # what SGLang picks for a Llama on Hopper (H100/H200) when none is given


class _Cfg(dict):
    """The fields being resolved, readable as attributes (``cfg.speculative_num_steps``), like resolving_view."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value


# --- model facts -------------------------------------------------------------------------------------------

def _hub_dirs() -> list[Path]:
    dirs = []
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            dirs.append(Path(os.environ[var]))
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    dirs.append(Path(home) / "hub")
    return dirs


def model_config(path, revision: str | None = None) -> dict | None:
    """The model's config.json (a local directory's, or the Hugging Face cache's snapshot), None if not here."""
    if not path or not isinstance(path, str):
        return None
    candidates = []
    if os.path.isdir(path):
        candidates.append(Path(path) / "config.json")
    else:
        for hub in _hub_dirs():
            repo = hub / f"models--{path.replace('/', '--')}"
            rev = revision or "main"
            ref = repo / "refs" / rev
            try:
                commit = ref.read_text().strip() if ref.is_file() else rev
            except OSError:
                commit = rev
            candidates.append(repo / "snapshots" / commit / "config.json")
            if repo.is_dir():
                candidates += sorted((repo / "snapshots").glob("*/config.json"))
    for candidate in candidates:
        try:
            doc = json.loads(candidate.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            return doc
    return None


def architecture(path, revision: str | None = None) -> str:
    archs = (model_config(path, revision) or {}).get("architectures") or [DEFAULT_ARCH]
    return archs[0] if isinstance(archs, list) and archs else DEFAULT_ARCH


def _draft_archs(cfg: _Cfg) -> list:
    doc = model_config(cfg.speculative_draft_model_path, cfg.speculative_draft_model_revision) or {}
    archs = doc.get("architectures") or []
    return archs if isinstance(archs, list) else []


# --- the pipeline ------------------------------------------------------------------------------------------

def resolve(fields: dict) -> dict:
    """SGLang's resolution of ``fields`` (ServerArgs' input: every field, defaults filled) -> resolved_dict()."""
    cfg = _Cfg(fields)
    _handle_deprecated_dp_attention(cfg)  # parallel_hook.py handle_deprecated_dp_attention
    if cfg.device is None:
        cfg.device = "cuda"
    if cfg.model_path.lower() in ("none", "dummy"):  # pipeline.py: the dummy model returns before the rest
        return _report(cfg)
    if cfg.tokenizer_path is None:  # model_path_hook.py handle_model_source_paths
        cfg.tokenizer_path = cfg.model_path
    if cfg.served_model_name is None:  # serving_hook.py handle_missing_default_values
        cfg.served_model_name = cfg.model_path
    if cfg.page_size is None:
        cfg.page_size = 1
    _handle_data_parallelism(cfg)
    handle_speculative_decoding(cfg)
    _resolve_boundary_reduction(cfg)
    return _report(cfg)


# boundary_reduction.py: a collective preference per architecture ("auto" resolved from the model's config.json)
_RSV_ARCHITECTURES = {"BailingMoELinearForCausalLM", "BailingMoeV2_5ForCausalLM", "LongcatFlashForCausalLM",
                      "LongcatFlashForCausalLMNextN", "Step3VLForConditionalGeneration"}
_AR_ARCHITECTURES = {"KimiK3ForConditionalGeneration", "KimiK3LinearForCausalLM", "Qwen3ForCausalLM",
                     "Qwen3ForSequenceClassification", "Qwen3Model", "Qwen3ForRewardModel", "MossVLForCausalLM",
                     "MossVLForConditionalGeneration", "Qwen4ExpForConditionalGeneration", "Qwen4ExpForCausalLMMTP"}


def _model_boundary_reduction(doc: dict) -> str:
    archs = set(doc.get("architectures") or [DEFAULT_ARCH])
    if archs & _RSV_ARCHITECTURES:
        return "rsv"
    if archs & _AR_ARCHITECTURES or doc.get("model_type") in ("qwen3", "qwen3_vl_text"):
        return "ar"
    for name in ("text_config", "llm_config", "language_config"):
        if isinstance(doc.get(name), dict):
            return _model_boundary_reduction(doc[name])
    return "rs+rsv"


def _resolve_boundary_reduction(cfg: _Cfg) -> None:
    requested = cfg.boundary_reduction
    if requested != "auto":
        cfg.boundary_reduction = cfg.speculative_boundary_reduction = requested
        return
    target = draft = _model_boundary_reduction(model_config(cfg.model_path, cfg.revision) or {})
    path = cfg.speculative_draft_model_path
    if cfg.speculative_algorithm is not None and path is not None and path != cfg.model_path:
        draft = _model_boundary_reduction(model_config(path, cfg.speculative_draft_model_revision) or {})
    cfg.boundary_reduction, cfg.speculative_boundary_reduction = target, draft


def _report(cfg: _Cfg) -> dict:
    out = dict(cfg)
    # server_args.py resolved_dict: the deprecated flag reports whether an attention-DP width was configured
    out["enable_dp_attention"] = (cfg.attn_dp_size or 1) > 1
    return out


def _handle_deprecated_dp_attention(cfg: _Cfg) -> None:
    if not cfg.enable_dp_attention:
        return
    if cfg.attn_dp_size == 1:
        cfg.attn_dp_size, cfg.dp_size = cfg.dp_size, 1
    cfg.enable_dp_attention = False


def _handle_data_parallelism(cfg: _Cfg) -> None:
    if cfg.attn_dp_size < 1:
        raise ValueError(f"--attn-dp-size must be positive (got {cfg.attn_dp_size}).")
    if cfg.attn_dp_size > 1 and cfg.dp_size > 1:
        raise ValueError(f"--dp-size {cfg.dp_size} with --attn-dp-size {cfg.attn_dp_size}: data-parallel replicas "
                         "combined with attention data parallelism are not supported.")


def attn_dp_enabled(cfg) -> bool:
    return (cfg.attn_dp_size or 1) > 1


def _attention_backend(cfg: _Cfg):
    """The resolved attention backend: the given one, else the platform's (fa3 for a Llama on Hopper, torch_native
    on CPU)."""
    if cfg.attention_backend:
        return cfg.attention_backend
    if cfg.device.startswith("cuda"):
        return CUDA_ATTENTION_DEFAULT
    return "torch_native" if cfg.device == "cpu" else None


def _attention_backends(cfg: _Cfg) -> tuple:
    """overrides.py attention_backends_of: (prefill, decode), each falling back to the attention backend."""
    return (cfg.prefill_attention_backend or _attention_backend(cfg),
            cfg.decode_attention_backend or _attention_backend(cfg))


def _disable_overlap_schedule_for_cpu(cfg: _Cfg) -> None:
    if cfg.device != "cpu" or cfg.disable_overlap_schedule:
        return
    cfg.disable_overlap_schedule = True
    logger.warning("Overlap schedule is not implemented for speculative decoding on CPU.")


def _max_running_requests_48(cfg: _Cfg) -> None:
    if cfg.max_running_requests is None:
        cfg.max_running_requests = 48
        logger.warning("Max running requests is reset to 48 for speculative decoding. You can override this by "
                       "explicitly setting --max-running-requests.")


def _resolve_algorithm_alias(cfg: _Cfg, name):
    is_gemma4_draft = bool(cfg.speculative_draft_model_path) and any(a in GEMMA4_DRAFTS for a in _draft_archs(cfg))
    if name == "EAGLE3" and is_gemma4_draft:
        raise ValueError("Gemma4AssistantForCausalLM draft requires --speculative-algorithm NEXTN or EAGLE; EAGLE3 is "
                         "not supported for this draft architecture.")
    if name in ("NEXTN", "EAGLE"):
        return "FROZEN_KV_MTP" if is_gemma4_draft else "EAGLE"
    return name


def algorithm_from_string(name):
    """spec_info.py SpeculativeAlgorithm.from_string: upper-cased member, NEXTN -> EAGLE, else ValueError."""
    if name is None:
        return None
    upper = name.upper()
    if upper in ALGORITHMS:
        return upper
    if upper in RESERVED_ALIASES:
        return "EAGLE"
    raise ValueError(f"Unknown speculative algorithm name: {name}")


def handle_speculative_decoding(cfg: _Cfg) -> None:
    if cfg.speculative_draft_model_path is not None and cfg.speculative_draft_model_revision is None:
        cfg.speculative_draft_model_revision = "main"
    if cfg.speculative_moe_runner_backend is None:  # overrides.py _speculative_moe_runner_default
        default = cfg.moe_runner_backend
        if default == "flashinfer_megamoe":
            default = "flashinfer_trtllm"
        elif isinstance(default, str) and default.startswith("lora_"):
            default = "auto"
        cfg.speculative_moe_runner_backend = default
    if cfg.speculative_algorithm is not None:
        cfg.speculative_algorithm = cfg.speculative_algorithm.upper()
    cfg.speculative_algorithm = _resolve_algorithm_alias(cfg, cfg.speculative_algorithm)

    if (cfg.disaggregation_mode == "decode" and cfg.disaggregation_decode_enable_radix_cache
            and cfg.speculative_algorithm not in (None, "DSPARK", "EAGLE", "EAGLE3")):
        raise ValueError("--disaggregation-decode-enable-radix-cache is incompatible with speculative decoding "
                         f"(--speculative-algorithm {cfg.speculative_algorithm})")
    if cfg.speculative_use_block_verification:
        if cfg.speculative_algorithm not in ("EAGLE", "EAGLE3", "DFLASH", "DSPARK"):
            raise ValueError("--speculative-use-block-verification only supports EAGLE / EAGLE3 / NEXTN / DFLASH / "
                             "DSPARK.")
        if cfg.device != "cuda":
            raise ValueError("--speculative-use-block-verification only supports CUDA or ROCm.")
        if cfg.speculative_algorithm in ("EAGLE", "EAGLE3") and not cfg.speculative_use_rejection_sampling:
            cfg.speculative_use_rejection_sampling = True
    if cfg.speculative_draft_window_size is not None:
        window = int(cfg.speculative_draft_window_size)
        if window <= 0:
            raise ValueError(f"--speculative-draft-window-size must be positive, got {window}.")
        cfg.speculative_draft_window_size = window
    if cfg.speculative_draft_sink_size is not None:
        sink = int(cfg.speculative_draft_sink_size)
        if sink < 0:
            raise ValueError(f"--speculative-draft-sink-size must be non-negative, got {sink}.")
        if cfg.speculative_draft_window_size is None:
            raise ValueError("--speculative-draft-sink-size requires --speculative-draft-window-size.")
        cfg.speculative_draft_sink_size = sink

    algo = algorithm_from_string(cfg.speculative_algorithm)
    if cfg.speculative_adaptive:
        reason = adaptive_unsupported_reason(cfg)
        if reason is not None:
            logger.warning(f"speculative_adaptive disabled: {reason}. Falling back to static speculative params.")
            cfg.speculative_adaptive = False
        if cfg.speculative_adaptive:
            _init_adaptive_speculative_params(cfg)
    if algo is None:
        return
    if algo == "DFLASH":
        _handle_dflash(cfg)
    elif algo == "UNO":
        _handle_uno(cfg)
    elif algo == "DSPARK":
        _handle_dspark(cfg)
    elif algo == "FROZEN_KV_MTP":
        _handle_frozen_kv_mtp(cfg)
    elif algo in ("EAGLE", "EAGLE3", "STANDALONE"):
        _handle_eagle_family(cfg)
    elif algo == "NGRAM":
        _handle_ngram(cfg)


# --- adaptive (speculative/adaptive_spec_params.py) --------------------------------------------------------

def adaptive_unsupported_reason(cfg) -> str | None:
    if cfg.speculative_algorithm not in ("EAGLE", "EAGLE3"):
        return f"speculative_algorithm={cfg.speculative_algorithm} (only EAGLE/EAGLE3 are supported)"
    if cfg.speculative_eagle_topk is not None and cfg.speculative_eagle_topk != 1:
        return f"speculative_eagle_topk={cfg.speculative_eagle_topk} (only topk=1 is supported)"
    if attn_dp_enabled(cfg):
        return "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)"
    if cfg.enable_multi_layer_eagle:
        return "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)"
    if cfg.enable_two_batch_overlap:
        return ("enable_two_batch_overlap=True is not supported (adaptive state swap would discard the "
                "TboAttnBackend wrapper)")
    if cfg.enable_pdmux:
        return "enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group)"
    return None


def candidate_steps(cfg_path: str | None = None) -> list[int]:
    """resolve_candidate_steps_from_config: the sorted union of every batch-size slot's candidate steps."""
    table = adaptive.load_table(cfg_path)
    return sorted({s for k, entry in table.items() if k.isdigit() for s in entry["candidate_steps"]})


def _init_adaptive_speculative_params(cfg: _Cfg) -> None:
    steps = candidate_steps(cfg.speculative_adaptive_config)
    if cfg.speculative_eagle_topk is None:
        cfg.speculative_eagle_topk = 1
    if cfg.speculative_num_steps is None:
        cfg.speculative_num_steps = steps[len(steps) // 2]
    if cfg.speculative_num_steps not in steps:
        raise ValueError(f"--speculative-num-steps={cfg.speculative_num_steps} is not in the adaptive config "
                         f"candidate_steps {steps}. Pass one of those values.")
    cfg.speculative_num_draft_tokens = cfg.speculative_num_steps + 1


# --- per algorithm (speculative_hook.py) -------------------------------------------------------------------

def _handle_eagle_family(cfg: _Cfg) -> None:
    if cfg.speculative_algorithm == "STANDALONE" and attn_dp_enabled(cfg):
        raise ValueError("Currently standalone speculative decoding does not support dp attention.")
    _max_running_requests_48(cfg)
    _disable_overlap_schedule_for_cpu(cfg)
    if cfg.enable_mixed_chunk and cfg.speculative_algorithm not in ("EAGLE", "EAGLE3", "DFLASH", "DSPARK"):
        cfg.enable_mixed_chunk = False
    model_arch = architecture(cfg.model_path, cfg.revision)
    if model_arch in SELF_DRAFT_ARCHS and cfg.speculative_draft_model_path is None:
        cfg.speculative_draft_model_path = cfg.model_path
        cfg.speculative_draft_model_revision = cfg.revision
    if not cfg.speculative_adaptive and cfg.speculative_num_steps is None:
        assert cfg.speculative_eagle_topk is None and cfg.speculative_num_draft_tokens is None
        steps, topk, draft = _auto_choose_speculative_params(cfg, model_arch)
        cfg.speculative_num_steps, cfg.speculative_eagle_topk, cfg.speculative_num_draft_tokens = steps, topk, draft
    if "trtllm_mha" in _attention_backends(cfg):
        if cfg.speculative_eagle_topk > 1:
            raise ValueError("trtllm_mha backend only supports topk = 1 for speculative decoding.")
    if cfg.speculative_use_rejection_sampling:
        if cfg.speculative_algorithm not in ("EAGLE", "EAGLE3"):
            raise NotImplementedError("--speculative-use-rejection-sampling is only supported for EAGLE / EAGLE3 / "
                                      f"NEXTN, not speculative_algorithm={cfg.speculative_algorithm}.")
        if cfg.speculative_eagle_topk != 1:
            raise ValueError("--speculative-use-rejection-sampling requires --speculative-eagle-topk=1.")
        if cfg.enable_deterministic_inference and not cfg.device.startswith("cuda"):
            raise ValueError("Deterministic rejection sampling is currently supported only on CUDA-compatible "
                             "devices because draft proposal sampling uses a Triton hash kernel.")
        if cfg.speculative_accept_threshold_single != 1.0 or cfg.speculative_accept_threshold_acc != 1.0:
            raise ValueError("--speculative-use-rejection-sampling is incompatible with "
                             "--speculative-accept-threshold-single / --speculative-accept-threshold-acc; rejection "
                             "sampling ignores the accept thresholds.")
    if cfg.speculative_eagle_topk == 1 and cfg.speculative_num_draft_tokens != cfg.speculative_num_steps + 1:
        logger.warning("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                       "speculative_eagle_topk == 1")
        cfg.speculative_num_draft_tokens = cfg.speculative_num_steps + 1
    # with topk unset (steps given without it) this comparison is SGLang's TypeError
    if (cfg.speculative_eagle_topk > 1 and cfg.page_size > 1
            and _attention_backend(cfg) not in PAGE_TREE_SPEC_BACKENDS):
        raise ValueError(f"speculative_eagle_topk > 1 with page_size > 1 is only supported on "
                         f"{PAGE_TREE_SPEC_BACKENDS}; got attention_backend={_attention_backend(cfg)!r}. Use "
                         "page_size == 1 or one of those backends.")


def _auto_choose_speculative_params(cfg: _Cfg, model_arch: str) -> tuple:
    if cfg.speculative_algorithm == "STANDALONE":
        return (3, 1, 4)
    if model_arch in AUTO_5_4_8:
        return (5, 4, 8)
    return (3, 1, 4)  # the DeepSeek / GLM / MiMo ... list and every other model


def _handle_ngram(cfg: _Cfg) -> None:
    if cfg.device not in ("cuda", "cpu", "xpu"):
        raise ValueError("Ngram speculative decoding only supports CUDA, CPU, or XPU devices.")
    _disable_overlap_schedule_for_cpu(cfg)
    _max_running_requests_48(cfg)
    cfg.enable_mixed_chunk = False
    cfg.speculative_eagle_topk = cfg.speculative_ngram_max_bfs_breadth
    if cfg.speculative_num_draft_tokens is None:
        cfg.speculative_num_draft_tokens = 12
    if cfg.speculative_num_steps is None:
        cfg.speculative_num_steps = cfg.speculative_num_draft_tokens // cfg.speculative_eagle_topk
    if cfg.speculative_ngram_external_corpus_path is not None:
        if cfg.speculative_ngram_external_sam_budget <= 0:
            raise ValueError("--speculative-ngram-external-sam-budget must be positive when "
                             "--speculative-ngram-external-corpus-path is set.")
        if cfg.speculative_ngram_external_corpus_max_tokens <= 0:
            raise ValueError("--speculative-ngram-external-corpus-max-tokens must be positive when "
                             "--speculative-ngram-external-corpus-path is set.")
        if cfg.speculative_ngram_external_sam_budget > cfg.speculative_num_draft_tokens - 1:
            raise ValueError("speculative_ngram_external_sam_budget must be less than or equal to "
                             f"speculative_num_draft_tokens - 1 ({cfg.speculative_num_draft_tokens - 1}).")
    if cfg.speculative_eagle_topk > 1 and cfg.page_size > 1 and _attention_backend(cfg) != "flashinfer":
        raise ValueError(f"speculative_eagle_topk({cfg.speculative_eagle_topk}) > 1 with page_size({cfg.page_size}) "
                         "> 1 is unstable and produces incorrect results for paged attention backends. This "
                         "combination is only supported for the 'flashinfer' backend.")
    if attn_dp_enabled(cfg):
        raise ValueError("Currently ngram speculative decoding does not support dp attention.")


def _cuda_only(cfg: _Cfg, algorithm: str) -> None:
    if not (cfg.device.startswith("cuda") or cfg.device in ("npu", "xpu")):
        raise ValueError(f"{algorithm} speculative decoding is not supported by SRTPlatform on device "
                         f"{cfg.device!r}.")


def _draft_block_size(doc: dict | None, *keys) -> int | None:
    if not doc:
        return None
    for key in keys:
        section, _, name = key.rpartition(".")
        holder = doc.get(section) if section else doc
        if isinstance(holder, dict) and holder.get(name) is not None:
            return int(holder[name])
    return None


def _handle_dflash(cfg: _Cfg) -> None:
    _cuda_only(cfg, "DFLASH")
    if attn_dp_enabled(cfg) and cfg.device != "npu":
        if not cfg.device.startswith("cuda"):
            raise ValueError("DFLASH with dp attention requires CUDA or NPU.")
        if not cfg.enable_dp_lm_head:
            raise ValueError("DFLASH with dp attention requires --enable-dp-lm-head.")
        if cfg.attn_cp_size != 1:
            raise ValueError("DFLASH with dp attention does not support context parallel.")
    if cfg.pp_size != 1:
        raise ValueError("Currently DFLASH speculative decoding only supports pp_size == 1.")
    if cfg.speculative_draft_model_path is None:
        raise ValueError("DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    cfg.speculative_num_steps = 1
    cfg.speculative_eagle_topk = 1
    if cfg.speculative_dflash_block_size is not None:
        if int(cfg.speculative_dflash_block_size) <= 0:
            raise ValueError("DFLASH requires --speculative-dflash-block-size to be positive, "
                             f"got {cfg.speculative_dflash_block_size}.")
        if (cfg.speculative_num_draft_tokens is not None
                and int(cfg.speculative_num_draft_tokens) != int(cfg.speculative_dflash_block_size)):
            raise ValueError("Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but "
                             "they differ. For DFLASH they must match. "
                             f"speculative_num_draft_tokens={cfg.speculative_num_draft_tokens}, "
                             f"speculative_dflash_block_size={cfg.speculative_dflash_block_size}.")
        cfg.speculative_num_draft_tokens = int(cfg.speculative_dflash_block_size)
    if cfg.speculative_num_draft_tokens is None:
        draft = model_config(cfg.speculative_draft_model_path, cfg.speculative_draft_model_revision)
        block = _draft_block_size(draft, "dflash_config.block_size", "block_size")
        cfg.speculative_num_draft_tokens = block if block is not None else 16
    if cfg.speculative_draft_window_size is not None:
        if cfg.speculative_draft_window_size < int(cfg.speculative_num_draft_tokens):
            raise ValueError("--speculative-draft-window-size must be >= --speculative-num-draft-tokens "
                             f"(block_size). window_size={cfg.speculative_draft_window_size}, "
                             f"block_size={int(cfg.speculative_num_draft_tokens)}.")
    backend = cfg.speculative_draft_attention_backend
    if backend is None or backend not in DRAFT_ATTENTION_BACKEND_CHOICES:
        prefill = _attention_backends(cfg)[0] if backend is None else None
        backend = prefill if prefill in DRAFT_ATTENTION_BACKEND_CHOICES else "flashinfer"
    cfg.speculative_draft_attention_backend = backend
    _max_running_requests_48(cfg)


def _handle_uno(cfg: _Cfg) -> None:
    if not cfg.device.startswith("cuda"):
        raise ValueError("UNO only supports CUDA.")
    if cfg.speculative_draft_model_path is not None:
        raise ValueError("UNO reuses the target model and does not accept --speculative-draft-model-path.")
    if cfg.uno_lora_path is None:
        raise ValueError("UNO requires --uno-lora-path.")
    if cfg.enable_deterministic_inference:
        raise ValueError("UNO does not support --enable-deterministic-inference because its sampling path does not "
                         "use per-request seeds.")
    if cfg.enable_strict_thinking:
        raise ValueError("UNO does not support --enable-strict-thinking because it requires grammar decoding.")
    width = cfg.speculative_num_draft_tokens
    if width is None or int(width) < 1:
        raise ValueError("UNO requires --speculative-num-draft-tokens to be a positive integer denoting the linear "
                         "width or tree verify width Q.")
    width = cfg.speculative_num_draft_tokens = int(width)
    top_k = 1 if cfg.speculative_eagle_topk is None else int(cfg.speculative_eagle_topk)
    if top_k < 1:
        raise ValueError(f"UNO requires --speculative-eagle-topk to be at least 1, got {top_k}.")
    if top_k > 1:
        if cfg.speculative_num_steps is None:
            raise ValueError("UNO tree mode requires --speculative-num-steps so its draft width F can be derived as "
                             "speculative_num_steps + 1.")
        steps = int(cfg.speculative_num_steps)
        if steps < 1:
            raise ValueError(f"UNO tree mode requires --speculative-num-steps to be positive, got {steps}.")
        if width < steps + 1:
            raise ValueError(f"UNO tree mode requires Q >= F; got Q={width}, F={steps + 1}.")
        if width > 128:
            raise ValueError(f"UNO tree mode currently supports at most Q=128 verify nodes, got Q={width}.")
        if width * top_k > 2048:
            raise ValueError(f"UNO tree mode currently supports Q*K <= 2048; got Q*K={width}*{top_k}={width * top_k}.")
        capacity, nodes = 1, 1
        for _ in range(steps):
            nodes *= top_k
            capacity += nodes
            if capacity >= width:
                break
        if width > capacity:
            raise ValueError("UNO tree mode cannot build the requested Q from F and K: "
                             f"Q={width} exceeds capacity={capacity} for F={steps + 1}, K={top_k}.")
        parent_width = top_k * max(steps - 1, 0) + 1
        if width - 1 > parent_width:
            raise ValueError("UNO tree mode cannot represent the requested Q in EAGLE's parent-list ABI: "
                             f"Q-1={width - 1} exceeds K*(F-2)+1={parent_width} for F={steps + 1}, K={top_k}.")
        if cfg.enable_pdmux:
            raise ValueError("UNO tree mode does not yet support PDMux.")
        if cfg.enable_two_batch_overlap:
            raise ValueError("UNO tree mode does not yet support two-batch overlap.")
        if cfg.speculative_accept_threshold_single != 1.0 or cfg.speculative_accept_threshold_acc != 1.0:
            raise ValueError("UNO tree mode reuses EAGLE target-only sampling and requires both speculative accept "
                             "thresholds to be 1.0.")
        cfg.speculative_num_steps, cfg.speculative_eagle_topk = steps, top_k
    else:
        cfg.speculative_num_steps, cfg.speculative_eagle_topk = 1, 1
    if (cfg.tp_size, cfg.pp_size) != (1, 1):
        raise ValueError("UNO requires TP=PP=1.")
    if attn_dp_enabled(cfg) or cfg.attn_cp_size != 1:
        raise ValueError("UNO does not support DP attention or context parallelism.")
    if cfg.enable_lora or cfg.lora_paths:
        raise ValueError("UNO does not support public Multi-LoRA serving.")
    cfg.enable_lora_overlap_loading, cfg.lora_strict_loading = False, True
    if cfg.speculative_use_rejection_sampling:
        raise ValueError("UNO manages its own stochastic verification and does not use "
                         "--speculative-use-rejection-sampling.")
    if cfg.enable_mixed_chunk:
        cfg.enable_mixed_chunk = False
    prefill, decode = _attention_backends(cfg)
    if (prefill, decode) != ("fa3", "fa3"):
        raise ValueError("UNO requires FA3 for both prefill and decode attention; "
                         f"got prefill={prefill!r}, decode={decode!r}.")


def _handle_dspark(cfg: _Cfg) -> None:
    if not cfg.device.startswith(("cuda", "npu", "xpu")):
        raise ValueError("DSpark speculative decoding only supports CUDA, NPU or XPU device.")
    if cfg.attn_dp_size > 1 and not cfg.enable_dp_lm_head:
        raise ValueError("DSpark with dp attention requires --enable-dp-lm-head.")
    if cfg.pp_size != 1 and cfg.disaggregation_mode != "prefill":
        raise ValueError("DSpark pipeline parallelism requires PD prefill; decode and non-disaggregated serving "
                         "require pp_size == 1.")
    target = model_config(cfg.model_path, cfg.revision) or {}
    if cfg.speculative_draft_model_path is None:
        bundled = any(target.get(k) is not None for k in ("dspark_block_size", "dspark_markov_rank",
                                                            "dspark_noise_token_id", "dspark_target_layer_ids"))
        sub = Path(cfg.model_path, "dspark")
        if bundled:
            cfg.speculative_draft_model_path, cfg.speculative_draft_model_revision = cfg.model_path, cfg.revision
        elif os.path.isdir(cfg.model_path) and (sub / "config.json").is_file():
            cfg.speculative_draft_model_path = str(sub)
        else:
            raise ValueError("DSpark dense speculative decoding requires setting --speculative-draft-model-path.")
    cfg.speculative_num_steps = 1
    cfg.speculative_eagle_topk = 1
    gamma = None
    if cfg.speculative_dspark_block_size is not None:
        if int(cfg.speculative_dspark_block_size) <= 0:
            raise ValueError("DSpark requires --speculative-dspark-block-size to be positive, "
                             f"got {cfg.speculative_dspark_block_size}.")
        gamma = int(cfg.speculative_dspark_block_size)
    else:
        draft = model_config(cfg.speculative_draft_model_path, cfg.speculative_draft_model_revision)
        gamma = _draft_block_size(draft, "dspark_block_size", "dspark_config.block_size",
                                  "dflash_config.block_size", "block_size")
        if gamma is None and cfg.speculative_num_draft_tokens is None:
            gamma = DEFAULT_DSPARK_GAMMA
    if gamma is not None:
        window = int(gamma) + 1
        if cfg.speculative_num_draft_tokens is not None and int(cfg.speculative_num_draft_tokens) != window:
            raise ValueError(f"DSpark speculative_num_draft_tokens must equal gamma + 1 (= {window} for "
                             f"gamma={gamma}), but got "
                             f"speculative_num_draft_tokens={cfg.speculative_num_draft_tokens}.")
        cfg.speculative_num_draft_tokens = window
    if int(cfg.speculative_num_draft_tokens) < 2:
        raise ValueError("DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1), "
                         f"got {cfg.speculative_num_draft_tokens}.")
    _max_running_requests_48(cfg)


def _handle_frozen_kv_mtp(cfg: _Cfg) -> None:
    _max_running_requests_48(cfg)
    if cfg.enable_mixed_chunk:
        cfg.enable_mixed_chunk = False
