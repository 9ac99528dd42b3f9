"""A server that answers a missing shard with an HTML page and status 200 (a CDN's or a
proxy's "not found" page, a login page): the tar reader fails on its first header, and
the error says what the server sent instead of only "truncated header (132 of 512
bytes)" (issue "Reliability II"). Real loopback HTTP server (``httpserver.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

import streambuf as sb
from streambuf.errors import ShardError

from .httpserver import FaultyServer

pytestmark = pytest.mark.timeout(60)

PAGE = (
    b"<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1>"
    b"<p>The requested URL was not found here.</p></body></html>\n"
)


def _serve_page(srv: FaultyServer, shard_dir: Path, name: str, content_type: str) -> str:
    (shard_dir / name).write_bytes(PAGE)
    srv.content_types[f"/{name}"] = content_type
    return srv.url(name)


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "text/plain"])
def test_html_page_for_a_shard_names_the_content_type(
    http_server: FaultyServer, shard_dir: Path, content_type: str
) -> None:
    url = _serve_page(http_server, shard_dir, "missing-000.tar", content_type)
    with pytest.raises(ShardError) as info:
        list(sb.shards([url], lanes=1, retries=0))
    msg = str(info.value)
    kind = content_type.split(";")[0]
    assert f"the server answered Content-Type {kind}, not a tar: is the URL right?" in msg, msg
    assert "truncated header" in msg and "missing-000.tar" in msg, msg  # the parse error kept
    assert info.value.stage == "tar"


def test_a_tar_content_type_gets_no_page_hint(http_server: FaultyServer, shard_dir: Path) -> None:
    url = _serve_page(http_server, shard_dir, "garbage.tar", "application/x-tar")
    with pytest.raises(ShardError, match="truncated header") as info:
        list(sb.shards([url], lanes=1, retries=0))
    assert "Content-Type" not in str(info.value)
    good = list(sb.shards([http_server.url("shard-000000.tar")], lanes=1))  # real ones still read
    assert len(good) == 20


def test_an_html_page_is_not_cached_as_the_shard(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path
) -> None:
    url = _serve_page(http_server, shard_dir, "missing-001.tar", "text/html")
    for _ in range(2):  # the second read asks the server again: nothing was cached
        with pytest.raises(ShardError, match="text/html"):
            list(
                sb.shards(
                    [url], lanes=1, retries=0, cache_dir=str(tmp_path / "c"), cache_limit="1MiB"
                )
            )
    assert len(http_server.records("/missing-001.tar")) == 2


def test_not_data_hint() -> None:
    from streambuf.io.opener import not_data_hint

    assert not_data_hint(None) is None and not_data_hint("application/x-tar") is None
    assert not_data_hint("application/octet-stream") is None
    for page in ("text/html", "TEXT/HTML; charset=utf-8", "application/json", "text/xml"):
        assert "is the URL right?" in (not_data_hint(page) or ""), page
