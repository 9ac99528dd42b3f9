"""Video clips decoded with PyAV: ``clips`` (a Pipeline), ``decode_member`` (for tar
shards), ``decode_clips`` (one video), samplers, ``probe`` and ``Clip``.

Importing this package does not import PyAV; ``probe`` and ``decode_clips`` do, and raise
``ImportError`` naming the extra (``pip install streambuf[video]``) when it is missing.
Conventions (docs/video.md): uint8 RGB, layout "TCHW" by default, time in
seconds from real frame pts, torchcodec's sampler vocabulary.
"""

from __future__ import annotations

from .audio import AudioSamples
from .decode import Clip, DecodeStats, Layout, decode_clips
from .member import MemberDecoder, decode_member
from .probe import VideoInfo, VideoSource, probe
from .samplers import (
    ClipSampler,
    Policy,
    clips_at_random_indices,
    clips_at_random_timestamps,
    clips_at_regular_indices,
    clips_at_regular_timestamps,
    every_frame_windows,
    sampler_rng,
)
from .source import VideoReader, clips

__all__ = [
    "AudioSamples",
    "Clip",
    "ClipSampler",
    "DecodeStats",
    "Layout",
    "MemberDecoder",
    "Policy",
    "VideoInfo",
    "VideoReader",
    "VideoSource",
    "clips",
    "clips_at_random_indices",
    "clips_at_random_timestamps",
    "clips_at_regular_indices",
    "clips_at_regular_timestamps",
    "decode_clips",
    "decode_member",
    "every_frame_windows",
    "probe",
    "sampler_rng",
]
