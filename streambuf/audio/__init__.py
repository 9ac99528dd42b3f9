"""Audio clips decoded with PyAV: ``clips`` (a Pipeline over audio files),
``decode_member`` (audio members of tar shards), ``decode_audio_clips`` (one file),
timestamp samplers and ``AudioSamples`` (torchcodec's field names).

Importing this package does not import PyAV; the functions that decode do, and raise
``ImportError`` naming the extra (``pip install streambuf[video]``) when it is missing.
A clip is ``AudioSamples``: ``data`` float32 ``[channels, samples]``, ``pts_seconds`` of
its first sample (the stream's own timestamps), ``duration_seconds``, ``sample_rate``,
``source`` and ``clip_index``; clips of one rate have ``round(seconds * rate)`` samples,
so they stack into batches. docs/video.md ("Audio files").
"""

from __future__ import annotations

from ..video.audio import AudioSamples
from .decode import AudioDecodeStats, decode_audio_clips
from .samplers import (
    AudioClipSampler,
    clips_at_random_timestamps,
    clips_at_regular_timestamps,
    every_window,
)
from .source import AudioMemberDecoder, AudioReader, clips, decode_member

__all__ = [
    "AudioClipSampler",
    "AudioDecodeStats",
    "AudioMemberDecoder",
    "AudioReader",
    "AudioSamples",
    "clips",
    "clips_at_random_timestamps",
    "clips_at_regular_timestamps",
    "decode_audio_clips",
    "decode_member",
    "every_window",
]
