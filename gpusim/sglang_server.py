"""SGLang-API stand-in: runs in place of ``python -m sglang.launch_server`` on a simulated host.

It parses exactly SGLang 0.5.23's flags (from the same argparse table specops validates against), books its
GPU memory in the ledger after a load phase (dying with a CUDA-OOM error if the memory is not free, the seed's
failure), serves /health (503 until ready), /health_generate, /get_server_info (server_args and
internal_states[0].avg_spec_accept_length), /get_model_info, /generate, /v1/completions and /metrics, drains
and exits on SIGTERM; its memory is freed after the driver's release delay.

Host settings (DIR/host.json): ``server_start_s`` (default 1.0), ``accept_length`` (override the model below).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
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


class Server:
    def __init__(self, args, root: str):
        self.args, self.root = args, root
        self.host = ledger.load_host(root)
        self.ready = False
        self.draining = False
        self.inflight = 0
        self.lock = threading.Lock()
        self.accept = accept_length(args, self.host)
        self.generated = 0

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
        self.ready = True
        log("The server is fired up and ready to roll!")

    def server_info(self) -> dict:
        info = {k: v for k, v in vars(self.args).items()}
        info.pop("api_key", None)
        info.pop("admin_api_key", None)
        states = {"last_gen_throughput": 100.0}
        if self.accept is not None:
            states["avg_spec_accept_length"] = self.accept
        return {**info, "server_args": info, "internal_states": [states], "version": "0.5.23"}

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


def die(message: str) -> None:
    print("Traceback (most recent call last):\n  File \"sglang/srt/model_executor/model_runner.py\", line 312, "
          "in load_model", flush=True)
    print(message, flush=True)
    log("Received sigquit from a child process. It usually means the child failed.")
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
                return self._send(200, server.generate(body.get("text", ""), params.get("max_new_tokens", 16)))
            if self.path == "/v1/completions":
                out = server.generate(body.get("prompt", ""), body.get("max_tokens", 16))
                return self._send(200, {"object": "text_completion", "model": body.get("model"),
                                        "choices": [{"index": 0, "text": out["text"], "finish_reason": "length"}],
                                        "usage": {"completion_tokens": out["meta_info"]["completion_tokens"]}})
            return self._send(404, {"error": "not found"})

    return Handler


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    root = os.environ["GPUSIM_ROOT"]
    server = Server(args, root)
    watch(root, os.getpid())
    httpd = ThreadingHTTPServer((args.host, args.port), handler_for(server))
    httpd.daemon_threads = True

    def on_term(signum, frame):
        server.draining = True
        log("Received SIGTERM: draining")
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    log(f"server_args={json.dumps({k: v for k, v in vars(args).items() if 'api_key' not in k}, default=str)}")
    threading.Thread(target=server.load, daemon=True).start()
    httpd.serve_forever(poll_interval=0.05)
    deadline = time.monotonic() + 5
    while server.inflight and time.monotonic() < deadline:
        time.sleep(0.01)
    log("Shutdown complete")


if __name__ == "__main__":
    main(sys.argv[1:])
