"""SGLang's own rewrites of the settings a config gives, applied to the desired side before it is compared with
what a live server reports (``/server_info``): a server SGLang started from config X then compares equal to X.

The rules are SGLang 0.5.23's resolution hooks (srt/arg_groups/speculative_hook.py), cross-checked against the
real resolver in tests/test_real_sglang.py on every shipped config and an edge corpus:

- names are upper-cased; ``NEXTN`` (and ``EAGLE``) are served as ``EAGLE`` -- or ``FROZEN_KV_MTP`` for a Gemma-4
  assistant draft, which only the draft's checkpoint tells;
- EAGLE family with none of steps / topk / draft tokens (and no adaptive mode): SGLang chooses them from the target
  model's architecture (Llama: 5/4/8; STANDALONE always 3/1/4);
- adaptive mode: topk defaults to 1, steps to the middle of the candidate steps (3 for the built-in table),
  draft tokens to steps + 1;
- topk 1: draft tokens become steps + 1;
- NGRAM: topk becomes ``speculative-ngram-max-bfs-breadth``, draft tokens default to 12, steps to draft // topk;
- DFLASH, UNO, DSPARK, FROZEN_KV_MTP derive their tree from the draft checkpoint: only what the config gives
  outside the tree is compared.

Where the answer depends on a model's checkpoint (which the controller never reads), the desired value is
:data:`AUTO`: whatever SGLang chose is what was asked for.
"""
from __future__ import annotations

EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")  # after NEXTN -> EAGLE
CHECKPOINT_TREE = ("DFLASH", "UNO", "DSPARK", "FROZEN_KV_MTP")  # tree sizes come from the draft checkpoint
KNOWN = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", *CHECKPOINT_TREE)
TREE = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
# the candidate steps of SGLang's built-in adaptive table (speculative/adaptive_spec_params.py), sorted union
DEFAULT_ADAPTIVE_STEPS = (0, 1, 3, 5, 7)
NGRAM_DRAFT_TOKENS = 12


class _Auto:
    """A desired value SGLang decides from the model's checkpoint: any reported value matches."""

    def __repr__(self) -> str:
        return "(SGLang decides)"

    def __reduce__(self):
        return "AUTO"


AUTO = _Auto()


def matches(desired, reported) -> bool:
    return desired is AUTO or desired == reported


def algorithm(name):
    """The algorithm name as SGLang reports it (``eagle3`` -> ``EAGLE3``, ``NEXTN`` -> ``EAGLE``)."""
    if not isinstance(name, str):
        return name
    name = name.upper()
    return "EAGLE" if name == "NEXTN" else name


def speculative(args: dict) -> dict:
    """The speculative fields of ``args`` (dest -> value, SGLang's defaults filled in) as SGLang resolves them."""
    out = {k: args.get(k) for k in ("speculative_algorithm", "speculative_draft_model_path", *TREE)}
    given = args.get("speculative_algorithm")
    if given is None:
        return out
    algo = algorithm(given)
    # a Gemma-4 assistant draft turns EAGLE into FROZEN_KV_MTP
    out["speculative_algorithm"] = (OneOf(("EAGLE", "FROZEN_KV_MTP"))
                                    if algo == "EAGLE" and args.get("speculative_draft_model_path") else algo)
    steps, topk, draft = (args.get(k) for k in TREE)
    if algo in CHECKPOINT_TREE:
        return {**out, **{k: AUTO for k in TREE}}
    if out["speculative_draft_model_path"] is None and algo == "EAGLE":
        out["speculative_draft_model_path"] = AUTO  # DeepSeek-style MTP: the target checkpoint is its own draft
    if algo == "NGRAM":
        topk = args.get("speculative_ngram_max_bfs_breadth")
        draft = NGRAM_DRAFT_TOKENS if draft is None else draft
        if steps is None and isinstance(draft, int) and isinstance(topk, int) and topk:
            steps = draft // topk
        return {**out, **dict(zip(TREE, (steps, topk, draft)))}
    if args.get("speculative_adaptive"):
        topk = 1 if topk is None else topk
        if steps is None:
            steps = (DEFAULT_ADAPTIVE_STEPS[len(DEFAULT_ADAPTIVE_STEPS) // 2]
                     if not args.get("speculative_adaptive_config") else AUTO)
        draft = steps + 1 if isinstance(steps, int) else AUTO
    elif steps is None and topk is None and draft is None:
        if algo == "STANDALONE":
            steps, topk, draft = 3, 1, 4
        else:
            return {**out, **{k: AUTO for k in TREE}}
    if topk == 1 and isinstance(steps, int):
        draft = steps + 1
    return {**out, **dict(zip(TREE, (steps, topk, draft)))}


class OneOf:
    """A desired value that is one of a few, where only the checkpoint tells which."""

    def __init__(self, values):
        self.values = tuple(values)

    def __eq__(self, other) -> bool:
        return other in self.values or (isinstance(other, OneOf) and other.values == self.values)

    def __hash__(self) -> int:
        return hash(self.values)

    def __repr__(self) -> str:
        return " or ".join(self.values)
