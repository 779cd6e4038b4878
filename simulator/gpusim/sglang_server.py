"""SGLang-API stand-in: what ``python -m sglang.launch_server`` runs on a simulated host (gpusim/engine/sglang, on
the PYTHONPATH of ``DIR/bin/python``; ``DIR/bin/sglang-launch-server`` runs it too).

It parses exactly SGLang 0.5.23's command line (gpusim/srt_args.py: the flag table specops validates against,
``--config FILE.yaml`` merged as SGLang merges it) and resolves it as SGLang does (gpusim/srt_resolve.py: NEXTN
served as EAGLE, NGRAM's and topk-1's rewrites, the steps/topk/draft tokens SGLang chooses, and SGLang's own
errors, raised at start as the real server raises them), books its GPU memory in the ledger after a load phase
(dying with a CUDA-OOM error if the memory is not free, the seed's failure), serves /health (503 until ready),
/health_generate, /server_info, /model_info (and their deprecated /get_* aliases, which log SGLang's deprecation
warning on every call), /generate, /v1/completions and /metrics, drains and exits on SIGTERM; its memory is freed
after the driver's release delay.

``/server_info`` is SGLang 0.5.23's (utils/common.py build_server_info, entrypoints/http_server.py): every resolved
server argument at the top level, ``launch_command`` (the command line as given, ``--api-key VALUE`` in clear),
``api_key`` in clear, the scheduler's info, ``internal_states`` (one per DP rank, ``avg_spec_accept_length`` only
when speculative) and ``version``. With host.json ``sglang_version`` older than :data:`SERVER_INFO_SINCE`,
``/server_info`` and ``/model_info`` answer 404 and ``/get_server_info`` has the old body (the arguments, the
scheduler's info, ``internal_states`` and ``version``; no ``launch_command``), without a warning.

GPUs: the server uses the physical GPUs that CUDA would give it: visible ordinal i is ``CUDA_VISIBLE_DEVICES``'s
i-th entry (all of the host's GPUs when unset), and SGLang's ranks take ordinals ``base-gpu-id + ...`` with
``gpu-id-step`` between TP ranks and ``tp * pp * gpu-id-step`` between DP replicas (entrypoints/engine.py,
managers/data_parallel_controller.py); an ordinal past the visible GPUs dies as CUDA does ("CUDA error: invalid
device ordinal").

Multi-node (``--nnodes N --node-rank R --dist-init-addr HOST:PORT``): rank 0 listens at dist-init-addr and is
ready only when all N-1 other ranks have joined; ranks > 0 serve no HTTP (as in SGLang), load, join rank 0
(retrying until it listens) and die when it goes away; rank 0 dies when a joined rank goes away (a NCCL error).

Every launch, ready, SIGTERM and exit is appended to DIR/timeline.jsonl (wall-clock time), for tests that check
how many hosts of a cluster were down at once.

Streaming ``/generate`` (``"stream": true``, what ``sglang.bench_serving --backend sglang`` sends) goes through a
continuous-batching engine whose decode step costs ``decode_step_ms + token_slot_ms * batch * width`` (plus
``draft_step_ms`` per speculative step), where width is 1 without speculation and ``speculative-num-draft-tokens``
with it, and a speculative step emits ``accept_length`` tokens per request on average: speculation pays at low
concurrency (memory-bound steps) and stops paying once verification of the draft tokens dominates the step.
With ``--speculative-adaptive`` each batch runs the steps its slot chooses (``gpusim.adaptive``, SGLang's rules and
table, or ``--speculative-adaptive-config``): width steps + 1 and draft cost per step, or a plain decode step at 0;
each request's accepted drafts (a chain of that many steps, the model above) feed the slot's EMA, and
``avg_spec_accept_length`` reports the tokens per speculative verify so far.

Host settings (DIR/host.json): ``server_start_s`` (default 1.0), ``accept_length`` (override the model below),
``decode_step_ms`` (12.0), ``token_slot_ms`` (0.2), ``draft_step_ms`` (1.6), ``prefill_ms_per_1k`` (8.0),
``sglang_version`` (``"0.5.23"``), ``sglang_removed_flags`` (options the engine does not know, e.g.
``["--speculative-adaptive"]``, as an older release). ``accept_length`` is re-read on every /server_info, as a
real server's running average moves with the workload.

Like a CUDA process, the server keeps DIR/dev/nvidiactl, nvidia-uvm and nvidia<i> of its GPUs open from the moment
it books its memory until it exits.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

from . import ledger
from .adaptive import AdaptiveParams, load_table
from .srt_args import ServerArgs, prepare_server_args
from .srt_resolve import architecture
from .watch import watch

logger = logging.getLogger("sglang.srt.entrypoints.http_server")

DEFAULT_VERSION = "0.5.23"
# The first release with /server_info (and /model_info), /get_* kept as deprecated aliases. Not pinned down from
# SGLang's history (only 0.5.23's source is at hand, where both exist): releases before 0.5 are taken to have
# only /get_server_info.
SERVER_INFO_SINCE = "0.5.0"


def version_tuple(version: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", str(version).split("+")[0])[:3])


def resolved_args(argv: list[str]) -> dict:
    """What the stand-in reports at the top level of /server_info for this command line: SGLang's parse (with
    ``--config``) and resolution; the same exceptions (SystemExit 2 from argparse, TypeError / AssertionError /
    ValueError from resolution) where SGLang raises them."""
    server_args = prepare_server_args(argv)
    return {**server_args.resolved_dict(), "launch_command": server_args.launch_command}


def accept_length(args, host: dict) -> float | None:
    if not args.speculative_algorithm:
        return None
    if "accept_length" in host:
        return float(host["accept_length"])
    steps, topk = args.speculative_num_steps or 1, args.speculative_eagle_topk or 1
    draft = args.speculative_num_draft_tokens or steps + 1
    return round(min(float(draft), 1 + steps * (1 - 0.55 ** topk) * 0.92), 3)


def chain_accept(steps: int, topk: int) -> float:
    """Tokens per verify of a draft of ``steps`` steps (the model of :func:`accept_length`, draft tokens steps + 1)."""
    return round(min(float(steps + 1), 1 + steps * (1 - 0.55 ** topk) * 0.92), 3)


def adaptive_params(args) -> AdaptiveParams:
    """The adaptive slots from --speculative-adaptive-config (SGLang's built-in table without one)."""
    return AdaptiveParams(args.speculative_num_steps or 3, load_table(getattr(args, "speculative_adaptive_config", None)))


class Request:
    def __init__(self, prompt_tokens: int, max_new_tokens: int):
        self.prompt_tokens, self.max_new_tokens = prompt_tokens, max_new_tokens
        self.tokens = 0
        self.steps = 0
        self.credit = 0.0
        self.prefilled = False
        self.grew = threading.Event()  # one event per request: a step wakes only the streams it advanced

    @property
    def done(self) -> bool:
        return self.tokens >= self.max_new_tokens


class Engine:
    """Continuous batching on a step-time model (module docstring); steps follow an absolute schedule, so the
    simulation's own CPU cost does not change the throughput it models."""

    def __init__(self, args, host: dict, accept: float | None):
        self.accept = accept
        self.base_ms = float(host.get("decode_step_ms", 12.0))
        self.slot_ms = float(host.get("token_slot_ms", 0.2))
        self.prefill_ms = float(host.get("prefill_ms_per_1k", 8.0))
        self.step_draft_ms = float(host.get("draft_step_ms", 1.6))
        spec = accept is not None
        self.width = (args.speculative_num_draft_tokens or (args.speculative_num_steps or 1) + 1) if spec else 1
        self.draft_ms = self.step_draft_ms * (args.speculative_num_steps or 1) if spec else 0.0
        # adaptive speculation (gpusim.adaptive): the steps, so the width and draft cost, chosen per batch
        self.adaptive = adaptive_params(args) if spec and getattr(args, "speculative_adaptive", False) else None
        self.topk = args.speculative_eagle_topk or 1
        self.verified = self.accepted = 0  # speculative verifies and the tokens they emitted, for the average
        self.steps_run: dict[int, int] = {}  # adaptive: batches run at each step count (0: plain decode)
        self.cond = threading.Condition()
        self.waiting: list[Request] = []
        self.active: list[Request] = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def submit(self, prompt_tokens: int, max_new_tokens: int) -> Request:
        req = Request(prompt_tokens, max(1, max_new_tokens))
        with self.cond:
            self.waiting.append(req)
            self.cond.notify_all()
        return req

    def step_s(self, batch: int, prefill_tokens: int, steps: int | None = None) -> float:
        width, draft_ms = self.width, self.draft_ms
        if steps is not None:  # adaptive: this batch's steps (0: a plain decode step, no draft)
            width, draft_ms = (steps + 1 if steps else 1), self.step_draft_ms * steps
        return (self.base_ms + draft_ms + self.slot_ms * batch * width
                + self.prefill_ms * prefill_tokens / 1000) / 1000

    def run(self) -> None:
        due = time.monotonic()
        while True:
            with self.cond:
                while not self.waiting and not self.active:
                    self.cond.wait()
                new, self.waiting = self.waiting, []
                self.active += new
                batch = list(self.active)
            steps = self.adaptive.steps_for(len(batch)) if self.adaptive else None
            if steps is not None:
                self.steps_run[steps] = self.steps_run.get(steps, 0) + 1
            due = max(due, time.monotonic()) + self.step_s(len(batch), sum(r.prompt_tokens for r in new), steps)
            time.sleep(max(0.0, due - time.monotonic()))
            drafts = []
            for r in batch:
                decoding = r.prefilled
                n = self.emitted(r, steps)
                if decoding:
                    drafts.append(n - 1)
                r.tokens = min(r.max_new_tokens, r.tokens + n)
                r.steps += 1
                r.grew.set()
            if self.adaptive and drafts:  # the verify's accepted drafts per request feed the batch's slot
                self.adaptive.on_verify(drafts, len(batch))  # all 0 at a plain decode step (steps 0)
                if steps:
                    self.verified, self.accepted = self.verified + len(drafts), self.accepted + len(drafts) + sum(drafts)
            with self.cond:
                self.active = [r for r in self.active if not r.done]

    def emitted(self, r: Request, steps: int | None = None) -> int:
        if not r.prefilled or self.accept is None or steps == 0:  # prefill: the first token; plain decode: one
            r.prefilled = True
            return 1
        if steps is None:
            r.credit += self.accept
            n = max(1, math.floor(r.credit))
            r.credit -= n
            return n
        r.credit += chain_accept(steps, self.topk) - 1  # adaptive: accepted drafts of a chain of this many steps
        drafts = min(steps, math.floor(r.credit))
        r.credit -= drafts
        return 1 + drafts

    def average_accept(self) -> float | None:
        """Tokens per speculative verify so far (adaptive), None before the first."""
        return round(self.accepted / self.verified, 3) if self.verified else None

    def stream(self, req: Request):
        """Yield the token count each time it grows, until the request is done."""
        sent = 0
        while not (req.done and sent == req.tokens):
            req.grew.wait()
            req.grew.clear()
            if req.tokens > sent:
                sent = req.tokens
                yield sent


def gpu_ordinals(args) -> list[int]:
    """The CUDA ordinals (indices into the visible GPUs) this node's ranks use, as SGLang places them:
    entrypoints/engine.py _calculate_rank_ranges and the scheduler launch (base_gpu_id + pp offset + tp rank *
    gpu_id_step), managers/data_parallel_controller.py for DP replicas (each next replica tp * pp * gpu_id_step
    further on). Attention DP runs inside the TP group and adds no GPUs."""
    nnodes, node_rank = max(1, args.nnodes), args.node_rank
    tp, pp, step, base = args.tp_size, args.pp_size, args.gpu_id_step, args.base_gpu_id
    pp_per_node = max(pp // nnodes, 1)
    nnodes_per_pp_rank = max(nnodes // pp, 1)
    pp_ranks = range(pp_per_node * (node_rank // nnodes_per_pp_rank),
                     pp_per_node * (node_rank // nnodes_per_pp_rank + 1))
    tp_per_node = tp // nnodes_per_pp_rank
    tp_ranks = range(tp_per_node * (node_rank % nnodes_per_pp_rank), tp_per_node * (node_rank % nnodes_per_pp_rank + 1))
    group = [(p % pp_per_node) * tp_per_node + (t % tp_per_node) * step for p in pp_ranks for t in tp_ranks]
    replicas = args.dp_size if (args.attn_dp_size or 1) == 1 else 1
    return [base + r * tp * pp * step + g for r in range(replicas) for g in group]


def visible_gpus(env: dict, host_gpus: list[int]) -> list[int]:
    """Physical GPU ids by CUDA ordinal: CUDA_VISIBLE_DEVICES's entries in order (enumeration stops at the first
    entry that is no GPU of this host, as CUDA's does), every GPU of the host when it is unset."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return sorted(host_gpus)
    out: list[int] = []
    for entry in value.split(","):
        entry = entry.strip()
        if not re.fullmatch(r"\d+", entry) or int(entry) not in host_gpus or int(entry) in out:
            break
        out.append(int(entry))
    return out


class Server:
    def __init__(self, args, root: str, server_args: ServerArgs | None = None):
        self.args, self.root, self.server_args = args, root, server_args
        self.host = ledger.load_host(root)
        self.version = str(self.host.get("sglang_version") or DEFAULT_VERSION)
        self.ready = False
        self.draining = False
        self.inflight = 0
        self.lock = threading.Lock()
        self.accept = accept_length(args, self.host)
        self.device_fds: list[int] = []
        self.generated = 0
        self.started = time.time()
        self.joined: set[int] = set()
        self.all_joined = threading.Event()
        if args.nnodes <= 1:
            self.all_joined.set()
        self.engine = Engine(args, self.host, self.accept)

    @property
    def has_server_info(self) -> bool:
        return version_tuple(self.version) >= version_tuple(SERVER_INFO_SINCE)

    def gpus(self) -> list[int]:
        """The physical GPUs this node's ranks use; dies as CUDA does when one is not visible."""
        visible = visible_gpus(os.environ, [g["index"] for g in self.host["gpus"]])
        if not visible:
            die("RuntimeError: CUDA error: no CUDA-capable device is detected")
        ordinals = gpu_ordinals(self.args)
        if any(o >= len(visible) for o in ordinals):
            die("torch.AcceleratorError: CUDA error: invalid device ordinal\n"
                "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
                "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
        return [visible[o] for o in ordinals]

    def load(self) -> None:
        t = float(self.host.get("server_start_s", 1.0))
        log(f"Load weight begin. avail mem={self.host['gpus'][0]['total_mib'] / 1024:.2f} GB")
        time.sleep(t / 2)
        fraction = self.args.mem_fraction_static or 0.88
        gpus = self.gpus()
        total = {g["index"]: g["total_mib"] for g in self.host["gpus"]}
        try:  # CUDA opens the device files when it creates the context, before the first allocation
            self.device_fds = ledger.open_devices(self.root, gpus)
        except OSError as exc:
            die(f"RuntimeError: CUDA error: no CUDA-capable device is detected ({exc})")
        try:
            ledger.allocate(self.root, os.getpid(), {g: int(total[g] * fraction) for g in gpus}, "python3")
        except ledger.OutOfMemory as exc:
            die(f"torch.OutOfMemoryError: {exc}. Of the allocated memory 0 bytes is allocated by PyTorch. "
                f"See documentation for Memory Management (PYTORCH_CUDA_ALLOC_CONF)")
        arch = architecture(self.args.model_path, self.args.revision)
        log(f"Load weight end. type={arch}, dtype={self.args.dtype}, mem usage per GPU="
            f"{int(total[gpus[0]] * fraction) / 1024:.2f} GB")
        if self.args.speculative_algorithm:
            log(f"Speculative decoding: {self.args.speculative_algorithm} "
                f"draft={self.args.speculative_draft_model_path} "
                f"steps={self.args.speculative_num_steps} topk={self.args.speculative_eagle_topk} "
                f"draft_tokens={self.args.speculative_num_draft_tokens}")
        time.sleep(t / 2)
        if self.args.node_rank > 0:
            return self.join_leader()
        if not self.all_joined.is_set():
            log(f"waiting for {self.args.nnodes - 1} rank(s) to join at {self.args.dist_init_addr}")
        self.all_joined.wait()
        self.ready = True
        timeline("ready", self.args)
        log("The server is fired up and ready to roll!")

    # --- multi-node: a TCP rendezvous standing in for torch.distributed's store at dist-init-addr --------
    def rendezvous(self) -> None:
        host, port = self.args.dist_init_addr.rsplit(":", 1)
        sock = socket.create_server((host, int(port)))
        while True:
            conn, peer = sock.accept()
            threading.Thread(target=self._member, args=(conn, peer), daemon=True).start()

    def _member(self, conn, peer) -> None:
        line = conn.makefile().readline().split()
        rank = int(line[1]) if len(line) == 2 and line[0] == "rank" and line[1].isdigit() else None
        if rank is None:
            conn.close()
            return
        with self.lock:
            self.joined.add(rank)
            if len(self.joined) >= self.args.nnodes - 1:
                self.all_joined.set()
        log(f"rank {rank} joined from {peer[0]} ({len(self.joined)}/{self.args.nnodes - 1})")
        while conn.recv(64):
            pass
        if not self.draining:
            die(f"RuntimeError: NCCL communicator was aborted: rank {rank} ({peer[0]}) went away")

    def join_leader(self) -> None:
        host, port = self.args.dist_init_addr.rsplit(":", 1)
        log(f"rank {self.args.node_rank}: joining rank 0 at {self.args.dist_init_addr}")
        while True:
            try:
                conn = socket.create_connection((host, int(port)), timeout=1.0)
                break
            except OSError:
                time.sleep(0.1)
        conn.settimeout(None)
        conn.sendall(f"rank {self.args.node_rank}\n".encode())
        self.ready = True
        timeline("ready", self.args)
        log(f"rank {self.args.node_rank}: joined; serving as a worker node (no HTTP server on ranks > 0)")
        while conn.recv(64):
            pass
        if not self.draining:
            die("RuntimeError: NCCL communicator was aborted: lost connection to rank 0")

    def scheduler_info(self) -> dict:
        """What the scheduler hands the tokenizer at start (managers/scheduler.py get_init_info)."""
        context = self.args.context_length or 131072
        return {"status": "ready", "max_total_num_tokens": 400000, "max_req_input_len": context - 1,
                "startup_time": self.started,
                "hicache_object_layout": {"enabled": False, "backend": None, "page_size": self.args.page_size,
                                          "hicache_object_layout": {"pools": []},
                                          "reason": "Hierarchical cache is disabled"}}

    def internal_states(self) -> list[dict]:
        """One per DP rank (dp_size * attn_dp_size), as managers/scheduler_components/internal_state.py reads
        them back: the resolved arguments, topology, memory, and avg_spec_accept_length when speculative."""
        args = vars(self.args)
        world = self.args.tp_size * self.args.pp_size * self.args.dp_size
        mib = int(self.host["gpus"][0]["total_mib"] * (self.args.mem_fraction_static or 0.88))
        states = []
        for _ in range(max(1, self.args.dp_size * (self.args.attn_dp_size or 1))):
            state = {**json.loads(json.dumps(args, default=str)), "world_size": world, "startup_time": self.started,
                     "effective_max_running_requests_per_dp": self.args.max_running_requests or 256,
                     "last_gen_throughput": 100.0,
                     "memory_usage": {"weight": 14.99, "kvcache": round(mib / 1024 - 14.99 - 4, 3),
                                      "startup_available": round(self.host["gpus"][0]["total_mib"] / 1024, 3),
                                      "token_capacity": 400000, "token_capacity_swa": None, "graph": {"decode": 1.2}}}
            if self.accept is not None:
                state["avg_spec_accept_length"] = self.live_accept()
            states.append(state)
        return states

    def server_info(self) -> dict:
        """/server_info (SGLang 0.5.23: build_server_info plus the HTTP fields); the old /get_server_info body
        for an engine older than SERVER_INFO_SINCE."""
        args = json.loads(json.dumps(vars(self.args), default=str))
        if not self.has_server_info:
            return {**args, **self.scheduler_info(), "internal_states": self.internal_states(), "version": self.version}
        launch = self.server_args.launch_command if self.server_args is not None else None
        return {**args, "launch_command": launch, **self.scheduler_info(), "kv_events": None,
                "startup_time": self.started, "internal_states": self.internal_states(), "version": self.version,
                "frontend": "python"}

    def model_info(self) -> dict:
        arch = architecture(self.args.model_path, self.args.revision)
        return {"model_path": self.args.model_path, "tokenizer_path": self.args.tokenizer_path, "is_generation": True,
                "preferred_sampling_params": self.args.preferred_sampling_params,
                "weight_version": self.args.weight_version, "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "llama" if arch == "LlamaForCausalLM" else None,
                "architectures": [arch]}

    def live_accept(self) -> float:
        """The reported running average: host.json's ``accept_length`` as it is now (a test lowers it on a running
        server), else the start-time value. The batching engine and spec_verify_ct keep the start-time value, so
        a lowered report does not change the modelled throughput."""
        try:
            with open(os.path.join(self.root, "host.json")) as fh:
                host = json.load(fh)
        except (OSError, ValueError):
            return self.accept
        if "accept_length" in host:
            return float(host["accept_length"])
        return (self.engine.average_accept() or self.accept) if self.engine.adaptive else self.accept

    def generate(self, prompt: str, max_new_tokens: int) -> dict:
        with self.lock:
            self.inflight += 1
        try:
            n = max(1, min(int(max_new_tokens), 64))
            text = " Paris." if "France" in prompt else " ok" * n
            meta = {"prompt_tokens": len(prompt.split()), "completion_tokens": n, "finish_reason": {"type": "length"}}
            if self.accept is not None:
                meta["spec_verify_ct"] = max(1, round(n / self.accept))
            self.generated += n
            return {"text": text, "meta_info": meta}
        finally:
            with self.lock:
                self.inflight -= 1


def log(message: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}", flush=True)


def timeline(event: str, args) -> None:
    line = json.dumps({"t": time.time(), "event": event, "pid": os.getpid(), "port": args.port,
                       "rank": args.node_rank}) + "\n"
    fd = os.open(os.path.join(os.environ.get("GPUSIM_ROOT", "."), "timeline.jsonl"),
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


_ARGS = None  # the running server's args, for die()'s timeline entry


def die(message: str) -> None:
    print("Traceback (most recent call last):\n  File \"sglang/srt/model_executor/model_runner.py\", line 312, "
          "in load_model", flush=True)
    print(message, flush=True)
    log("Received sigquit from a child process. It usually means the child failed.")
    if _ARGS is not None:
        timeline("exit", _ARGS)
    os._exit(1)


def handler_for(server: Server):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):  # quiet access log, like --log-level warning
            pass

        def _send(self, code: int, body) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            key = server.args.api_key
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                self._send(401, {"error": "Unauthorized"})
                return False
            return True

        def _stream(self, prompt: str, max_new_tokens: int) -> None:
            """Server-sent events as SGLang sends them: cumulative text and meta_info per chunk, then [DONE]."""
            prompt_tokens = len(prompt.split())
            with server.lock:
                server.inflight += 1
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                req = server.engine.submit(prompt_tokens, max_new_tokens)
                for n in server.engine.stream(req):
                    meta = {"prompt_tokens": prompt_tokens, "completion_tokens": n}
                    if server.accept is not None:
                        meta["spec_verify_ct"] = req.steps
                    chunk = {"text": " ok" * n, "meta_info": meta}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                server.generated += req.tokens
            except OSError:  # the client went away
                pass
            finally:
                with server.lock:
                    server.inflight -= 1
                self.close_connection = True

        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/health":
                return self._send(200 if server.ready and not server.draining else 503, "")
            if not self._authorised():
                return None
            if path == "/health_generate":
                if not server.ready or server.draining:
                    return self._send(503, "")
                server.generate("health", 1)
                return self._send(200, "")
            if path in ("/server_info", "/model_info") and not server.has_server_info:
                return self._send(404, {"detail": "Not Found"})
            if path in ("/get_server_info", "/get_model_info") and server.has_server_info:
                new = path.replace("/get_", "/")
                logger.warning(f"Endpoint '{path}' is deprecated and will be removed in a future version. "
                               f"Please use '{new}' instead.")
            if path in ("/get_server_info", "/server_info"):
                return self._send(200, server.server_info())
            if path in ("/get_model_info", "/model_info"):
                return self._send(200, server.model_info())
            if path == "/metrics":
                return self._send(200, f"sglang:generation_tokens_total {server.generated}\n"
                                       f"sglang:num_running_reqs {server.inflight}\n")
            return self._send(404, {"error": "not found"})

        def do_POST(self):
            if not self._authorised():
                return None
            if not server.ready or server.draining:
                return self._send(503, {"error": "server not ready"})
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/generate":
                params = body.get("sampling_params", {})
                if body.get("stream"):
                    return self._stream(body.get("text", ""), int(params.get("max_new_tokens", 16)))
                return self._send(200, server.generate(body.get("text", ""), params.get("max_new_tokens", 16)))
            if self.path == "/v1/completions":
                out = server.generate(body.get("prompt", ""), body.get("max_tokens", 16))
                return self._send(200, {"object": "text_completion", "model": body.get("model"),
                                        "choices": [{"index": 0, "text": out["text"], "finish_reason": "length"}],
                                        "usage": {"completion_tokens": out["meta_info"]["completion_tokens"]}})
            return self._send(404, {"error": "not found"})

    return Handler


def main(argv: list[str] | None = None) -> None:
    """``python -m sglang.launch_server ARGV``: parse (argparse exits 2 on a bad command line), resolve (SGLang's
    resolution errors end the process with their traceback, exit status 1), then serve."""
    global _ARGS
    argv = sys.argv[1:] if argv is None else list(argv)
    server_args = prepare_server_args(argv)
    logging.basicConfig(level=getattr(logging, str(server_args.log_level).upper(), logging.INFO),
                        format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S", force=True)
    root = os.environ["GPUSIM_ROOT"]
    _ARGS = SimpleNamespace(**server_args.fields())
    watch(root, os.getpid())
    timeline("launch", _ARGS)
    try:
        server_args.resolve_once()
    except BaseException:
        timeline("exit", _ARGS)
        raise
    args = _ARGS = SimpleNamespace(**server_args.resolved_dict())
    server = Server(args, root, server_args)
    stop = threading.Event()
    httpd = None
    if args.node_rank == 0:
        ThreadingHTTPServer.request_queue_size = 256  # a benchmark opens its connections at once
        httpd = ThreadingHTTPServer((args.host, args.port), handler_for(server))
        httpd.daemon_threads = True
        if args.nnodes > 1:
            threading.Thread(target=server.rendezvous, daemon=True).start()

    def on_term(signum, frame):
        server.draining = True
        timeline("term", args)
        log("Received SIGTERM: draining")
        stop.set()
        if httpd is not None:
            threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    log(f"server_args={json.dumps({k: v for k, v in vars(args).items() if 'api_key' not in k}, default=str)}")
    threading.Thread(target=server.load, daemon=True).start()
    if httpd is not None:
        httpd.serve_forever(poll_interval=0.05)
    else:
        stop.wait()
    deadline = time.monotonic() + 5
    while server.inflight and time.monotonic() < deadline:
        time.sleep(0.01)
    timeline("exit", args)
    log("Shutdown complete")


if __name__ == "__main__":
    main(sys.argv[1:])
