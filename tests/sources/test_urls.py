from __future__ import annotations

from pathlib import Path

import pytest

from streambuf.io import expand_urls, redact, secrets_of

pytestmark = pytest.mark.timeout(30)


def test_brace_range_keeps_padding() -> None:
    urls = expand_urls("s3://b/train-{000000..000127}.tar")
    assert len(urls) == 128
    assert urls[0] == "s3://b/train-000000.tar"
    assert urls[-1] == "s3://b/train-000127.tar"


def test_several_braces_lists_and_nesting() -> None:
    assert expand_urls("x-{a,b}-{1..2}.tar") == ["x-a-1.tar", "x-a-2.tar", "x-b-1.tar", "x-b-2.tar"]
    assert expand_urls("{a,b{1..2}}.tar") == ["a.tar", "b1.tar", "b2.tar"]
    assert expand_urls("s-{8..11}.tar") == ["s-8.tar", "s-9.tar", "s-10.tar", "s-11.tar"]
    assert expand_urls("s-{0..4..2}") == ["s-0", "s-2", "s-4"]
    assert expand_urls("s-{3..1}") == ["s-3", "s-2", "s-1"]
    assert expand_urls("lit{x}.tar") == ["lit{x}.tar"]


def test_lists_tuples_and_double_colon() -> None:
    spec = ["a-{0..1}.tar", ("b.tar"), Path("c.tar")]
    assert expand_urls(spec) == ["a-0.tar", "a-1.tar", "b.tar", "c.tar"]
    assert expand_urls(("x.tar", "y.tar")) == ["x.tar", "y.tar"]
    assert expand_urls("a.tar::b-{1..2}.tar") == ["a.tar", "b-1.tar", "b-2.tar"]


def test_local_glob_sorted(tmp_path: Path) -> None:
    for name in ("b.tar", "a.tar", "c.txt"):
        (tmp_path / name).write_bytes(b"")
    assert expand_urls(str(tmp_path / "*.tar")) == [
        str(tmp_path / "a.tar"),
        str(tmp_path / "b.tar"),
    ]
    assert expand_urls(f"file://{tmp_path}/*.tar") == [
        f"file://{tmp_path}/a.tar",
        f"file://{tmp_path}/b.tar",
    ]
    with pytest.raises(FileNotFoundError):
        expand_urls(str(tmp_path / "*.nothing"))


def test_http_urls_not_globbed() -> None:
    url = "https://h/x.tar?X-Amz-Signature=abc&y=1"
    assert expand_urls(url) == [url]


def test_fsspec_memory_glob() -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for name in ("s-1.tar", "s-0.tar"):
        fs.pipe(f"/globtest/{name}", b"x")
    assert expand_urls("memory://globtest/s-*.tar") == [
        "memory:///globtest/s-0.tar",
        "memory:///globtest/s-1.tar",
    ]


@pytest.mark.parametrize("bad", ["", [], "a-{1..2"])
def test_bad_specs(bad: object) -> None:
    with pytest.raises(ValueError):
        expand_urls(bad)  # type: ignore[arg-type]


def test_bad_type() -> None:
    with pytest.raises(TypeError):
        expand_urls(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, secret",
    [
        ("http://user:hunter22@127.0.0.1:80/x.tar", "hunter22"),
        ("http://user:hunter22@127.0.0.1:80/x.tar", "user"),
        ("https://h/x.tar?X-Amz-Signature=abcdef&X-Amz-Date=1", "abcdef"),
        ("https://h/x.tar?X-Amz-Credential=AKIAXYZ%2F2024&a=b", "AKIAXYZ"),
        ("https://h/x.tar?token=tok123", "tok123"),
        ("https://acct.blob/x.tar?sv=2020&sig=sigsig", "sigsig"),
        ("failed with {'key': 'AKIA1234', 'secret': 's3cr3t!'}", "s3cr3t!"),
        ("failed with {'key': 'AKIA1234', 'secret': 's3cr3t!'}", "AKIA1234"),
        ("aws_secret_access_key=wJalrXUtn", "wJalrXUtn"),
        ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
        ("password=pw1234 and more", "pw1234"),
    ],
)
def test_redact(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out
    assert "***" in out
    assert redact(out) == out


def test_redact_keeps_the_rest() -> None:
    assert redact("http://h:8080/a/b-000001.tar?X-Amz-Date=1") == (
        "http://h:8080/a/b-000001.tar?X-Amz-Date=1"
    )
    assert redact("sample __key__ s000/00001") == "sample __key__ s000/00001"


def test_redact_storage_option_values() -> None:
    opts = {
        "key": "AKIAEXAMPLE",
        "secret": "verysecret",
        "endpoint_url": "http://x",
        "client_kwargs": {"aws_session_token": "sessiontok"},
    }
    secrets = secrets_of(opts)
    assert set(secrets) == {"AKIAEXAMPLE", "verysecret", "sessiontok"}
    text = "boom: verysecret / sessiontok / AKIAEXAMPLE at http://x"
    out = redact(text, secrets=secrets)
    assert all(s not in out for s in secrets)
    assert "http://x" in out
