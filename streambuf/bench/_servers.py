"""Loopback servers for the network benchmark, each in a child process (so its Python
threads never share a GIL with the loaders being measured).

* ``http``: files from a folder over HTTP/1.1 with single ``Range`` requests, adding
  ``latency_s`` before every answer and pacing every connection to ``bandwidth_bps``
  (an object store's per-stream throughput: throughput comes from concurrent streams).
  Files are memory-mapped, never read into the heap (memory is measured system-wide).
* ``moto``: moto's S3-compatible server (``pip install 'streambuf[bench]'``).

``with serve("http", root, latency_s, bandwidth_bps) as url: ...`` starts one and yields
its base URL; the child exits when its stdin closes (also when this process dies).
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["loopback_env", "serve"]

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
_CHUNK = 64 << 10


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root: Path
    latency_s: float
    bandwidth_bps: float | None

    def log_message(self, format: str, *args: Any) -> None:  # no access log
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        if self.latency_s:
            time.sleep(self.latency_s)
        rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        file = (self.root / rel).resolve()
        if not file.is_file() or self.root not in file.parents:
            self.send_error(404, "File not found")
            return
        with open(file, "rb") as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)) if size else None
        start, end, status = 0, size - 1, 200
        m = _RANGE.match(self.headers.get("Range") or "")
        if m:
            start = int(m.group(1))
            end = min(size - 1, int(m.group(2))) if m.group(2) else size - 1
            if start >= size or end < start:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{st.st_mtime_ns:x}-{size:x}"')
        self.send_header("Last-Modified", self.date_time_string(int(st.st_mtime)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if body and data is not None:
            self._send(data[start : end + 1])

    def _send(self, data: memoryview) -> None:
        t0, sent = time.monotonic(), 0
        try:
            while sent < len(data):
                n = min(_CHUNK, len(data) - sent)
                self.wfile.write(data[sent : sent + n])
                sent += n
                if self.bandwidth_bps:
                    ahead = sent / self.bandwidth_bps - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        except OSError:  # the client went away (a loader shutting down)
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: 2 workers x 8 lanes connecting at once
    # overflow it, and a dropped SYN is sent again after Linux's 1 s timeout (the HTTP
    # rows' median run took 1 s more at lanes=8 and "auto"; ListenOverflows counted it)
    request_queue_size = 256
    daemon_threads = True


def _serve_http(root: str, latency_s: float, bandwidth_bps: float | None) -> None:
    handler = type(
        "Handler",
        (_Handler,),
        {"root": Path(root).resolve(), "latency_s": latency_s, "bandwidth_bps": bandwidth_bps},
    )
    httpd = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    print(f"http://127.0.0.1:{httpd.server_address[1]}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    httpd.shutdown()


def _serve_moto() -> None:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    print(f"http://{host}:{port}", flush=True)
    sys.stdin.read()
    server.stop()


def loopback_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: os.environ) without proxies for loopback (curl included)."""
    out = dict(os.environ if env is None else env)
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        out.pop(var, None)
    out["no_proxy"] = out["NO_PROXY"] = "127.0.0.1,localhost"
    return out


@contextmanager
def loopback_only() -> Iterator[None]:
    """``os.environ`` without proxies for loopback while inside (restored on exit), so the
    readers measured, and their DataLoader workers, never go through a proxy."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(loopback_env(saved))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def serve(kind: str, *args: Any, timeout_s: float = 60) -> Iterator[str]:
    """Start server ``kind`` ("http" with root, latency_s, bandwidth_bps; or "moto") in a
    child process; yield its base URL; stop it on exit."""
    from ._harness import _child_env

    proc = subprocess.Popen(
        [sys.executable, "-m", "streambuf.bench._servers", kind, json.dumps(list(args))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=loopback_env(_child_env()),
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        url = proc.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"the benchmark's {kind} server did not start (got {url!r})")
        yield url
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout_s / 6)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


if __name__ == "__main__":
    _kind, _args = sys.argv[1], json.loads(sys.argv[2])
    if _kind == "http":
        _serve_http(*_args)
    else:
        _serve_moto()
