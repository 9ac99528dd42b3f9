"""The http(s) transport of ``open_stream``: urllib, one streaming GET per connection,
``Range: bytes=<offset>-`` to resume (see ``opener`` for why not fsspec here).

Invariant: every byte delivered by one read comes from one version of the object. The
first answer's strong ``ETag`` (else its ``Last-Modified``) is the validator; a resume
sends it as ``If-Range`` and checks the answer's validator and size against it. Same
version: a ``206`` continues at ``offset``, a ``200`` (``Range`` ignored) is re-received
and its first ``offset`` bytes dropped (counted in ``discarded_bytes``). Another version:
``_Changed``, never retried. Without any validator only the size can be compared."""

from __future__ import annotations

import base64
import http.client
import logging
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ._resumable import _Changed, _Missing, _RawBase, _Transient

log = logging.getLogger("streambuf")


class _HTTPRaw(_RawBase):
    def __init__(self, url: str, **kw: Any) -> None:
        super().__init__(url, **kw)
        parts = urllib.parse.urlsplit(url)
        self._headers = {"Accept-Encoding": "identity", "User-Agent": "streambuf"}
        if parts.username is not None or parts.password is not None:
            user = urllib.parse.unquote(parts.username or "")
            pw = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{pw}".encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
            self._secrets = (*self._secrets, *(s for s in (pw, token) if len(s) >= 4))
            netloc = parts.hostname or ""
            if ":" in netloc:
                netloc = f"[{netloc}]"
            if parts.port is not None:
                netloc += f":{parts.port}"
            parts = parts._replace(netloc=netloc)
        self._plain_url = urllib.parse.urlunsplit(parts)
        self._resp: http.client.HTTPResponse | None = None
        self._validator: tuple[str, str] | None = None

    def _connect(self, offset: int) -> None:
        headers = dict(self._headers)
        if offset or self.end is not None:
            last = "" if self.end is None else str(self.end - 1)
            headers["Range"] = f"bytes={offset}-{last}"
            if self._validator:
                headers["If-Range"] = self._validator[1]
        req = urllib.request.Request(self._plain_url, headers=headers)
        try:
            resp = urllib.request.urlopen(req, timeout=self._timeout_s)
        except urllib.error.HTTPError as exc:
            status, reason = exc.code, exc.reason
            exc.close()
            if status == 416 and self.size is not None and offset >= self.size:
                self._resp = None
                return
            msg = f"HTTP {status} {reason}"
            if status in (404, 410):
                raise FileNotFoundError(msg) from None
            if status in (401, 403):
                raise PermissionError(msg) from None
            if status >= 500 or status in (408, 429):
                raise _Transient(msg) from None
            raise _Missing(msg) from None
        try:
            self._check_answer(resp, offset)
        except BaseException:
            resp.close()
            raise
        if offset == self.start:  # nothing delivered yet: this answer's version is ours
            self.content_type = resp.headers.get("Content-Type")
            etag = resp.headers.get("ETag")
            if etag and not etag.startswith("W/"):
                self._validator = ("etag", etag)
            elif resp.headers.get("Last-Modified"):
                self._validator = ("date", resp.headers["Last-Modified"])
            else:
                self._validator = None
        self._resp = resp

    def _check_answer(self, resp: http.client.HTTPResponse, offset: int) -> None:
        """Check that ``resp`` continues this read at ``offset``; set ``size``.

        ``206``: ``Content-Range`` must start at ``offset``. ``200`` to a resume (a server
        that ignores ``Range``): the first ``offset`` bytes are received again and dropped.
        Either way, on a resume the answer must come from the same version of the object
        as the bytes already delivered (same strong ETag or Last-Modified, same size).
        """
        status = resp.status
        if status == 206:
            cr = resp.headers.get("Content-Range", "")
            try:
                unit_range, total = cr.split(" ", 1)[1].split("/")
                start = int(unit_range.split("-")[0])
                size = None if total == "*" else int(total)
            except (IndexError, ValueError):
                raise _Transient(f"bad Content-Range {cr!r}") from None
            if start != offset:
                raise _Transient(f"asked for byte {offset}, server answered from byte {start}")
        elif status == 200:
            length = resp.headers.get("Content-Length")
            size = int(length) if length is not None and length.isdigit() else None
        else:
            raise _Transient(f"unexpected HTTP status {status}")
        if offset > self.start:
            self._check_same_object(resp, offset, size)
        if size is not None:
            self.size = size
        if status == 200 and offset:
            self._skip_prefix(resp, offset)

    def _check_same_object(
        self, resp: http.client.HTTPResponse, offset: int, size: int | None
    ) -> None:
        why = None
        if self._validator is not None:
            kind, was = self._validator
            header = "ETag" if kind == "etag" else "Last-Modified"
            now = resp.headers.get(header)
            if now is not None and now != was:
                why = f"{header} {was} became {now}"
        if why is None and size is not None and self.size is not None and size != self.size:
            why = f"its size {self.size} became {size}"
        if why is not None:
            raise _Changed(
                f"the object changed while it was being read ({why}), so the read cannot "
                "resume (the bytes delivered so far are from the old version); publish new "
                "shards under new names instead of overwriting them while they are read"
            )

    def _skip_prefix(self, resp: http.client.HTTPResponse, offset: int) -> None:
        log.warning(
            "streambuf: %s ignored the Range header; discarding %d bytes to resume",
            self.url,
            offset,
        )
        left = offset
        self._resp = resp  # read through _timed_read: the progress rule applies here too
        while left:
            chunk = self._timed_read(min(left, 1 << 20))
            if not chunk:
                raise http.client.IncompleteRead(b"", left)
            left -= len(chunk)
            self._counters.add(discarded_bytes=len(chunk))

    def _read_some(self, n: int) -> bytes:
        if self._resp is None:
            return b""
        data = self._resp.read1(n)
        if not data and self.size is not None and self.offset < self.size:
            raise http.client.IncompleteRead(b"", self.size - self.offset)
        return data

    def _disconnect(self) -> None:
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.close()

    def _interrupt(self) -> None:
        resp = self._resp
        sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
