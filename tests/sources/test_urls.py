from __future__ import annotations

import io
import logging
import tarfile
from pathlib import Path

import pytest

from streambuf.errors import TooManyFailures
from streambuf.io import expand_urls, redact, secrets_of
from streambuf.sources import iter_tar_samples, stream_shards

from .httpserver import FaultyServer

FAST = dict(backoff_s=0.01, max_backoff_s=0.05, timeout_s=5)

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


# -- secret names: one rule for query parameters, text pairs, headers, storage_options -----
SECRET_NAMES = [
    "api-key",
    "api_key",
    "apikey",
    "apiKey",
    "x-api-key",
    "X-Api-Key",
    "subscription-key",
    "Ocp-Apim-Subscription-Key",
    "sessionid",
    "AccountKey",
    "aws_access_key_id",
    "X-Access-Key-Id",
    "passphrase",
    "jwt",
    "access_token",
    "id-token",
    "X-Amz-Security-Token",
    "client_secret",
    "X-Amz-Signature",
    "x-goog-signature",
    "sig",
    "password",
    "credential",
    "X-Amz-Credential",
    "x-goog-credential",
    "Authorization",
    "auth",
]
HARMLESS_NAMES = [
    "page",
    "version",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "keyframe",
    "keys",
    "tokens",
    "token_files",
    "tokenizer",
    "author",
    "signal",
    "signature_version",
    "__key__",
    "__url__",
]
VALUE = "Zq7secretValue"


@pytest.mark.parametrize("name", SECRET_NAMES)
class TestSecretNames:
    """Every name that reads as a credential hides its value, wherever it appears."""

    def test_query(self, name: str) -> None:
        url = f"https://h/x-000001.tar?page=2&{name}={VALUE}&version=3"
        out = redact(url)
        assert VALUE not in out and f"{name}=***" in out
        assert out.startswith("https://h/x-000001.tar?page=2&") and out.endswith("&version=3")
        assert redact(out) == out

    def test_userinfo(self, name: str) -> None:
        out = redact(f"https://{name}:{VALUE}@h/x.tar?page=2")
        assert out == "https://***@h/x.tar?page=2"

    @pytest.mark.parametrize(
        "form", ["{n}={v}", "{n}: {v}", "'{n}': '{v}'", '"{n}": "{v}"', "{n}: Bearer {v}"]
    )
    def test_text(self, name: str, form: str) -> None:
        text = "open failed: " + form.format(n=name, v=VALUE) + ", then gave up"
        out = redact(text)
        assert VALUE not in out and name in out and out.endswith(", then gave up")
        assert redact(out) == out

    def test_storage_options(self, name: str) -> None:
        opts = {name: VALUE, "endpoint_url": "http://x", "headers": {name: VALUE + "2"}}
        assert set(secrets_of(opts)) == {VALUE, VALUE + "2"}


@pytest.mark.parametrize("name", HARMLESS_NAMES)
def test_harmless_names_stay_visible(name: str) -> None:
    for text in (
        f"https://h/x.tar?{name}=visible1",
        f"bad sample: {name}=visible1",
        f"bad sample: {name}: visible1",
        f"bad sample {{'{name}': 'visible1'}}",
    ):
        assert redact(text) == text
    assert secrets_of({name: "visible1"}) == ()


def test_sample_url_hides_credentials_keeps_key_and_query() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("s000/00001.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    buf.seek(0)
    query = "&".join(f"{n}={VALUE}{i}" for i, n in enumerate(SECRET_NAMES))
    url = f"https://u:{VALUE}@h/x-000001.tar?page=2&{query}&version=3"
    (sample,) = iter_tar_samples(buf, url=url)
    assert sample["__key__"] == "s000/00001" and sample["txt"] == b"hi"
    assert VALUE not in sample["__url__"]
    assert sample["__url__"].startswith("https://***@h/x-000001.tar?page=2&")
    assert sample["__url__"].endswith("&version=3")
    assert sample["__url__"].count("=***") == len(SECRET_NAMES)


@pytest.mark.timeout(60)
def test_served_samples_and_errors_hide_credentials(
    http_server: FaultyServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Over a loopback server: every sample's ``__url__``, the error of a missing shard
    and the logs show ``page``/``version`` and the sample keys, never a credential."""
    caplog.set_level(logging.DEBUG, logger="streambuf")
    query = "&".join(f"{n}={VALUE}{i}" for i, n in enumerate(SECRET_NAMES))
    good = f"{http_server.url('shard-000000.tar')}?page=2&{query}&version=3"
    samples = list(stream_shards([good], **FAST))
    assert [s["__key__"] for s in samples] == [f"s000/{i:05d}" for i in range(20)]
    for s in samples:
        assert VALUE not in s["__url__"] and s["__url__"].count("=***") == len(SECRET_NAMES)
        assert "?page=2&" in s["__url__"] and s["__url__"].endswith("&version=3")
    missing = f"{http_server.url('missing.tar')}?page=2&{query}&version=3"
    with pytest.raises(TooManyFailures) as info:
        list(stream_shards([missing], on_error="skip", max_failures=0, **FAST))
    text = str(info.value) + caplog.text + " ".join(getattr(info.value, "__notes__", []))
    text += str(info.value.__cause__) + " ".join(getattr(info.value.__cause__, "__notes__", []))
    assert VALUE not in text and "missing.tar?page=2&" in text
