"""An offline Hugging Face cache holding only ``config.json`` files: all SGLang's resolver reads of a model.

``make_cache(root)`` writes one snapshot per model below ``root/hub`` and returns the environment that points
SGLang at it (``HF_HOME``, ``HF_HUB_OFFLINE=1``). The configs are the public ones' architecture fields (what the
resolver's hooks look at: ``architectures``, ``model_type``, sizes, DeepSeek's ``num_nextn_predict_layers``), no
weights. Every model-path / draft path of the shipped configs is here (tests/test_real_sglang.py asserts it), plus
the edge corpus's models:

- a DeepSeek-V3-like target (``DeepseekV3ForCausalLM`` with ``num_nextn_predict_layers: 1``): NEXTN / EAGLE without a
  draft path draft with the target's own MTP layers (SGLang sets the draft path to the model path for this
  architecture family, srt/arg_groups/speculative_hook.py ``_handle_eagle_family``, and loads it as
  ``DeepseekV3ForCausalLMNextN``, srt/configs/model_config.py ``_config_draft_model``);
- a Qwen-like target (``Qwen2ForCausalLM``: not in any of SGLang's per-architecture tables, so the generic defaults);
- a Gemma-4 assistant draft (``Gemma4AssistantForCausalLM``): turns EAGLE / NEXTN into FROZEN_KV_MTP.

Run as a program: ``python tests/real_sglang/models.py ROOT`` (prints the environment as JSON).
"""
from __future__ import annotations

import json
import os
import sys

SNAPSHOT = "0" * 40


def _llama(hidden, inter, layers, heads, kv, max_pos=131072, **extra):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": inter, "num_attention_heads": heads, "num_hidden_layers": layers,
            "num_key_value_heads": kv, "vocab_size": 128256, "max_position_embeddings": max_pos,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16", "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "tie_word_embeddings": False,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"}, **extra}


def _eagle3(hidden, inter, heads, kv):
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": inter, "num_attention_heads": heads, "num_hidden_layers": 1,
            "num_key_value_heads": kv, "vocab_size": 128256, "draft_vocab_size": 32000,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "hidden_act": "silu",
            "tie_word_embeddings": False}


DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8,
    "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3,
    "norm_topk_prob": True, "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "vocab_size": 129280, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "attention_bias": False, "attention_dropout": 0.0}

QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "torch_dtype": "bfloat16",
    "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
    "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28}

GEMMA4_ASSISTANT = {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
                    "torch_dtype": "bfloat16",
                    "text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
                                    "enable_moe_block": False, "use_double_wide_mlp": False}}

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3_8B = "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"
LLAMA_70B = "meta-llama/Llama-3.3-70B-Instruct"
EAGLE3_70B = "lmsys/sglang-EAGLE3-LLaMA3.3-Instruct-70B"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"
QWEN = "Qwen/Qwen2.5-7B-Instruct"
GEMMA4_DRAFT = "google/gemma-4-assistant-draft"

MODELS = {
    LLAMA_8B: _llama(4096, 14336, 32, 32, 8),
    EAGLE3_8B: _eagle3(4096, 14336, 32, 8),
    LLAMA_70B: _llama(8192, 28672, 80, 64, 8),
    EAGLE3_70B: _eagle3(8192, 28672, 64, 8),
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": _eagle3(4096, 14336, 32, 8),  # the vLLM config's draft
    DEEPSEEK: DEEPSEEK_V3,
    QWEN: QWEN2_7B,
    GEMMA4_DRAFT: GEMMA4_ASSISTANT,
}


def make_cache(root, models=None) -> dict:
    """Write ``config.json`` snapshots for ``models`` (repo id -> config; default MODELS) below ``root``; the
    environment variables that make SGLang (huggingface_hub) read them offline."""
    root = os.fspath(root)
    for repo, config in (MODELS if models is None else models).items():
        base = os.path.join(root, "hub", "models--" + repo.replace("/", "--"))
        snapshot = os.path.join(base, "snapshots", SNAPSHOT)
        os.makedirs(snapshot, exist_ok=True)
        os.makedirs(os.path.join(base, "refs"), exist_ok=True)
        with open(os.path.join(base, "refs", "main"), "w") as fh:
            fh.write(SNAPSHOT)
        with open(os.path.join(snapshot, "config.json"), "w") as fh:
            json.dump(config, fh, indent=1)
    return {"HF_HOME": root, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


if __name__ == "__main__":
    print(json.dumps(make_cache(sys.argv[1])))
