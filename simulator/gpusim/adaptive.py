"""SGLang 0.5.23's adaptive speculation, as the stand-in runs it (speculative/adaptive_spec_params.py, same rules):

- the table maps batch-size keys (digits) to slots; a batch goes to the slot with the largest key <= its size
  (after padding to a CUDA-graph batch size, when those are known), the smallest slot below every key;
- each slot keeps an EMA of the accepted drafts per request (``ema_alpha``, 0.2), starting at steps - 1; a step
  with 0 draft steps (plain decode) leaves it as it is;
- after ``warmup_batches`` (10) batches, every ``update_interval`` (5) batches it moves down one candidate while
  the EMA is <= (previous candidate - 0.5 + ``down_hysteresis``; 0.5 when that candidate is 0), else up while it is
  > (current - 0.5 + ``up_hysteresis``); from 0 it probes the smallest positive candidate (its EMA reset to that
  step - 1 when negative); ``ceiling_coeff`` > 0 caps a non-rising target at ceil(EMA x coeff).

tests/test_adaptive_standin.py drives SGLang's own classes and these with the same accepted-draft sequences.
"""
from __future__ import annotations

import bisect
import json
import math

# SGLang's built-in table (DEFAULT_ADAPTIVE_CONFIG)
DEFAULT_TABLE = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


def load_table(path: str | None) -> dict:
    """The table in ``path`` (None: the built-in one), refused as SGLang's ``_load_adaptive_config`` refuses it."""
    if path is None:
        return DEFAULT_TABLE
    with open(path) as fh:
        table = json.load(fh)
    for key, entry in table.items():
        steps = entry.get("candidate_steps") if key.isdigit() else []
        if key.isdigit() and (not isinstance(steps, list) or not steps
                              or not all(isinstance(s, int) and s >= 0 for s in steps)):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
    if not any(key.isdigit() for key in table):
        raise ValueError("speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
                         f'{{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(table.keys())}')
    return table


class Slot:
    """One batch-size slot: its candidate steps, the EMA of accepted drafts and the steps it runs now."""

    def __init__(self, initial_steps: int, cfg: dict):
        self.candidates = sorted(set(cfg["candidate_steps"]))
        self.ema_alpha = cfg.get("ema_alpha", 0.2)
        self.update_interval = cfg.get("update_interval", 5)
        self.warmup_batches = cfg.get("warmup_batches", 10)
        self.down_hysteresis = cfg.get("down_hysteresis", -0.25)
        self.up_hysteresis = cfg.get("up_hysteresis", 0.0)
        self.ceiling_coeff = cfg.get("ceiling_coeff", 0)
        self.steps = initial_steps if initial_steps in self.candidates else self.candidates[len(self.candidates) // 2]
        self.ema = float(self.steps - 1)
        self.batches = 0

    def update(self, accepted: list[int]) -> bool:
        """Feed one verify's accepted drafts per request; True if the steps changed."""
        if not accepted:
            return False
        if self.steps > 0:
            self.ema = (1 - self.ema_alpha) * self.ema + self.ema_alpha * sum(accepted) / len(accepted)
        self.batches += 1
        if self.batches <= self.warmup_batches or (self.batches - self.warmup_batches) % self.update_interval:
            return False
        return self._retarget()

    def _retarget(self) -> bool:
        old = self.steps
        i = self.candidates.index(old)
        if old == 0:  # probe the smallest positive step after a plain-decode interval
            target = self.candidates[min(i + 1, len(self.candidates) - 1)]
            if target > 0 and self.ema < 0:
                self.ema = float(target - 1)
            return self._apply(target)
        start = i
        while i > 0:
            prev = self.candidates[i - 1]
            if self.ema <= (0.5 if prev == 0 else prev - 0.5) + self.down_hysteresis:
                i -= 1
            else:
                break
        if i == start:
            while i < len(self.candidates) - 1 and self.ema > self.candidates[i] - 0.5 + self.up_hysteresis:
                i += 1
        target = self.candidates[i]
        if self.ceiling_coeff > 0:
            ceiling = max(1, math.ceil(self.ema * self.ceiling_coeff))
            if ceiling < target <= old:
                while i > 0 and self.candidates[i] > ceiling:
                    i -= 1
                target = self.candidates[i]
        return self._apply(target)

    def _apply(self, target: int) -> bool:
        changed, self.steps = target != self.steps, target
        return changed


class AdaptiveParams:
    """The slots of one table (None: SGLang's built-in one), and the routing of a batch to its slot."""

    def __init__(self, initial_steps: int, table: dict | None = None, cuda_graph_bs: list[int] | None = None):
        table = DEFAULT_TABLE if table is None else table
        entries = {int(k): v for k, v in table.items() if k.isdigit()}
        self.keys = sorted(entries)
        self.slots = {bs: Slot(initial_steps, {**table, **entries[bs]}) for bs in self.keys}
        self.cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def slot(self, batch: int) -> Slot:
        if self.cuda_graph_bs is not None:
            i = bisect.bisect_left(self.cuda_graph_bs, batch)
            batch = self.cuda_graph_bs[i] if i < len(self.cuda_graph_bs) else batch
        return self.slots[self.keys[max(0, bisect.bisect_right(self.keys, batch) - 1)]]

    def steps_for(self, batch: int) -> int:
        return self.slot(batch).steps

    def on_verify(self, accepted: list[int], batch: int) -> int | None:
        """The new steps of the batch's slot if this verify changed them, else None."""
        s = self.slot(batch)
        return s.steps if s.update(accepted) else None
