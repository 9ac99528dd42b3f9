"""A threaded HTTP server on 127.0.0.1 with Range support and injectable faults.

Serves files from a directory, or proxies to an upstream HTTP server (e.g. a moto S3
server) so the same faults apply to S3 traffic. Faults are set per path (``"*"``: any):

* ``latency_s``: added before every answer.
* ``fail(path, times, status)``: the next ``times`` requests answer ``status`` (503).
* ``drop(path, after_bytes, times)``: the next ``times`` GETs send their headers (with
  the full Content-Length) and ``after_bytes`` of body, then the socket is closed.
* ``stall(path, after_bytes, seconds, times)``: send ``after_bytes``, go silent for
  ``seconds``, then close (a client with a shorter timeout gives up first).
* ``trickle = (chunk_bytes, delay_s)``: every body is sent in small, delayed chunks.
* ``bandwidth_bps``: every connection is paced to this many bytes per second.
* ``ignore_range``: answer ``200`` with the whole file, whatever ``Range`` says.
* ``content_types[path]``: the ``Content-Type`` of that path's answers (default
  ``application/x-tar``), e.g. ``text/html`` for an error page served with ``200``.

Like real servers, file answers carry ``Last-Modified`` and a strong ``ETag`` derived from
the file's size and mtime (nginx's rule), and ``If-Range`` is honoured (RFC 9110 13.1.5):
a ranged request whose validator no longer matches gets ``200`` and the whole new file
(``ignore_if_range``: answer the ``Range`` anyway, like servers that lack ``If-Range``).

Files are memory-mapped, not read into the heap (memory tests measure the whole system).
``log`` records every request: method, path, the start of its Range (or None), the
status, and the body bytes actually sent.
"""

from __future__ import annotations

import http.client
import mmap
import os
import re
import socket
import threading
import time
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}


@dataclass
class Record:
    method: str
    path: str
    range_start: int | None
    status: int
    bytes_sent: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    t_start: float = field(default_factory=time.monotonic)
    t_end: float | None = None  # when the body was fully sent (or cut)


class FaultyServer:
    """See the module docstring. ``start()``/``stop()`` or use as a context manager."""

    def __init__(self, root: Path | None = None, *, upstream: str | None = None) -> None:
        self.root = root
        self.upstream = upstream
        self.latency_s = 0.0
        self.trickle: tuple[int, float] | None = None
        self.bandwidth_bps: float | None = None
        self.ignore_range = False  # answer 200 with the whole body, like some servers do
        self.ignore_if_range = False  # serve Range even when If-Range no longer matches
        self.content_types: dict[str, str] = {}  # path -> Content-Type (default: a tar)
        self.log: list[Record] = []
        self._lock = threading.Lock()
        self._fail: dict[str, list[int]] = defaultdict(list)
        self._drop: dict[str, list[int]] = defaultdict(list)
        self._stall: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- faults -----------------------------------------------------------------------
    def fail(self, path: str, times: int = 1, status: int = 503) -> None:
        with self._lock:
            self._fail[path] += [status] * times

    def drop(self, path: str, after_bytes: int, times: int = 1) -> None:
        with self._lock:
            self._drop[path] += [after_bytes] * times

    def stall(self, path: str, after_bytes: int, seconds: float, times: int = 1) -> None:
        with self._lock:
            self._stall[path] += [(after_bytes, seconds)] * times

    def _take(self, table: dict[str, list[Any]], path: str) -> Any:
        with self._lock:
            for key in (path, "*"):
                if table.get(key):
                    return table[key].pop(0)
        return None

    def records(self, path: str | None = None, method: str = "GET") -> list[Record]:
        with self._lock:
            return [r for r in self.log if r.method == method and (path is None or r.path == path)]

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._httpd is not None
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def start(self) -> FaultyServer:
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        self._httpd.daemon_threads = True
        self._httpd.request_queue_size = 256  # (the default 5 drops SYNs of many lanes:
        self._httpd.server_bind()  # a 1 s retransmit each)
        self._httpd.server_activate()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="test-httpserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FaultyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _map(file: Path) -> tuple[memoryview, os.stat_result]:
    """The file's bytes without copying them into this process's heap (served from the
    page cache, so a memory measurement of the system does not count the server), and the
    ``stat`` of that same open file (its validators describe exactly these bytes)."""
    with open(file, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_size == 0:
            return memoryview(b""), st
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)), st


