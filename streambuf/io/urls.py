"""Shard lists: ``expand_urls`` (braces, globs, lists) and ``redact`` (credentials out).

``expand_urls`` turns what a user types into an explicit, ordered list of shard URLs:

* brace patterns, bash style: ``train-{000000..000127}.tar`` (zero padding kept: the
  width is that of the longer bound when either bound has a leading zero),
  ``{a,b,c}`` lists, several and nested braces, an optional step ``{0..10..2}``;
* ``::``-separated specs in one string (the webdataset convention);
* globs (``*``, ``?``, ``[...]``) on local paths (sorted) and on fsspec URLs other than
  http(s) (through ``fsspec``; sorted); http(s) URLs are never globbed, because ``?``
  starts their query string;
* a list or tuple of any of these, expanded in order.

The order is the spec's order: braces and lists in the written order, each glob sorted.

``redact`` removes credentials from a URL or from any text (an error message, a log
line). Every message streambuf builds about a source passes through it, so that no log
or exception shows ``user:password@`` in a URL, the value of a secret query parameter,
header or ``name=value`` pair (``X-Amz-Signature``, ``sig``, ``api-key``,
``x-api-key``, ``Authorization``, ...), or a value of a secret ``storage_options`` key.
Which names are secret is one rule, ``is_secret_name``, used for all of them.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union

__all__ = ["UrlSpec", "expand_urls", "is_secret_name", "redact", "secrets_of"]

UrlSpec = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]

_PROTO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_GLOB_CHARS = re.compile(r"[*?\[]")
_RANGE = re.compile(r"^(-?[0-9]+)\.\.(-?[0-9]+)(?:\.\.(-?[0-9]+))?$")
_ALPHA_RANGE = re.compile(r"^([a-zA-Z])\.\.([a-zA-Z])$")
_MAX_EXPANSION = 10_000_000


# -- brace expansion -----------------------------------------------------------------
def _find_brace(s: str) -> tuple[int, int, list[str]] | None:
    """The first top-level ``{...}`` of ``s`` with its comma-separated parts, or None."""
    start = s.find("{")
    while start != -1:
        depth, parts, last = 0, [], start + 1
        for i in range(start, len(s)):
            c = s[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    parts.append(s[last:i])
                    if len(parts) > 1 or _RANGE.match(parts[0]) or _ALPHA_RANGE.match(parts[0]):
                        return start, i, parts
                    break  # "{x}" is literal, as in bash; look for a later brace
            elif c == "," and depth == 1:
                parts.append(s[last:i])
                last = i + 1
        else:
            raise ValueError(f"unbalanced '{{' in shard spec {redact(s)!r}")
        start = s.find("{", start + 1)
    return None


def _range_items(body: str) -> list[str] | None:
    m = _RANGE.match(body)
    if m:
        a, b = m.group(1), m.group(2)
        step = abs(int(m.group(3))) if m.group(3) else 1
        if step == 0:
            raise ValueError(f"brace range {{{body}}} has step 0")
        lo, hi = int(a), int(b)
        padded = any(len(x.lstrip("-")) > 1 and x.lstrip("-")[0] == "0" for x in (a, b))
        width = max(len(a), len(b)) if padded else 0
        seq = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        if len(seq) > _MAX_EXPANSION:
            raise ValueError(f"brace range {{{body}}} expands to {len(seq)} names; too many")
        return [str(n).zfill(width) for n in seq]
    m = _ALPHA_RANGE.match(body)
    if m:
        lo_c, hi_c = ord(m.group(1)), ord(m.group(2))
        step_c = 1 if lo_c <= hi_c else -1
        return [chr(c) for c in range(lo_c, hi_c + step_c, step_c)]
    return None


def _braces(s: str) -> list[str]:
    found = _find_brace(s)
    if found is None:
        return [s]
    start, end, parts = found
    prefix, suffix = s[:start], s[end + 1 :]
    items = _range_items(parts[0]) if len(parts) == 1 else None
    alternatives: list[str] = []
    for part in items if items is not None else parts:
        alternatives.extend(_braces(part))
    out: list[str] = []
    tails = _braces(suffix)
    for alt in alternatives:
        out.extend(prefix + alt + tail for tail in tails)
        if len(out) > _MAX_EXPANSION:
            raise ValueError(f"shard spec {redact(s)!r} expands to too many names")
    return out


# -- globs ---------------------------------------------------------------------------
def _protocol(url: str) -> str | None:
    m = _PROTO.match(url)
    return m.group(1).lower() if m else None


def _glob(url: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    proto = _protocol(url)
    if proto in ("http", "https") or not _GLOB_CHARS.search(url):
        return [url]
    if proto is None or proto == "file":
        path = url[len("file://") :] if proto == "file" else url
        found = sorted(glob.glob(os.path.expanduser(path)))
        if not found:
            raise FileNotFoundError(f"no file matches the pattern {redact(url)!r}")
        return [("file://" + p) if proto == "file" else p for p in found]
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"globbing {proto}:// URLs needs fsspec: pip install streambuf[remote]"
        ) from exc
    fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    matches = sorted(fs.glob(path))
    if not matches:
        raise FileNotFoundError(f"no object matches the pattern {redact(url)!r}")
    return [fs.unstrip_protocol(p) for p in matches]


def expand_urls(spec: UrlSpec, /, *, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Expand a shard spec into an explicit, ordered list of URLs or paths.

    Args:
        spec: a string (braces, globs, ``::``-separated parts), a path, or a list/tuple
            of them. See the module docstring for the grammar.
        storage_options: passed to fsspec when globbing remote URLs.

    Returns:
        The URLs, in spec order (each glob sorted). Never empty.

    Raises:
        ValueError: an empty spec, unbalanced braces, a range too large.
        FileNotFoundError: a glob matched nothing.
        TypeError: ``spec`` is not a string, path or sequence of them.
    """
    items: Iterable[Any]
    if isinstance(spec, str | os.PathLike):
        items = [spec]
    elif isinstance(spec, Sequence):
        items = spec
    else:
        raise TypeError(
            f"shard spec must be a str, a path or a list of them, not {type(spec).__name__}"
        )
    out: list[str] = []
    for item in items:
        if not isinstance(item, str | os.PathLike):
            raise TypeError(f"shard spec entries must be str or paths, not {type(item).__name__}")
        for part in os.fspath(item).split("::"):
            part = part.strip()
            if not part:
                continue
            for url in _braces(part):
                out.extend(_glob(url, storage_options))
    if not out:
        raise ValueError(f"shard spec {redact(str(spec))!r} names no shard")
    return out


