"""SGLang-API stand-in: runs in place of ``python -m sglang.launch_server`` on a simulated host.

It parses exactly SGLang 0.5.23's flags (from the same argparse table specops validates against), books its
GPU memory in the ledger after a load phase (dying with a CUDA-OOM error if the memory is not free, the seed's
failure), serves /health (503 until ready), /health_generate, /get_server_info (server_args and
internal_states[0].avg_spec_accept_length), /get_model_info, /generate, /v1/completions and /metrics, drains
and exits on SIGTERM; its memory is freed after the driver's release delay.

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

Host settings (DIR/host.json): ``server_start_s`` (default 1.0), ``accept_length`` (override the model below),
``decode_step_ms`` (12.0), ``token_slot_ms`` (0.2), ``draft_step_ms`` (1.6), ``prefill_ms_per_1k`` (8.0).
``accept_length`` is re-read on every /get_server_info, as a real server's running average moves with the workload.

Like a CUDA process, the server keeps DIR/dev/nvidiactl, nvidia-uvm and nvidia<i> of its GPUs open from the moment
it books its memory until it exits.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import ledger
from .watch import watch

_TYPES = {"int": int, "float": float, "loads": json.loads}


def build_parser() -> argparse.ArgumentParser:
    from operations import sglang_args  # the table is SGLang's, shipped with specops

    p = argparse.ArgumentParser(prog="sglang.launch_server")
    for flag in sglang_args.flags().values():
        kw: dict = {"dest": flag.dest, "default": flag.default}
        if flag.action == "BooleanOptionalAction":
            kw["action"] = argparse.BooleanOptionalAction
            p.add_argument(*[o for o in flag.options if not o.startswith("--no-")], **kw)
            continue
        if flag.is_switch:
            kw["action"] = "store_true"
        else:
            kw["type"] = _TYPES.get(flag.type or "str", str)
            if flag.nargs in ("+", "*", "?"):
                kw["nargs"] = flag.nargs
            if flag.choices:
                kw["choices"] = list(flag.choices)
        p.add_argument(*flag.options, **kw)
    return p


def accept_length(args, host: dict) -> float | None:
    if not args.speculative_algorithm:
        return None
    if "accept_length" in host:
        return float(host["accept_length"])
    steps, topk = args.speculative_num_steps or 1, args.speculative_eagle_topk or 1
    draft = args.speculative_num_draft_tokens or steps + 1
    return round(min(float(draft), 1 + steps * (1 - 0.55 ** topk) * 0.92), 3)


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
        spec = accept is not None
        self.width = (args.speculative_num_draft_tokens or (args.speculative_num_steps or 1) + 1) if spec else 1
        self.draft_ms = float(host.get("draft_step_ms", 1.6)) * (args.speculative_num_steps or 1) if spec else 0.0
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

    def step_s(self, batch: int, prefill_tokens: int) -> float:
        return (self.base_ms + self.draft_ms + self.slot_ms * batch * self.width
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
            due = max(due, time.monotonic()) + self.step_s(len(batch), sum(r.prompt_tokens for r in new))
            time.sleep(max(0.0, due - time.monotonic()))
            for r in batch:
                r.tokens = min(r.max_new_tokens, r.tokens + self.emitted(r))
                r.steps += 1
                r.grew.set()
            with self.cond:
                self.active = [r for r in self.active if not r.done]

    def emitted(self, r: Request) -> int:
        if not r.prefilled or self.accept is None:  # prefill yields the first token; plain decode one per step
            r.prefilled = True
            return 1
        r.credit += self.accept
        n = max(1, math.floor(r.credit))
        r.credit -= n
        return n

    def stream(self, req: Request):
        """Yield the token count each time it grows, until the request is done."""
        sent = 0
        while not (req.done and sent == req.tokens):
            req.grew.wait()
            req.grew.clear()
            if req.tokens > sent:
                sent = req.tokens
                yield sent


class Server:
    def __init__(self, args, root: str):
        self.args, self.root = args, root
        self.host = ledger.load_host(root)
        self.ready = False
        self.draining = False
        self.inflight = 0
        self.lock = threading.Lock()
        self.accept = accept_length(args, self.host)
        self.device_fds: list[int] = []
        self.generated = 0
        self.joined: set[int] = set()
        self.all_joined = threading.Event()
        if args.nnodes <= 1:
            self.all_joined.set()
        self.engine = Engine(args, self.host, self.accept)

    def gpus(self) -> list[int]:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        per_node = self.args.tp_size * self.args.dp_size // max(1, self.args.nnodes)
        ids = [int(x) for x in visible.split(",")] if visible else list(range(len(self.host["gpus"])))
        return ids[self.args.base_gpu_id:self.args.base_gpu_id + per_node]

    def load(self) -> None:
        t = float(self.host.get("server_start_s", 1.0))
        log(f"Load weight begin. avail mem={self.host['gpus'][0]['total_mib'] / 1024:.2f} GB")
        time.sleep(t / 2)
        fraction = self.args.mem_fraction_static or 0.88
        gpus = self.gpus()
        if len(gpus) < self.args.tp_size * self.args.dp_size // max(1, self.args.nnodes):
            die(f"RuntimeError: not enough GPUs: need {self.args.tp_size * self.args.dp_size}, visible {gpus}")
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
        log(f"Load weight end. type=LlamaForCausalLM, dtype={self.args.dtype}, mem usage per GPU="
            f"{int(total[gpus[0]] * fraction) / 1024:.2f} GB")
        if self.args.speculative_algorithm:
            log(f"Speculative decoding: {self.args.speculative_algorithm} draft={self.args.speculative_draft_model_path} "
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

    def server_info(self) -> dict:
        info = {k: v for k, v in vars(self.args).items()}
        info.pop("api_key", None)
        info.pop("admin_api_key", None)
        states = {"last_gen_throughput": 100.0}
        if self.accept is not None:
            states["avg_spec_accept_length"] = self.live_accept()
        return {**info, "server_args": info, "internal_states": [states], "version": "0.5.23"}

    def live_accept(self) -> float:
        """The reported running average: host.json's ``accept_length`` as it is now (a test lowers it on a running
        server), else the start-time value. The batching engine and spec_verify_ct keep the start-time value, so
        a lowered report does not change the modelled throughput."""
        try:
            with open(os.path.join(self.root, "host.json")) as fh:
                host = json.load(fh)
        except (OSError, ValueError):
            return self.accept
        return float(host["accept_length"]) if "accept_length" in host else self.accept

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
            if path in ("/get_server_info", "/server_info"):
                return self._send(200, server.server_info())
            if path == "/get_model_info":
                return self._send(200, {"model_path": server.args.model_path, "is_generation": True})
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
    global _ARGS
    args = _ARGS = build_parser().parse_args(argv)
    root = os.environ["GPUSIM_ROOT"]
    server = Server(args, root)
    watch(root, os.getpid())
    timeline("launch", args)
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
