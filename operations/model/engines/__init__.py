"""Engine specifics, one module each: how config keys map to flags, what is valid, how argv is rendered, how a
live server reports (``sglang.SGLang``, ``vllm.VLLM``); ``mismatches`` is the one desired-vs-reported comparison."""
from __future__ import annotations

from operations.model.engines import sglang_resolve
from operations.model.engines.secret_ref import SecretRef
from operations.model.engines.sglang import AUTO, SGLang
from operations.model.engines.vllm import VLLM

__all__ = ["AUTO", "ENGINE_TABLE", "SGLang", "SecretRef", "VLLM", "engine_for", "mismatches"]

ENGINE_TABLE = {"sglang": SGLang(), "vllm": VLLM()}


def mismatches(desired: dict, current: dict) -> list[tuple[str, object, object]]:
    """(field, current, desired) for every desired field the current side differs on: the one comparison behind
    readiness, drift and ``--dry`` (:data:`AUTO` matches anything)."""
    return [(k, current.get(k), v) for k, v in desired.items() if not sglang_resolve.matches(v, current.get(k))]


def engine_for(name: str):
    return ENGINE_TABLE[name]
