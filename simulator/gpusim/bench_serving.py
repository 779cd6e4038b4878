"""Stand-in for ``python -m sglang.bench_serving`` on a simulated host: the same flags (the subset specops uses,
others refused as argparse would), the same requests (streaming ``POST /generate`` for ``--backend sglang``),
measured for real on the wall clock, and the same outputs: the "Serving Benchmark Result" block on stdout and one
JSON line appended to ``--output-file`` with SGLang's key names (``output_throughput``, ``mean_ttft_ms``,
``mean_itl_ms``, ``accept_length``, ...). ``OPENAI_API_KEY`` in the environment is sent as the bearer token, as the
real script does.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
from urllib.parse import urlsplit


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang.bench_serving")
    p.add_argument("--backend", default="sglang", choices=["sglang", "sglang-native"])
    p.add_argument("--base-url")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model")
    p.add_argument("--tokenizer")
    p.add_argument("--dataset-name", default="random", choices=["random"])
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=1024)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--max-concurrency", type=int)
    p.add_argument("--output-file")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup-requests", type=int, default=1)
    return p


class Output:
    def __init__(self, prompt_len: int):
        self.prompt_len = prompt_len
        self.ttft = 0.0
        self.itl: list[float] = []
        self.latency = 0.0
        self.output_len = 0
        self.error = ""

    @property
    def success(self) -> bool:
        return not self.error and self.output_len > 0


def one_request(base: str, prompt_len: int, output_len: int) -> Output:
    out = Output(prompt_len)
    url = urlsplit(base)
    headers = {"Content-Type": "application/json"}
    if os.environ.get("OPENAI_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
    body = {"text": " ".join(["tok"] * prompt_len), "stream": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}}
    start = time.perf_counter()
    last, last_len = start, 0
    try:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
        conn.request("POST", "/generate", json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            out.error = f"HTTP {resp.status}: {resp.read()[:200].decode(errors='replace')}"
            return out
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[len("data: "):])
            now = time.perf_counter()
            n = int(data["meta_info"]["completion_tokens"])
            if last_len == 0:
                out.ttft = now - start
            elif n > last_len:  # a chunk of several tokens (speculation): its gap is shared by its tokens
                out.itl += [(now - last) / (n - last_len)] * (n - last_len)
            last, last_len = now, n
        out.output_len = last_len
        out.latency = time.perf_counter() - start
    except (OSError, ValueError, KeyError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    return out


def run(args, base: str, lengths: list[tuple[int, int]]) -> tuple[list[Output], float]:
    outputs: list[Output | None] = [None] * len(lengths)
    slots = threading.Semaphore(args.max_concurrency or len(lengths))
    threads = []

    def worker(i: int) -> None:
        try:
            outputs[i] = one_request(base, *lengths[i])
        finally:
            slots.release()

    start = time.perf_counter()
    for i in range(len(lengths)):
        slots.acquire()
        t = threading.Thread(target=worker, args=(i,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return outputs, time.perf_counter() - start  # type: ignore[return-value]


def server_accept_length(base: str) -> float | None:
    """internal_states[0].avg_spec_accept_length of ``/server_info`` (``/get_server_info`` where that is 404, an
    SGLang before /server_info), as the real client reads it; None when not speculative or not answered."""
    url = urlsplit(base)
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"} if os.environ.get("OPENAI_API_KEY") else {}
    try:
        for path in ("/server_info", "/get_server_info"):
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 404:
                break
        info = json.loads(body)
        return info["internal_states"][0].get("avg_spec_accept_length")
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


def metrics(args, outputs: list[Output], duration: float, accept: float | None) -> dict:
    ok = [o for o in outputs if o.success]
    ms = lambda xs: [x * 1000 for x in xs]  # noqa: E731
    ttft, e2e = ms([o.ttft for o in ok]), ms([o.latency for o in ok])
    itl = ms([x for o in ok for x in o.itl])
    tpot = ms([(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1])
    total_in, total_out = sum(o.prompt_len for o in ok), sum(o.output_len for o in ok)
    mean = lambda xs: statistics.fmean(xs) if xs else 0.0  # noqa: E731
    median = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
    return {
        "backend": args.backend, "dataset_name": args.dataset_name, "request_rate": args.request_rate,
        "max_concurrency": args.max_concurrency, "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len, "random_range_ratio": args.random_range_ratio,
        "duration": duration, "completed": len(ok), "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration, "input_throughput": total_in / duration,
        "output_throughput": total_out / duration, "total_throughput": (total_in + total_out) / duration,
        "mean_e2e_latency_ms": mean(e2e), "median_e2e_latency_ms": median(e2e), "p99_e2e_latency_ms": pct(e2e, 99),
        "mean_ttft_ms": mean(ttft), "median_ttft_ms": median(ttft), "p99_ttft_ms": pct(ttft, 99),
        "mean_tpot_ms": mean(tpot), "median_tpot_ms": median(tpot), "p99_tpot_ms": pct(tpot, 99),
        "mean_itl_ms": mean(itl), "median_itl_ms": median(itl), "p95_itl_ms": pct(itl, 95),
        "p99_itl_ms": pct(itl, 99), "concurrency": sum(e2e) / 1000 / duration, "accept_length": accept,
        "errors": sorted({o.error for o in outputs if o.error})[:5],
    }


def report(m: dict) -> None:
    print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    rows = [("Backend:", m["backend"]), ("Traffic request rate:", m["request_rate"]),
            ("Max request concurrency:", m["max_concurrency"] or "not set"), ("Successful requests:", m["completed"]),
            ("Benchmark duration (s):", f"{m['duration']:.2f}"), ("Total input tokens:", m["total_input_tokens"]),
            ("Total generated tokens:", m["total_output_tokens"]),
            ("Output token throughput (tok/s):", f"{m['output_throughput']:.2f}"),
            ("Concurrency:", f"{m['concurrency']:.2f}")]
    if m["accept_length"]:
        rows.append(("Accept length:", f"{m['accept_length']:.2f}"))
    rows += [("Mean TTFT (ms):", f"{m['mean_ttft_ms']:.2f}"), ("Median TTFT (ms):", f"{m['median_ttft_ms']:.2f}"),
             ("Mean ITL (ms):", f"{m['mean_itl_ms']:.2f}"), ("P99 ITL (ms):", f"{m['p99_itl_ms']:.2f}")]
    for label, value in rows:
        print("{:<40} {:<10}".format(label, value))
    print("=" * 50, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    print(f"benchmark_args={args}", flush=True)
    base = args.base_url or f"http://{'127.0.0.1' if args.host == '0.0.0.0' else args.host}:{args.port}"
    rng = random.Random(args.seed)
    low = lambda n: max(1, int(n * args.random_range_ratio))  # noqa: E731
    lengths = [(rng.randint(low(args.random_input_len), args.random_input_len),
                rng.randint(low(args.random_output_len), args.random_output_len)) for _ in range(args.num_prompts)]
    for _ in range(args.warmup_requests):
        warm = one_request(base, 16, 4)
        if warm.error:
            print(f"Initial test run failed: {warm.error}", file=sys.stderr, flush=True)
            return 1
    print(f"Starting main benchmark run: {args.num_prompts} prompts, max concurrency {args.max_concurrency}",
          flush=True)
    outputs, duration = run(args, base, lengths)
    m = metrics(args, outputs, duration, server_accept_length(base))
    report(m)
    if m["completed"] == 0:
        print(f"Error running benchmark: every request failed: {m['errors']}", file=sys.stderr, flush=True)
        return 1
    if args.output_file:
        with open(args.output_file, "a") as fh:
            fh.write(json.dumps(m) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
