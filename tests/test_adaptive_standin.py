"""The stand-in's adaptive speculation (gpusim.adaptive) against SGLang 0.5.23's own classes
(speculative/adaptive_spec_params.py, run in the real SGLang interpreter on CPU) on the same accepted-draft
sequences, and against a case worked out by hand from SGLang's rules."""
import json
import random

import pytest

from gpusim.adaptive import DEFAULT_TABLE, AdaptiveParams
from test_real_sglang import run_python

TABLES = {
    "builtin": None,
    "tuned": json.loads(open("configs/adaptive/llama3.1-8b.json").read()),
    "ceiling": {"ceiling_coeff": 1.5, "update_interval": 2, "warmup_batches": 3,
                "1": {"candidate_steps": [1, 2, 4, 6]}, "16": {"candidate_steps": [0, 2]}},
    "hysteresis": {"up_hysteresis": 0.4, "down_hysteresis": 0.3, "ema_alpha": 0.5,
                   "2": {"candidate_steps": [0, 1, 3, 5]}},
}


def sequences(seed: int, n: int = 400) -> list[tuple[int, list[int]]]:
    """(batch size, accepted drafts per request) per verify: load that rises and falls, acceptance that drifts."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        batch = max(1, int(40 * abs(((i // 40) % 4) - 1.5) / 1.5) + rng.randint(-2, 2))
        good = 0.3 + 0.6 * ((i // 70) % 2)  # phases of easy and hard text
        out.append((batch, [sum(rng.random() < good ** (k + 1) for k in range(7)) for _ in range(min(batch, 6))]))
    return out


REAL = """
import json, sys, tempfile
from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams
out = {}
for case in json.load(sys.stdin):
    path = None
    if case["table"] is not None:
        fh = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(case["table"], fh)
        fh.close()
        path = fh.name
    p = AdaptiveSpeculativeParams(case["initial"], path)
    steps = []
    for batch, accepted in case["seq"]:
        p.on_verify_complete(accepted, batch)
        steps.append(p.get_steps_for_batch(batch))
    out[case["id"]] = steps
print(json.dumps(out))
"""


def ours(initial, table, seq) -> list[int]:
    p = AdaptiveParams(initial, table)
    steps = []
    for batch, accepted in seq:
        p.on_verify(accepted, batch)
        steps.append(p.steps_for(batch))
    return steps


def test_step_choice_is_sglangs_on_the_same_sequences(sglang_python):
    cases = [{"id": f"{name}:{initial}:{seed}", "table": table, "initial": initial, "seq": sequences(seed)}
             for name, table in TABLES.items() for initial in (3, 4) for seed in (1, 2)]
    proc = run_python(sglang_python, ["-c", REAL], stdin=json.dumps(cases))
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = json.loads(proc.stdout)
    moved = 0
    for case in cases:
        mine = ours(case["initial"], case["table"], [tuple(x) for x in case["seq"]])
        assert mine == real[case["id"]], case["id"]
        moved += len(set(mine)) > 1
    assert moved >= len(cases) // 2  # the sequences make the steps move, or the comparison would prove little


@pytest.fixture(scope="module")
def sglang_python():
    from test_real_sglang import find_sglang_python
    python, reason = find_sglang_python()
    if python is None:
        pytest.fail(reason, pytrace=False)
    return python


def test_a_case_worked_out_by_hand_from_sglangs_rules():
    """Batch size 1 (candidates 1/3/5/7, down_hysteresis -0.25) starts at 3 steps, EMA 2.0.

    - 15 verifies accepting 5 drafts: EMA = 5 - 3 * 0.8**15 = 4.894; the first update after warm-up (verify 15)
      finds no way down (4.894 > 1 - 0.5 - 0.25) and moves up while EMA > step - 0.5: 3 -> 5 -> 7.
    - 5 verifies accepting 0: EMA 4.894 * 0.8**5 = 1.604; down while EMA <= prev - 0.5 - 0.25: 7 -> 5 (<= 4.25)
      -> 3 (<= 2.25), not to 1 (> 0.25).
    - 5 more: EMA 0.526, still > 0.25: stays at 3 (and not up: 0.526 <= 2.5).
    - 5 more: EMA 0.172 <= 0.25: 3 -> 1."""
    p = AdaptiveParams(3, {"1": DEFAULT_TABLE["1"]})
    s = p.slots[1]
    seen = [p.on_verify([5], 1) for _ in range(15)]
    assert seen == [None] * 14 + [7] and abs(s.ema - (5 - 3 * 0.8 ** 15)) < 1e-9
    after = []
    for _ in range(3):
        for _ in range(5):
            p.on_verify([0], 1)
        after.append((round(s.ema, 3), s.steps))
    assert after == [(1.604, 3), (0.526, 3), (0.172, 1)]


def test_a_batch_goes_to_the_slot_with_the_largest_key_at_most_its_size():
    p = AdaptiveParams(3)  # the built-in table: 1, 8, 32, 64
    assert [p.steps_for(b) for b in (1, 7, 8, 31, 32, 63, 64, 500)] == [3, 3, 3, 3, 1, 1, 0, 0]
    padded = AdaptiveParams(3, cuda_graph_bs=[1, 2, 4, 8, 16, 24, 32])
    assert padded.slot(25) is padded.slots[32]  # 25 pads to the CUDA-graph size 32


def _engine(table=None):
    from types import SimpleNamespace

    from gpusim.sglang_server import Engine
    args = SimpleNamespace(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_eagle_topk=1,
                           speculative_num_draft_tokens=4, speculative_adaptive=True,
                           speculative_adaptive_config=table)
    return Engine(args, {"decode_step_ms": 1.0, "token_slot_ms": 0.01, "draft_step_ms": 0.1}, 2.24)


def _serve(engine, concurrency: int, tokens: int) -> list:
    reqs = [engine.submit(8, tokens) for _ in range(concurrency)]
    for r in reqs:
        for _ in engine.stream(r):
            pass
    return reqs


def test_the_standin_drafts_alone_and_decodes_plainly_when_busy():
    """One request at a time runs in the batch-1 slot (1/3/5/7 steps: it drafts, more than one token per step);
    64 at once run in the 64 slot ([0]: plain decode steps, one token per request per step)."""
    alone = _engine()
    (r,) = _serve(alone, 1, 200)
    assert 0 not in alone.steps_run and sum(alone.steps_run.values()) == r.steps
    assert r.tokens / r.steps > 1.5 and alone.average_accept() > 1.5
    busy = _engine()
    reqs = _serve(busy, 64, 40)
    assert busy.steps_run[0] >= 39 and all(r.steps == r.tokens for r in reqs)  # prefill + 39 one-token steps


def test_the_standin_reads_its_table_from_the_file(tmp_path):
    table = tmp_path / "adaptive.json"
    table.write_text(json.dumps({"1": {"candidate_steps": [0]}}))  # never draft
    engine = _engine(str(table))
    (r,) = _serve(engine, 1, 30)
    assert set(engine.steps_run) == {0} and r.steps == r.tokens and engine.average_accept() is None
