"""SGLang's own rewrites of the settings a config gives, applied to the desired side before it is compared with
what a live server reports (``/server_info``): a server SGLang started from config X then compares equal to X.

The rules are SGLang 0.5.23's resolution hooks (srt/arg_groups/speculative_hook.py), cross-checked against the
real resolver in tests/test_real_sglang.py on every shipped config and an edge corpus:

- names are upper-cased; ``NEXTN`` (and ``EAGLE``) are served as ``EAGLE`` -- or ``FROZEN_KV_MTP`` for a Gemma-4
  assistant draft, which only the draft's checkpoint tells;
- EAGLE family with none of steps / topk / draft tokens (and no adaptive mode): SGLang chooses them from the target
  model's architecture (Llama: 5/4/8; STANDALONE always 3/1/4);
- adaptive mode (when SGLang keeps it on: :func:`adaptive_off_reason`): topk defaults to 1, steps to the middle of
  the candidate steps (3 for the built-in table), draft tokens to steps + 1;
- topk 1: draft tokens become steps + 1;
- NGRAM: topk becomes ``speculative-ngram-max-bfs-breadth``, draft tokens default to 12, steps to draft // topk;
- DFLASH and DSPARK run one step of topk 1 over a block (draft tokens from the block size, else the draft
  checkpoint); UNO with topk 1 (its default) runs one step; FROZEN_KV_MTP leaves the tree as given.

Where the answer depends on a model's checkpoint (which the controller never reads), the desired value is
:data:`AUTO`: whatever SGLang chose is what was asked for.
"""
from __future__ import annotations

from operations.model.engines.adaptive import DEFAULT_STEPS  # SGLang's built-in adaptive table's candidate steps

EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")  # after NEXTN -> EAGLE
CHECKPOINT_TREE = ("DFLASH", "UNO", "DSPARK", "FROZEN_KV_MTP")  # tree sizes come from the draft checkpoint
KNOWN = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", *CHECKPOINT_TREE)
TREE = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
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


def adaptive_off_reason(args: dict) -> str | None:
    """Why SGLang would silently turn ``--speculative-adaptive`` off for these args (adaptive_spec_params.py
    ``adaptive_unsupported_reason``), or None."""
    algo = algorithm(args.get("speculative_algorithm"))
    if algo not in ("EAGLE", "EAGLE3"):
        return f"adaptive speculation needs EAGLE / EAGLE3 / NEXTN, not {algo}"
    if args.get("speculative_eagle_topk") not in (None, 1):
        return "adaptive speculation needs speculative-eagle-topk 1"
    for dest, what in (("enable_dp_attention", "attention DP"), ("enable_multi_layer_eagle", "multi-layer EAGLE"),
                       ("enable_two_batch_overlap", "two-batch overlap"), ("enable_pdmux", "PD multiplexing")):
        if args.get(dest):
            return f"adaptive speculation does not work with {what}"
    return None


def speculative(args: dict) -> dict:
    """The speculative fields of ``args`` (dest -> value, SGLang's defaults filled in) as SGLang resolves them."""
    out = {k: args.get(k) for k in ("speculative_algorithm", "speculative_draft_model_path", "speculative_adaptive",
                                    *TREE)}
    given = args.get("speculative_algorithm")
    if given is None:
        return out
    algo = algorithm(given)
    draft_path = args.get("speculative_draft_model_path")
    steps, topk, draft = (args.get(k) for k in TREE)
    adaptive = bool(args.get("speculative_adaptive")) and adaptive_off_reason(args) is None
    out["speculative_adaptive"] = adaptive
    # a Gemma-4 assistant draft turns EAGLE into FROZEN_KV_MTP, which leaves the tree as given
    gemma_maybe = algo == "EAGLE" and bool(draft_path)
    out["speculative_algorithm"] = OneOf(("EAGLE", "FROZEN_KV_MTP")) if gemma_maybe else algo
    if draft_path is None and algo == "EAGLE":
        out["speculative_draft_model_path"] = AUTO  # DeepSeek-style MTP: the target checkpoint is its own draft
    if algo == "FROZEN_KV_MTP":
        tree = (steps, topk, draft)
    elif algo in ("DFLASH", "DSPARK"):  # one step of a block; the block size comes from the draft checkpoint
        size = args.get(f"speculative_{algo.lower()}_block_size")
        tree = (1, 1, draft if draft is not None else
                (size if algo == "DFLASH" else size + 1) if isinstance(size, int) else AUTO)
    elif algo == "UNO":
        topk = 1 if topk is None else topk
        tree = (1 if topk == 1 else steps, topk, draft)
    elif algo == "NGRAM":
        topk = args.get("speculative_ngram_max_bfs_breadth")
        draft = NGRAM_DRAFT_TOKENS if draft is None else draft
        if steps is None and isinstance(draft, int) and isinstance(topk, int) and topk:
            steps = draft // topk
        tree = (steps, topk, draft)
    else:  # the EAGLE family
        tree = _eagle_tree(algo, steps, topk, draft, adaptive, args)
        if gemma_maybe:  # as FROZEN_KV_MTP the tree stays as given
            tree = tuple(t if t == g else OneOf((t, g)) for t, g in zip(tree, (steps, topk, draft)))
    return {**out, **dict(zip(TREE, tree))}


def _eagle_tree(algo, steps, topk, draft, adaptive: bool, args: dict) -> tuple:
    if adaptive:
        topk = 1 if topk is None else topk
        if steps is None:  # the middle candidate: of the built-in table, of a shipped table, else unknown here
            known = args.get("adaptive_candidate_steps") or (
                None if args.get("speculative_adaptive_config") else DEFAULT_STEPS)
            steps = known[len(known) // 2] if known else AUTO
        return steps, topk, steps + 1 if isinstance(steps, int) else AUTO
    if steps is None and topk is None and draft is None:
        return (3, 1, 4) if algo == "STANDALONE" else (AUTO, AUTO, AUTO)  # else chosen by the target model
    if topk == 1 and isinstance(steps, int):
        draft = steps + 1
    return steps, topk, draft


class OneOf:
    """A desired value that is one of a few, where only the checkpoint tells which."""

    def __init__(self, values):
        self.values = tuple(values)

    def __eq__(self, other) -> bool:
        if isinstance(other, OneOf):
            return other.values == self.values
        return any(matches(v, other) for v in self.values)

    def __hash__(self) -> int:
        return hash(self.values)

    def __repr__(self) -> str:
        return " or ".join(map(repr, self.values))