# -- redaction -----------------------------------------------------------------------
# Which names are secret: one rule (``is_secret_name``) for query parameters, header
# lines, ``name=value`` pairs of messages and ``storage_options`` keys. Matched on the
# name lowercased with ``-`` and ``_`` dropped.
_SECRET_NAME = re.compile(
    r"(?:secret|password|passwd|passphrase|credential|jwt|session)"
    r"|(?:key|token|auth|authorization|sig|signature|pwd)(?:id)?$"
)
_NAME_SEPARATORS = str.maketrans("", "", "-_")
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@'\"<>]+@")
# ``?name=value`` / ``&name=value`` in a URL's query string
_QUERY_PAIR = re.compile(r"([?&;])([^=&#?;\s'\"<>]+)=([^&#\s'\"<>]*)")
# ``name=value``, ``name: value`` (a header line), ``'name': 'value'`` in any text; an
# HTTP auth scheme before the value (``Authorization: Bearer ...``) stays shown. The value
# is looked at, not taken, so that a harmless pair's value can itself be a secret pair
# (``failed: api-key=...``)
_TEXT_PAIR = re.compile(
    r"(?<![\w\-])(['\"]?)(_*[a-zA-Z][\w\-]*)\1\s*[:=]\s*"
    r"(?=((?:basic|bearer|digest|token|negotiate|ntlm|oauth|dpop|hoba|mutual|sharedkey"
    r"|sharedkeylite|aws4-hmac-sha256|goog4-rsa-sha256)\s+)?"
    r"('[^'\n]+'|\"[^\"\n]+\"|[^'\"\s,}&)]+))",
    re.IGNORECASE,
)
_MASK = "***"


