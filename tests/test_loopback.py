"""The host programs' HTTP client (``operations/remote/loopback.py``) against real servers on 127.0.0.1, each
answer cross-checked with the standard library's own client (``urllib.request``, what it replaces): the same
status and body for Content-Length, chunked and close-delimited answers, error statuses, a server that keeps the
connection open, and the failures (refused, silent server) as errors within the budget."""
from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from operations.remote import loopback

BODY = json.dumps({"model_path": "m", "speculative_algorithm": "EAGLE3", "text": "é" * 50}).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # uvicorn's: the server may keep the connection open unless told otherwise

    def log_message(self, *_):
        pass

    def do_GET(self):
        if self.path == "/length":
            self._head(200, [("Content-Length", str(len(BODY)))])
            self.wfile.write(BODY)
        elif self.path == "/chunked":
            self._head(200, [("Transfer-Encoding", "chunked")])
            for i in range(0, len(BODY), 7):
                part = BODY[i:i + 7]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/close":  # no length: the body ends when the server closes
            self._head(200, [("Connection", "close")])
            self.wfile.write(BODY)
            self.close_connection = True
        elif self.path == "/keepalive":  # ignores "Connection: close": the length alone must end the read
            self.protocol_version = "HTTP/1.1"
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.send_header("Connection", "keep-alive")
            self.end_headers()
            self.wfile.write(BODY)
            self.wfile.flush()
            time.sleep(3)
        elif self.path == "/auth":
            text = (self.headers.get("Authorization") or "none").encode()
            self._head(200, [("Content-Length", str(len(text)))])
            self.wfile.write(text)
        else:
            text = b'{"detail":"Not Found"}'
            self._head(404, [("Content-Length", str(len(text)))])
            self.wfile.write(text)

    def do_POST(self):
        got = self.rfile.read(int(self.headers["Content-Length"]))
        self._head(200, [("Content-Length", str(len(got))), ("Content-Type", "application/json")])
        self.wfile.write(got)

    def _head(self, code, headers):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()


@pytest.fixture(scope="module")
def port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def stdlib(port, path, body=None, headers=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("path", ["/length", "/chunked", "/close", "/missing", "/auth"])
def test_each_answer_is_what_the_standard_library_reads(port, path):
    headers = {"Authorization": "Bearer k3y"}
    assert loopback.request(port, path, headers=headers, timeout=5) == stdlib(port, path, headers=headers)


def test_a_post_sends_json_and_reads_the_answer(port):
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 4}}
    code, raw = loopback.request(port, "/generate", body, timeout=5)
    assert (code, json.loads(raw)) == (200, body) == (stdlib(port, "/generate", body)[0], body)


def test_a_server_keeping_the_connection_open_is_read_to_its_length_not_to_the_budget(port):
    # the server holds the socket 3 s after its answer: reading on to the close would time out first
    assert loopback.request(port, "/keepalive", timeout=2.5) == (200, BODY)


def test_refused_and_silent_servers_fail_within_the_budget():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    with pytest.raises(loopback.HTTPFailure, match="ConnectionRefused"):
        loopback.request(free, "/health", timeout=1)
    with socket.socket() as silent:  # accepts (the kernel's backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        with pytest.raises(loopback.HTTPFailure, match="TimeoutError"):
            loopback.request(silent.getsockname()[1], "/health", timeout=0.3)


def test_an_answer_that_is_not_http_is_an_error():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)

        def answer():
            conn, _ = srv.accept()
            conn.recv(4096)
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(loopback.HTTPFailure, match="not an HTTP answer"):
            loopback.request(srv.getsockname()[1], "/health", timeout=2)
