"""SGLang's adaptive speculation table (``--speculative-adaptive-config FILE.json``), checked as SGLang 0.5.23 reads
it (speculative/adaptive_spec_params.py ``_load_adaptive_config``) and stricter where SGLang would fail later or
silently: a batch-size key is digits, its slot a mapping with ``candidate_steps`` (a non-empty list of
non-negative integers; 0 = a plain decode step); keys that are not digits set every slot's defaults, and one that
is none of those SGLang reads is refused here (SGLang ignores it, so a typo such as ``"l6"`` would go unseen)."""
from __future__ import annotations

import json

# the per-slot settings SGLang reads (AdaptiveStepSlot), also accepted at the top level as every slot's default
SLOT_SETTINGS = {"ema_alpha": "a number in (0, 1]", "update_interval": "an integer >= 1",
                 "warmup_batches": "an integer >= 0", "up_hysteresis": "a number", "down_hysteresis": "a number",
                 "ceiling_coeff": "a number >= 0"}
# SGLang's built-in table, used without a file: its candidate steps, sorted union
DEFAULT_STEPS = (0, 1, 3, 5, 7)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _setting_problem(key: str, value) -> str | None:
    ok = {"ema_alpha": lambda v: _is_number(v) and 0 < v <= 1,
          "update_interval": lambda v: _is_int(v) and v >= 1,  # SGLang takes a modulo by it: 0 fails at decode
          "warmup_batches": lambda v: _is_int(v) and v >= 0,
          "ceiling_coeff": lambda v: _is_number(v) and v >= 0}.get(key, _is_number)
    return None if ok(value) else f"{key} must be {SLOT_SETTINGS[key]}, got {value!r}"


def _slot_problems(key: str, slot) -> list[str]:
    if not isinstance(slot, dict):
        return [f'batch size "{key}": must be a mapping with candidate_steps, got {type(slot).__name__}']
    out = []
    steps = slot.get("candidate_steps")
    if not isinstance(steps, list) or not steps or not all(_is_int(s) and s >= 0 for s in steps):
        out.append(f'batch size "{key}": candidate_steps must be a non-empty list of non-negative integers '
                   f'(0 = no drafting), got {steps!r}')
    for name, value in slot.items():
        if name == "candidate_steps":
            continue
        problem = _setting_problem(name, value) if name in SLOT_SETTINGS else \
            f"{name!r} is not a slot setting (known: candidate_steps, {', '.join(SLOT_SETTINGS)})"
        if problem:
            out.append(f'batch size "{key}": {problem}')
    return out


def problems(doc) -> list[str]:
    """Every reason the parsed JSON ``doc`` is not an adaptive table SGLang runs as written (empty: it is)."""
    if not isinstance(doc, dict):
        return [f"must be a JSON object of batch-size keys, got {type(doc).__name__}"]
    out = []
    for key, value in doc.items():
        if key.isdigit():
            out += _slot_problems(key, value)
        elif key in SLOT_SETTINGS:
            problem = _setting_problem(key, value)
            out += [problem] if problem else []
        else:
            out.append(f"{key!r} is neither a batch size (digits, e.g. \"8\") nor a setting "
                       f"({', '.join(SLOT_SETTINGS)}); SGLang would ignore it")
    if not any(key.isdigit() for key in doc):
        out.append('needs at least one batch-size key, e.g. {"1": {"candidate_steps": [1, 3, 5]}}')
    return out


def parse(text: str) -> tuple[dict | None, list[str]]:
    """(the table, its problems) from the file's text."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return None, [f"is not JSON: {exc}"]
    return doc, problems(doc)


def candidate_steps(doc: dict | None) -> tuple[int, ...]:
    """The union of every slot's candidate steps, sorted (what SGLang sizes its buffers for, and where
    ``--speculative-num-steps`` must be); SGLang's built-in table's without a document."""
    if doc is None:
        return DEFAULT_STEPS
    return tuple(sorted({s for k, slot in doc.items() if k.isdigit() for s in slot["candidate_steps"]}))