class _Handler(BaseHTTPRequestHandler):
    owner: FaultyServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_PUT(self) -> None:
        self._serve(body=True)

    def do_POST(self) -> None:
        self._serve(body=True)

    def _record(self, status: int, range_start: int | None) -> Record:
        rec = Record(
            self.command,
            urllib.parse.urlsplit(self.path).path,
            range_start,
            status,
            headers={k: v for k, v in self.headers.items()},
        )
        with self.owner._lock:
            self.owner.log.append(rec)
        return rec

    def _serve(self, *, body: bool) -> None:
        srv = self.owner
        if srv.latency_s:
            time.sleep(srv.latency_s)
        path = urllib.parse.urlsplit(self.path).path
        rng = None if srv.ignore_range else self.headers.get("Range")
        m = _RANGE.match(self.headers.get("Range") or "")
        range_start = int(m.group(1)) if m and m.group(1) else None
        m = _RANGE.match(rng or "")
        status = srv._take(srv._fail, path)
        if status is not None:
            self._record(status, range_start)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if srv.upstream is not None:
            self._proxy(path, range_start, body)
            return
        assert srv.root is not None
        file = (srv.root / urllib.parse.unquote(path).lstrip("/")).resolve()
        if not file.is_file() or srv.root.resolve() not in file.parents:
            self._record(404, range_start)
            self.send_error(404, "File not found")
            return
        data, st = _map(file)
        size = len(data)
        etag = f'"{st.st_mtime_ns:x}-{size:x}"'
        last_modified = self.date_time_string(int(st.st_mtime))
        if_range = self.headers.get("If-Range")
        stale = if_range is not None and if_range not in (etag, last_modified)
        if rng is not None and stale and not srv.ignore_if_range:
            rng = None  # the client's copy is stale: send the whole current file
        start, end = 0, size - 1
        status = 200
        if rng is not None:
            if not m or (not m.group(1) and not m.group(2)):
                start = -1
            elif not m.group(1):
                start = max(0, size - int(m.group(2)))
            else:
                start = int(m.group(1))
                end = min(size - 1, int(m.group(2))) if m.group(2) else size - 1
            if start < 0 or start >= size or end < start:
                self._record(416, range_start)
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        rec = self._record(status, range_start)
        self.send_response(status)
        self.send_header("Content-Type", srv.content_types.get(path, "application/x-tar"))
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", last_modified)
        self.send_header("ETag", etag)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if body and self.command == "GET":
            self._send_body(path, data[start : end + 1], rec)

    def _proxy(self, path: str, range_start: int | None, body: bool) -> None:
        srv = self.owner
        up = urllib.parse.urlsplit(srv.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
        length = int(self.headers.get("Content-Length") or 0)
        payload = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        headers["Host"] = self.headers.get("Host", "")
        conn.request(self.command, self.path, body=payload, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        rec = self._record(resp.status, range_start)
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP and k.lower() != "content-length":
                self.send_header(k, v)
        head_length = resp.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", head_length or str(len(data)))
        self.end_headers()
        if body and self.command == "GET":
            self._send_body(path, memoryview(data), rec)

    def _send_body(self, path: str, data: memoryview, rec: Record) -> None:
        srv = self.owner
        limit: int | None = srv._take(srv._drop, path)
        stall = srv._take(srv._stall, path)
        if stall is not None:
            limit = stall[0]
        chunk, delay = srv.trickle or (64 << 10, 0.0)
        t0 = time.monotonic()
        sent = 0
        try:
            while sent < len(data):
                n = min(chunk, len(data) - sent)
                if limit is not None:
                    n = min(n, limit - sent)
                    if n <= 0:
                        break
                self.wfile.write(data[sent : sent + n])
                sent += n
                rec.bytes_sent = sent
                if delay:
                    time.sleep(delay)
                if srv.bandwidth_bps:
                    ahead = sent / srv.bandwidth_bps - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
            rec.t_end = time.monotonic()
            if limit is not None and sent < len(data):
                self.wfile.flush()
                if stall is not None:
                    srv.stopping.wait(stall[1])
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
