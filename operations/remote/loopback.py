"""HTTP/1.1 to a server on this host (127.0.0.1) over a plain socket, for the host programs.

Why not ``urllib.request``: importing it (with ``http.client`` and ``email``) costs a host program about 25 ms
of every run, more than the requests themselves, and every no-op converge pays it on every host. What the
servers here answer is small and simple (SGLang and vLLM behind uvicorn, the stand-in behind ``http.server``):
one response per connection (``Connection: close``), its body sized by ``Content-Length``, chunked, or ended by
the close. ``timeout`` bounds the whole exchange, not each read, so a server that trickles cannot hold a host
program past its budget.
"""
import json
import socket
import time

MAX_BODY = 64 * 1024 * 1024  # an answer larger than this is not one of ours


class HTTPFailure(OSError):
    """The exchange did not produce a response (refused, reset, timed out, not HTTP)."""


def request(port, path, body=None, headers=None, timeout=2.0):
    """(status, body bytes) of one request to 127.0.0.1:``port``; POST with ``body`` (JSON) when given.
    Raises ``HTTPFailure`` (an OSError) when no response arrives within ``timeout`` seconds."""
    data = b"" if body is None else json.dumps(body).encode()
    head = [f"{'GET' if body is None else 'POST'} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}",
            "Connection: close", "Accept: application/json", "User-Agent: specops"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=timeout) as sock:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
            return _response(_Reader(sock, deadline))
    except socket.timeout:
        raise HTTPFailure(f"TimeoutError: no complete answer within {timeout:g}s") from None
    except HTTPFailure:
        raise
    except OSError as exc:
        raise HTTPFailure(f"{type(exc).__name__}: {exc}") from None


class _Reader:
    """Buffered reads from the socket, each bounded by what is left of the deadline."""

    def __init__(self, sock, deadline):
        self.sock, self.deadline, self.buf, self.eof = sock, deadline, b"", False

    def _fill(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        self.sock.settimeout(left)
        chunk = self.sock.recv(65536)
        self.eof = not chunk
        self.buf += chunk
        if len(self.buf) > MAX_BODY:
            raise HTTPFailure(f"answer larger than {MAX_BODY} bytes")

    def line(self):
        while b"\r\n" not in self.buf:
            if self.eof:
                raise HTTPFailure("connection closed before the answer's headers ended")
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exactly(self, n):
        while len(self.buf) < n:
            if self.eof:
                raise HTTPFailure("connection closed before the answer's body ended")
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def rest(self):
        while not self.eof:
            self._fill()
        out, self.buf = self.buf, b""
        return out


def _response(r):
    status = r.line().split(None, 2)
    if len(status) < 2 or not status[0].startswith(b"HTTP/") or not status[1].isdigit():
        raise HTTPFailure(f"not an HTTP answer: {b' '.join(status)[:80]!r}")
    code = int(status[1])
    if code == 100:  # "Continue" before the real answer
        while r.line():
            pass
        return _response(r)
    fields = {}
    for raw in iter(r.line, b""):
        name, _, value = raw.decode("latin-1").partition(":")
        fields[name.strip().lower()] = value.strip()
    if code in (204, 304) or 100 <= code < 200:
        return code, b""
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return code, _chunked(r)
    if fields.get("content-length", "").isdigit():
        return code, r.exactly(int(fields["content-length"]))
    return code, r.rest()


def _chunked(r):
    out = b""
    while True:
        size = r.line().split(b";", 1)[0].strip()
        try:
            n = int(size, 16)
        except ValueError:
            raise HTTPFailure(f"bad chunk size {size[:20]!r}") from None
        if n == 0:
            while r.line():  # trailers
                pass
            return out
        out += r.exactly(n)
        r.exactly(2)  # the chunk's CRLF