def is_secret_name(name: object) -> bool:
    """Whether ``name`` (a query parameter, a header, a ``storage_options`` key, the
    name of a ``name=value`` pair in a message) names a credential: the one rule every
    redaction here applies.

    The name is lowercased and its ``-`` and ``_`` dropped, so ``X-Api-Key``,
    ``x_api_key``, ``apikey`` and ``apiKey`` are alike. It is secret if it

    * contains ``secret``, ``password``, ``passwd``, ``passphrase``, ``credential``,
      ``jwt`` or ``session`` anywhere (``client_secret``, ``X-Goog-Credential``,
      ``jwt_assertion``, ``sessionid``), or
    * ends with ``key``, ``token``, ``auth``, ``authorization``, ``sig``, ``signature``
      or ``pwd``, maybe followed by ``id`` (``api-key``, ``x-api-key``,
      ``subscription-key``, ``Ocp-Apim-Subscription-Key``, ``AccountKey``,
      ``access_key_id``, ``access_token``, ``id-token``, ``X-Amz-Security-Token``,
      ``Authorization``, ``auth``, ``sig`` of an Azure SAS, ``X-Amz-Signature``).

    These short words count only at the end because they also start or sit inside names
    users need to see: ``keyframe``, ``keys``, ``tokens``, ``token_files``,
    ``tokenizer``, ``author``, ``signal``, ``X-Amz-SignedHeaders``,
    ``signature_version`` stay shown (as do ``page``, ``version``, ``X-Amz-Date``). A
    name that merely ends in one (``monkey``) is hidden too: a harmless value hidden
    costs less than a key shown. A sample's ``__field__`` names (``__key__``,
    ``__url__``) are never secret.
    """
    text = str(name)
    if len(text) > 4 and text.startswith("__") and text.endswith("__"):
        return False
    return _SECRET_NAME.search(text.lower().translate(_NAME_SEPARATORS)) is not None


def _mask_query_pair(m: re.Match[str]) -> str:
    return f"{m[1]}{m[2]}={_MASK}" if is_secret_name(m[2]) else m[0]


def _mask_text_pairs(s: str) -> str:
    out: list[str] = []
    done = 0
    for m in _TEXT_PAIR.finditer(s):
        if m.start() < done or not is_secret_name(m[2]):
            continue  # inside a value already masked, or not a secret
        start, end = m.span(4)
        quote = s[start] if s[start] in "'\"" else ""
        out.append(f"{s[done:start]}{quote}{_MASK}{quote}")
        done = end
    return "".join(out) + s[done:]


def secrets_of(storage_options: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The string values of secret keys in ``storage_options`` (nested dicts too:
    ``client_kwargs``, ``headers``), secret by ``is_secret_name`` (``key``, ``secret``,
    ``token``, ``password``, ``aws_secret_access_key``, ``x-api-key``, ``passphrase``...).
    Values shorter than 4 characters are left out (masking them would garble text).
    """
    found: list[str] = []

    def walk(obj: Any) -> None:
        if isinstance(obj, Mapping):
            for k, v in obj.items():
                if isinstance(v, str) and is_secret_name(k):
                    if len(v) >= 4:
                        found.append(v)
                else:
                    walk(v)

    walk(storage_options or {})
    return tuple(sorted(set(found), key=len, reverse=True))


def redact(text: object, /, *, secrets: Iterable[str] = ()) -> str:
    """Return ``str(text)`` with credentials replaced by ``***``.

    Removes: the ``user:password@`` part of URLs (whatever the user's name); the value of
    every query parameter (``?api-key=``, ``&X-Amz-Signature=``, ``&sig=``), header line
    (``x-api-key: ...``, ``Authorization: Bearer ...``, the scheme kept) and
    ``name=value``/``'name': 'value'`` pair of the text whose name ``is_secret_name``
    says is secret (containing secret, password, passphrase, credential or jwt, or
    ending with key, token, auth, sig or signature; ``-`` and ``_`` alike: see there);
    and every literal occurrence of ``secrets`` (e.g. ``secrets_of(storage_options)``).
    Other names and values stay as they are: ``?page=2``, ``X-Amz-Date``, a sample's
    ``__key__``. Idempotent; never raises.
    """
    s = str(text)
    for secret in secrets:
        if secret and len(secret) >= 4:
            s = s.replace(secret, _MASK)
    s = _USERINFO.sub(rf"\1{_MASK}@", s)
    s = _QUERY_PAIR.sub(_mask_query_pair, s)
    s = _mask_text_pairs(s)
    return s
