"""Checkpoint and resume of ``video.clips`` pipelines: the save/load harness with random
and regular samplers, with and without workers; a resume decodes only the clips it still
owes; elastic resume delivers every clip exactly once."""

from __future__ import annotations

import pytest

from tests.resume_harness import (
    check_save_load,
    counted_once,
    ids_of,
    resume_and_finish,
    save_after,
)

from .resume_data import video_loader

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def paths(videos) -> list[str]:
    return sorted(str(p) for p in videos.values())


@pytest.mark.parametrize("sampler", ["random", "regular"])
@pytest.mark.parametrize("workers", [0, 2])
def test_save_load(paths, sampler, workers) -> None:
    # 5 videos x 3 clips, batches of 2: 8 batches (a video's clips span batches)
    check_save_load(
        video_loader, {"paths": paths, "sampler": sampler, "workers": workers}, [1, 3, 6, "last"]
    )


def test_resume_decodes_only_what_is_owed(paths, monkeypatch) -> None:
    from streambuf.video import decode as decode_mod

    kw = {"paths": paths, "workers": 0, "threads": 1}
    decoded: list[int] = []
    real = decode_mod._emit

    def counting(container, stream, info, clips, wanted, *a, **k):
        decoded.append(len(wanted))
        return real(container, stream, info, clips, wanted, *a, **k)

    monkeypatch.setattr(decode_mod, "_emit", counting)
    first, state = save_after(video_loader, kw, 5)  # 10 of 15 clips delivered
    decoded.clear()
    rest, _ = resume_and_finish(video_loader, kw, state)
    assert sum(len(b) for b in first + rest) == 15
    assert sum(decoded) <= 15 - 10 + 4  # what is left, plus the shuffle pool's clips


@pytest.mark.parametrize(("old", "new"), [(2, 0), (0, 2)])
def test_elastic_exactly_once(paths, old, new) -> None:
    everything = [x for b in video_loader(paths=paths, workers=0) for x in ids_of(b)]
    first, state = save_after(video_loader, {"paths": paths, "workers": old}, 3)
    rest, _ = resume_and_finish(video_loader, {"paths": paths, "workers": new}, state)
    counted_once([x for b in first + rest for x in b], everything)
