"""Readiness verdicts and drift, with scripted server documents on a synthetic clock."""
from operations.model.config import from_mapping
from operations.controller.readiness import await_ready
from operations.model.server_state import ServerStatus, drift, recorded_view

from test_idle_converge import FakeClock

SPEC = {"model-path": "m", "speculative-algorithm": "EAGLE3", "speculative-draft-model-path": "d",
        "speculative-num-steps": 3, "speculative-eagle-topk": 4, "speculative-num-draft-tokens": 16,
        "specops": {"min_accept_length": 2.0, "ready_timeout_s": 30}}


def info(**override):
    args = {"model_path": "m", "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "d",
            "speculative_num_steps": 3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 16,
            "tp_size": 1, "dp_size": 1, "port": 30000, **override.pop("args", {})}
    return {"server_args": args, "internal_states": [{"avg_spec_accept_length": override.get("accept", 3.2)}]}


def ready_doc(**kw):
    return {"dead": False, "health_generate": 200, "generation_ok": True, "generated": " Paris.",
            "server_info": info(**kw)}


def scripted(clock, docs, cost=0.5):
    it = iter(docs)
    last = [None]

    def read(budget):
        clock.t += cost
        last[0] = next(it, last[0])
        return last[0]
    return read


def test_ready_after_loading():
    clock = FakeClock()
    cfg = from_mapping(SPEC, "e")
    loading = {"dead": False, "health_generate": 503}
    logs = []
    v = await_ready(scripted(clock, [loading] * 30 + [ready_doc()]), cfg, clock, logs.append, progress_s=5)
    assert v.ok and v.accept_length == 3.2 and "avg accept length 3.20" in v.text
    assert any("waiting for the server" in line and "health_generate 503" in line for line in logs)


def test_dead_server_reports_log_tail():
    clock = FakeClock()
    tail = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 115016 MiB on GPU 0"]
    v = await_ready(scripted(clock, [{"dead": True, "log_tail": tail}]), from_mapping(SPEC, "e"), clock, print)
    assert v.status == "dead" and v.log_tail == tuple(tail) and v.elapsed < 1


def test_reported_config_mismatch_and_low_accept():
    clock = FakeClock()
    v = await_ready(scripted(clock, [ready_doc(args={"speculative_num_draft_tokens": 8})]), from_mapping(SPEC, "e"),
                    clock, print)
    assert v.status == "mismatch" and "speculative_num_draft_tokens: reports 8, want 16" in v.text
    v = await_ready(scripted(clock, [ready_doc(accept=1.4)]), from_mapping(SPEC, "e"), clock, print)
    assert v.status == "low-accept" and "avg accept length 1.40 < min_accept_length 2.0" in v.text


def test_never_ready_times_out_within_deadline():
    clock = FakeClock()
    start = clock.t
    v = await_ready(scripted(clock, [{"dead": False, "health_generate": 503, "log_tail": ["loading"]}]),
                    from_mapping(SPEC, "e"), clock, print)
    assert v.status == "timeout" and "health_generate 503" in v.text and clock.t - start <= 30


def test_drift_from_live_server_and_from_record():
    cfg = from_mapping(SPEC, "e")
    live = ServerStatus(alive=True, health=200, config_hash=cfg.config_hash, recorded=recorded_view(cfg),
                        server_info=info(args={"speculative_num_draft_tokens": 8}))
    assert [str(c) for c in drift(cfg, live)] == ["~ speculative_num_draft_tokens: 8 -> 16 (restart)"]
    baseline = from_mapping({"model-path": "m"}, "b")
    down = ServerStatus(alive=False, status="stopped", recorded=recorded_view(cfg))
    changes = [str(c) for c in drift(baseline, down)]
    assert "~ speculative_algorithm: EAGLE3 -> (unset) (restart)" in changes
    assert "~ min_accept_length: 2.0 -> (unset) (no restart)" in changes
    assert drift(cfg, ServerStatus()) == []  # nothing known: no per-field diff, just "not running"
