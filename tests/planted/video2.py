"""The planted bugs of Video II (issue 28): audio with clips. Each must make the tests
named beside it fail."""

from __future__ import annotations

from tests.planted._mutant import planted

A = "tests/video/test_audio.py"
F = "tests/video/test_audio_files.py"
C = "tests/video/test_audio_channels.py"
G = "tests/video/test_gpu_decode.py"
B = "tests/video/test_audio_bounds.py"
R = "tests/video/test_audio_grid.py"
V = "tests/video/test_audio_video_edges.py"

_m = planted("video2")

MUTANTS = [
    _m(
        "audio: off by one audio frame (the first frame's time taken from its end)",
        "streambuf/video/audio.py",
        "                    t0 = float(frame.pts * frame.time_base)",
        "                    t0 = float(frame.pts * frame.time_base) + frame.samples / frame.sample_rate",
        f"{A}::test_bursts_fall_where_the_frames_say",
    ),
    _m(
        "audio: a clip gets the audio of the lowest clip index left (sampler order, not the clip's)",
        "streambuf/video/decode.py",
        "audio=None if sound is None else sound.pop(ci),",
        "audio=None if sound is None else sound.pop(min(sound)),",
        f"{A}::test_bursts_fall_where_the_frames_say",
    ),
    _m(
        "audio: the bytes of a clip's audio are not counted",
        "streambuf/sizing.py",
        "for f in dataclasses.fields(obj))",
        "for f in dataclasses.fields(obj) if f.name != 'audio')",
        f"{A}::test_audio_bytes_count_in_the_clip",
    ),
    _m(
        "audio: runs formed from the wanted clips only (a resume hears other samples)",
        "streambuf/video/decode.py",
        "spans = _spans(info, clips, range(len(clips)))",
        "spans = _spans(info, clips, wanted)",
        f"{A}::test_exact_resume_gives_the_same_audio",
    ),
    _m(
        "audio: a batch's padding left out of lengths",
        "streambuf/video/audio.py",
        "            lengths=torch.tensor(lengths, dtype=torch.int64),",
        "            lengths=torch.tensor([longest] * len(batch), dtype=torch.int64),",
        f"{A}::test_a_batch_pads_to_the_longest_and_counts_every_sample",
    ),
    _m(
        "audio files: times not counted from the stream's start (an mp3 late by its delay)",
        "streambuf/audio/decode.py",
        "        t0 -= origin  # the file's time: 0 at its first sample",
        "        pass",
        f"{F}::test_lossy_files_place_their_bursts_in_time",
    ),
    _m(
        "audio files: a clip one sample short",
        "streambuf/audio/decode.py",
        "    n = round(seconds * rate)",
        "    n = round(seconds * rate) - 1",
        f"{F}::test_clips_by_timestamps_are_exact_to_the_sample",
    ),
    _m(
        "audio files: a clip past a truncation filled with zeros",
        "streambuf/audio/decode.py",
        "            if spans[ci][1] > end + (0.0 if damage else _SHORT_S):",
        "            if False:",
        f"{F}::test_a_truncated_file_is_named_or_skipped_and_counted",
    ),
    _m(
        "gpu decode: the frame's colour matrix ignored (BT.709 read as BT.601)",
        "streambuf/video/gpu.py",
        'matrix = _MATRIX_OF_COLORSPACE.get(int(frame.colorspace), "601")',
        'matrix = "601"',
        f"{G}::test_conversion_matches_swscale_and_reads_matrix_and_range_from_the_frame",
    ),
    _m(
        "gpu decode: full-range (JPEG) frames converted as limited range",
        "streambuf/video/gpu.py",
        "full_range=int(frame.color_range) == _JPEG_RANGE)",
        "full_range=False)",
        f"{G}::test_conversion_matches_swscale_and_reads_matrix_and_range_from_the_frame",
    ),
    _m(
        "gpu decode: a 4:4:4 stream passed to the 4:2:0 converter (caught late, misnamed)",
        "streambuf/video/gpu.py",
        "    if fmt not in _CONVERTS:",
        "    if False:",
        f"{G}::test_a_format_it_cannot_convert_is_named",
    ),
    _m(
        "gpu decode: the Loader starts workers for a pipeline decoding onto the device",
        "streambuf/loader.py",
        "        if num_workers and on is not None:",
        "        if False:",
        f"{G}::test_loader_refuses_workers_for_a_pipeline_decoding_onto_a_device",
    ),
    _m(
        "gpu decode: a mix does not say its source decodes onto the device",
        "streambuf/mixing.py",
        "return next((d for p in self.pipelines if (d := p._decodes_on())), None)",
        "return None",
        f"{G}::test_loader_refuses_workers_for_a_pipeline_decoding_onto_a_device",
    ),
    _m(
        "gpu decode: an odd-sized nv12 frame refused (chroma taken as rounded up only)",
        "streambuf/video/gpu.py",
        "    halves = ({h // 2, (h + 1) // 2}, {w // 2, (w + 1) // 2})",
        "    halves = ({(h + 1) // 2}, {(w + 1) // 2})",
        f"{G}::test_odd_sizes_convert_like_swscale",
    ),
    _m(
        "gpu decode: a mix of device and host sources accepted (its batches cannot stack)",
        "streambuf/mixing.py",
        "        if p._decodes_on() != pipelines[0]._decodes_on():",
        "        if False:",
        f"{G}::test_sources_decoding_onto_different_devices_are_not_mixed",
    ),
    _m(
        "gpu decode: a plain DataLoader worker iterates a pipeline decoding onto the device",
        "streambuf/pipeline.py",
        "            if get_worker_info() is not None:",
        "            if False:",
        f"{G}::test_a_plain_dataloader_worker_refuses_a_pipeline_decoding_onto_a_device",
    ),
    _m(
        "gpu decode: num_workers='auto' picks workers for a pipeline decoding onto the device",
        "streambuf/resources.py",
        "    if on_device is not None:\n",
        "    if False:\n",
        f"{G}::test_loader_refuses_workers_for_a_pipeline_decoding_onto_a_device",
    ),
    _m(
        "audio: a Matroska file's duration counted from its start time (audio after 0)",
        "streambuf/audio/decode.py",
        '    if "matroska" not in (container.format.name or ""):',
        "    if True:",
        f"{C}::test_audio_that_starts_after_zero_places_every_clip",
    ),
    _m(
        "audio: a file of more than 8 channels is decoded at its own count",
        "streambuf/audio/decode.py",
        "    channels = want[1] or min(stream.channels, MAX_CHANNELS)  # (more: down to 7.1)",
        "    channels = want[1] or stream.channels",
        f"{C}::test_more_than_eight_channels_are_downmixed_or_refused",
    ),
    _m(
        "audio samplers: NaN passes a range check",
        "streambuf/audio/samplers.py",
        "isinstance(value, int | float) and math.isfinite(value)",
        "isinstance(value, int | float)",
        f"{C}::test_nan_ranges_are_refused_by_every_sampler",
    ),
    _m(
        "video samplers: NaN passes a range check",
        "streambuf/video/samplers.py",
        "                or not math.isfinite(value)\n",
        "                or False\n",
        f"{C}::test_nan_ranges_are_refused_by_every_sampler",
    ),
    _m(
        "audio files: a header duration the stream cannot back is trusted (a duration bomb)",
        "streambuf/audio/decode.py",
        "    reached = _reach(container, stream, origin, duration)\n",
        "    return duration\n",
        f"{B}::test_a_duration_bomb_is_refused_by_every_sampler",
    ),
    _m(
        "audio files: no cap on clips per file (a regular sampler lists what any header says)",
        "streambuf/audio/samplers.py",
        "    if count <= max_clips:",
        "    if True:",
        f"{B}::test_clips_per_file_are_capped_by_max_clips",
    ),
    _m(
        "audio files: a genuine file whose size cannot back its header refused after the seek",
        "streambuf/audio/decode.py",
        "    if reached is not None and reached >= duration - max(_REACH_SLACK_S, 0.01 * duration):",
        "    if False:",
        f"{B}::test_every_genuine_file_passes_the_seek_that_checks_its_end",
    ),
    _m(
        "audio files: regular clips counted without the float tolerance (0.7 s: a clip short)",
        "streambuf/audio/samplers.py",
        "        return math.floor((hi - lo) / self.seconds_between_clip_starts + 1e-9) + 1",
        "        return math.floor((hi - lo) / self.seconds_between_clip_starts) + 1",
        f"{R}::test_regular_clips_are_where_decimal_arithmetic_puts_them",
    ),
    _m(
        "audio files: decode_member ignores the epoch (every epoch the same clips)",
        "streambuf/audio/source.py",
        "                epoch=self._epoch.value,",
        "                epoch=0,",
        f"{R}::test_decode_member_at_two_epochs_draws_different_clips",
    ),
    _m(
        "audio: a video's clips past the end of its audio not flagged missing",
        "streambuf/video/audio.py",
        "out[c].missing = stop > end + _UNCOVERED_S or start < t0 - _UNCOVERED_S",
        "out[c].missing = start < t0 - _UNCOVERED_S",
        f"{V}::test_clips_outside_the_audio_are_flagged_missing_and_counted",
    ),
    _m(
        "audio: clips whose audio is missing not counted",
        "streambuf/video/decode.py",
        "                stats.audio_missing += 1",
        "                pass",
        f"{V}::test_clips_outside_the_audio_are_flagged_missing_and_counted",
    ),
    _m(
        "audio: a video of more than 8 audio channels decoded at its own count",
        "streambuf/video/audio.py",
        "    channels = spec.channels or min(stream.channels, MAX_CHANNELS)  # (more: down to 7.1)",
        "    channels = spec.channels or stream.channels",
        f"{V}::test_a_video_of_more_than_eight_channels",
    ),
    _m(
        "gpu decode: BT.2020 converted with BT.709's coefficients",
        "streambuf/video/gpu.py",
        '"2020": (0.2627, 0.0593)}',
        '"2020": (0.2126, 0.0722)}',
        f"{G}::test_bt2020_frames_convert_by_the_standards_coefficients",
    ),
    _m(
        "gpu decode: a BT.2020 frame (non-constant luminance) converted as BT.601",
        "streambuf/video/gpu.py",
        '_MATRIX_OF_COLORSPACE = {1: "709", 9: "2020", 10: "2020"}',
        '_MATRIX_OF_COLORSPACE = {1: "709", 10: "2020"}',
        f"{G}::test_bt2020_frames_convert_by_the_standards_coefficients",
    ),
    _m(
        "gpu decode: a resize that shrinks one side only is not antialiased",
        "streambuf/video/gpu.py",
        '    shrink = size["height"] < rgb.shape[0] or size["width"] < rgb.shape[1]',
        '    shrink = size["height"] < rgb.shape[0] and size["width"] < rgb.shape[1]',
        f"{G}::test_a_resize_that_shrinks_one_side_only_is_antialiased",
    ),
]
