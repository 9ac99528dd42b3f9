from __future__ import annotations

import streambuf


def test_all_sorted_and_importable():
    assert list(streambuf.__all__) == sorted(streambuf.__all__)
    for name in streambuf.__all__:
        assert getattr(streambuf, name) is not None, name


def test_errors_docstring_lists_every_error():
    from streambuf import errors

    for name in errors.__all__:
        if name[0].isupper():
            assert name in errors.__doc__, name
