"""VideoMux core: encode, probe, length modes, atomic writes, validation, real-clip decoding."""
from __future__ import annotations

import numpy as np
import pytest

from digital_human.media.mux import MuxError, MuxInterrupted, mux_video
from digital_human.media.probe import ProbeError, probe_media, read_video_audio, read_video_frames

SR = 16000


def _frames(n: int, h: int, w: int) -> np.ndarray:
    """Moving colour bars: every frame differs, so a dropped or repeated frame is detectable."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    out = np.empty((n, h, w, 3), np.float32)
    for i in range(n):
        out[i, ..., 0] = x / max(w - 1, 1)
        out[i, ..., 1] = y / max(h - 1, 1)
        out[i, ..., 2] = ((x + 7 * i) % 32) / 31.0
    return out


def _tone(seconds: float, sr: int = SR) -> np.ndarray:
    t = np.arange(int(round(seconds * sr))) / sr
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir())


def test_odd_size_with_two_seconds_of_audio(tmp_path):
    fps = 25.0
    frames = _frames(50, 131, 255)
    rep = mux_video(frames, _tone(2.0), SR, fps, tmp_path / "odd.mp4", crf=18)
    p = probe_media(rep.path)
    assert p.video_codec == "h264" and p.pix_fmt == "yuv420p" and p.audio_codec == "aac"
    assert (p.width, p.height) == (256, 132) and p.width % 2 == 0 and p.height % 2 == 0
    assert rep.padding == "1 px right (edge), 1 px bottom (edge)"
    assert p.frame_count == 50 == rep.frames_written
    assert p.fps == pytest.approx(fps, rel=1e-6)
    assert abs(p.video_duration - p.audio_duration) <= 1 / fps
    assert _leftovers(tmp_path) == ["odd.mp4"]
    # faststart: the index ('moov') comes before the media data ('mdat').
    head = rep.path.read_bytes()[:4096]
    assert 0 <= head.find(b"moov") < (head.find(b"mdat") if b"mdat" in head else 4096)
    # pixels survive the RGB -> BT.709 YUV -> RGB round trip (tagged colour matrix, no shift)
    back, back_fps = read_video_frames(rep.path)
    assert back.shape == (50, 132, 256, 3) and back_fps == pytest.approx(fps)
    err = np.abs(back[:, :131, :255].astype(np.float32) - np.round(frames * 255))
    assert err.mean() < 4.0
    # edge padding repeats the last column instead of adding a black line
    assert np.abs(back[:, :131, 255].astype(int) - back[:, :131, 254].astype(int)).mean() < 6
    wave, sr = read_video_audio(rep.path)
    assert sr == SR and wave.shape[0] == 1 and abs(wave.shape[1] - 2 * SR) <= 1


@pytest.mark.parametrize(
    "mode, audio_s, frames_expected, action_words",
    [
        ("pad_audio", 1.68, 50, "audio padded with 0.320 s of silence"),
        ("pad_audio", 2.5, 50, "audio trimmed by 0.500 s"),
        ("hold_last_frame", 2.5, 63, "last frame held for 13 extra frames"),
        ("hold_last_frame", 1.5, 38, "video trimmed by 12 frames"),
        ("trim", 1.5, 37, "video trimmed by 13 frames"),
        ("trim", 2.5, 50, "audio trimmed by 0.500 s"),
    ],
)
def test_length_modes(tmp_path, mode, audio_s, frames_expected, action_words):
    fps = 25.0
    rep = mux_video(_frames(50, 64, 96), _tone(audio_s), SR, fps, tmp_path / "m.mp4",
                    length_mode=mode, preset="ultrafast")
    p = rep.probe
    assert p.frame_count == frames_expected == rep.frames_written
    assert action_words in rep.action
    assert abs(p.video_duration - p.audio_duration) <= 1 / fps
    assert abs(p.video_duration - frames_expected / fps) < 1e-6


def test_hold_last_frame_repeats_the_last_picture(tmp_path):
    frames = (_frames(10, 32, 32) * 255).astype(np.uint8)
    rep = mux_video(frames, _tone(0.8), SR, 25.0, tmp_path / "h.mp4", length_mode="hold_last_frame", crf=0)
    back, _ = read_video_frames(rep.path)
    assert len(back) == 20
    held = back[10:].astype(int)
    assert np.abs(held - back[9].astype(int)).max() <= 2  # repeats of frame 9
    assert np.abs(back[9].astype(int) - back[8].astype(int)).mean() > 10  # frames really differ


def test_stretch_none_reports_mismatch_and_keeps_lengths(tmp_path):
    rep = mux_video(_frames(25, 32, 32), _tone(1.5), SR, 25.0, tmp_path / "s.mp4", length_mode="stretch_none")
    assert rep.probe.frame_count == 25
    assert rep.probe.audio_duration == pytest.approx(1.5, abs=0.01)
    assert "nothing changed" in rep.action and "+0.500 s" in rep.action


def test_ntsc_rate_and_no_audio(tmp_path):
    rep = mux_video(_frames(30, 48, 64), None, SR, 30000 / 1001, tmp_path / "v")
    assert rep.path.name == "v.mp4" and rep.fps_rational == "30000/1001"
    assert rep.probe.frame_count == 30 and not rep.probe.has_audio
    assert rep.probe.fps == pytest.approx(30000 / 1001, rel=1e-6)
    assert rep.action == "no audio: video only"


def test_mp4_is_tagged_bt709_matrix_primaries_and_transfer(tmp_path):
    rep = mux_video(_frames(5, 32, 48), None, SR, 25.0, tmp_path / "c.mp4", preset="ultrafast")
    header = probe_media(rep.path).header
    assert "yuv420p(tv, bt709, progressive)" in header, header  # not "bt709/unknown/unknown"


def test_webm_vp9_opus(tmp_path):
    fps = 25.0
    rep = mux_video(_frames(25, 63, 81), _tone(1.0, 24000), 24000, fps, tmp_path / "w.webm",
                    fmt="webm", preset="8")
    p = probe_media(rep.path)
    assert p.video_codec == "vp9" and p.audio_codec == "opus" and p.pix_fmt == "yuv420p"
    assert (p.width, p.height) == (82, 64) and p.frame_count == 25
    assert abs(p.video_duration - p.audio_duration) <= 1 / fps
    assert _leftovers(tmp_path) == ["w.webm"]


def test_stereo_comfy_layout_and_black_padding(tmp_path):
    wave = np.stack([_tone(1.0), -_tone(1.0)])[None]  # ComfyUI AUDIO waveform [1, 2, T]
    frames = np.ones((25, 31, 33, 3), np.float32)  # white, so black padding is visible
    rep = mux_video(frames, wave, SR, 25.0, tmp_path / "st.mp4", pad_mode="black", crf=10)
    assert rep.probe.channels == 2 and rep.padding == "1 px right (black), 1 px bottom (black)"
    back, _ = read_video_frames(rep.path)
    assert back[:, :31, :33].mean() > 240 and back[:, 31, 4:28].mean() < 60


def test_ffmpeg_failure_leaves_nothing(tmp_path):
    with pytest.raises(MuxError, match="profile") as exc:
        mux_video(_frames(10, 32, 32), _tone(0.4), SR, 25.0, tmp_path / "bad.mp4",
                  extra_args=["-profile:v", "no-such-profile"])
    assert "ffmpeg" in str(exc.value)
    assert _leftovers(tmp_path) == []


def test_interrupt_midway_leaves_nothing(tmp_path):
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    seen = []
    # 256x256 frames: 85 per 16 MB chunk, so 300 frames make 4 chunks and the stop fires in the middle
    with pytest.raises(MuxInterrupted, match="no file was written"):
        mux_video(np.zeros((300, 256, 256, 3), np.uint8), _tone(12.0), SR, 25.0, tmp_path / "i.mp4",
                  preset="ultrafast", should_stop=stop, progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] < 300 and seen[-1][1] == 300
    assert _leftovers(tmp_path) == []


def test_exception_from_progress_propagates_and_cleans_up(tmp_path):
    class Interrupted(Exception):
        pass

    def boom(done, total):
        raise Interrupted("user pressed cancel")

    with pytest.raises(Interrupted):
        mux_video(_frames(5, 32, 32), _tone(0.2), SR, 25.0, tmp_path / "p.mp4", progress=boom)
    assert _leftovers(tmp_path) == []


def test_existing_file_replaced_only_on_success(tmp_path):
    target = tmp_path / "keep.mp4"
    target.write_bytes(b"old")
    with pytest.raises(MuxError):
        mux_video(_frames(5, 32, 32), None, SR, 25.0, target, extra_args=["-profile:v", "nope"])
    assert target.read_bytes() == b"old"
    mux_video(_frames(5, 32, 32), None, SR, 25.0, target)
    assert probe_media(target).frame_count == 5


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(frames=np.zeros((0, 8, 8, 3), np.float32)), "empty"),
        (dict(frames=np.zeros((2, 8, 8), np.float32)), r"\[N, H, W, 3\]"),
        (dict(frames=np.full((2, 8, 8, 3), np.nan, np.float32)), "NaN"),
        (dict(frames=np.zeros((2, 8, 8, 3), np.int32)), "dtype"),
        (dict(fps=0.0), "fps"),
        (dict(fps=float("nan")), "fps"),
        (dict(audio=np.full(100, np.nan, np.float32)), "NaN"),
        (dict(audio=np.zeros((1000, 2), np.float32)), r"\[T, C\]"),
        (dict(audio=np.zeros(0, np.float32)), "empty"),
        (dict(sample_rate=0), "sample_rate"),
        (dict(fmt="avi"), "fmt"),
        (dict(crf=80), "crf"),
        (dict(length_mode="loop"), "length_mode"),
        (dict(out_name="x.webm"), "fmt is mp4"),
    ],
)
def test_input_validation(tmp_path, kwargs, match):
    args = dict(frames=np.zeros((2, 8, 8, 3), np.float32), audio=_tone(0.08), sample_rate=SR, fps=25.0)
    out_name = kwargs.pop("out_name", "v.mp4")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        mux_video(out_path=tmp_path / out_name, **args)
    assert _leftovers(tmp_path) == []


def test_probe_rejects_non_media(tmp_path):
    bad = tmp_path / "not_video.mp4"
    bad.write_bytes(b"hello world" * 100)
    with pytest.raises(ProbeError):
        probe_media(bad)
    with pytest.raises(FileNotFoundError):
        probe_media(tmp_path / "missing.mp4")


def test_read_real_clip(data_dir):
    path = data_dir / "video" / "talk_en_male_01a.mp4"
    info = probe_media(path)
    frames, fps = read_video_frames(path)
    assert frames.dtype == np.uint8 and frames.shape[1:] == (256, 256, 3)
    assert fps == pytest.approx(30.0, rel=1e-3)
    assert len(frames) == info.frame_count
    assert abs(len(frames) - info.video_duration * fps) <= 1
    assert abs(info.video_duration - info.audio_duration) < 0.1
    wave, sr = read_video_audio(path)
    assert sr == 16000 and abs(wave.shape[1] / sr - info.audio_duration) < 1e-3


def test_read_real_hevc_clip(data_dir):
    path = data_dir / "video" / "talk_xx_female_05_1080x1920_hevc.mp4"
    info = probe_media(path)
    assert info.video_codec == "hevc" and (info.width, info.height) == (1080, 1920)
    assert abs(info.frame_count - info.video_duration * info.fps) <= 1
    head, fps = read_video_frames(path, max_frames=8)
    assert head.shape == (8, 1920, 1080, 3) and fps == pytest.approx(25.0, rel=1e-3)
    # whole clip at reduced size: every frame decodes (count matches duration * fps)
    small, _ = read_video_frames(path, size=(108, 192))
    assert small.shape[1:] == (192, 108, 3)
    assert abs(len(small) - info.video_duration * fps) <= 1
    assert np.abs(small[0].astype(float).mean() - head[0].astype(float).mean()) < 10


def test_output_folder_that_cannot_exist(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(MuxError, match="output folder"):
        mux_video(_frames(3, 16, 16), None, SR, 25.0, blocker / "v.mp4")


def test_rotated_video_is_read_upright(tmp_path):
    import subprocess

    from digital_human.media.ffmpeg_tools import ffmpeg_exe

    frames = np.zeros((5, 32, 64, 3), np.float32)
    frames[:, :, :8, 0] = 1.0  # red stripe along the left edge
    src = mux_video(frames, None, SR, 25.0, tmp_path / "a.mp4").path
    rotated = tmp_path / "rot.mp4"
    subprocess.run([ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-display_rotation", "90",
                    "-i", str(src), "-c", "copy", str(rotated)], check=True)
    info = probe_media(rotated)
    assert info.rotation in (90, 270) and (info.width, info.height) == (32, 64)
    back, _ = read_video_frames(rotated)
    assert back.shape == (5, 64, 32, 3)
    red_rows = back[0, :, :, 0].mean(axis=1)
    assert abs(red_rows[0] - red_rows[-1]) > 200  # the stripe now runs along the top or bottom


def test_ffmpeg_override_is_used_without_imageio_ffmpeg(tmp_path, monkeypatch):
    """IMAGEIO_FFMPEG_EXE wins (a machine with its own ffmpeg needs no imageio-ffmpeg); a bad path
    gives an error that names the variable."""
    import sys

    from digital_human.media import ffmpeg_tools

    exe = tmp_path / "my-ffmpeg"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(exe))
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import fails as if not installed
    ffmpeg_tools.ffmpeg_exe.cache_clear()
    try:
        assert ffmpeg_tools.ffmpeg_exe() == str(exe)
        monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(tmp_path / "missing"))
        ffmpeg_tools.ffmpeg_exe.cache_clear()
        with pytest.raises(ffmpeg_tools.FFmpegMissingError, match="IMAGEIO_FFMPEG_EXE"):
            ffmpeg_tools.ffmpeg_exe()
    finally:
        ffmpeg_tools.ffmpeg_exe.cache_clear()


def test_float_wav_writer_round_trips_through_soundfile(tmp_path):
    sf = pytest.importorskip("soundfile")
    from digital_human.media.wav_float import write_float_wav

    wave = np.random.default_rng(0).uniform(-1, 1, (2, 4801)).astype(np.float32)
    write_float_wav(tmp_path / "x.wav", wave, 48000)
    back, sr = sf.read(str(tmp_path / "x.wav"), dtype="float32", always_2d=True)
    info = sf.info(str(tmp_path / "x.wav"))
    assert sr == 48000 and info.subtype == "FLOAT" and back.shape == (4801, 2)
    assert np.array_equal(back.T, wave)
    with pytest.raises(ValueError, match="wave must be"):
        write_float_wav(tmp_path / "y.wav", np.zeros((1, 2, 3)), 48000)


@pytest.mark.parametrize("banner, expected", [
    ("ffmpeg version 4.2.2-static https://johnvansickle.com/ffmpeg/", ["-vsync", "passthrough"]),  # imageio-ffmpeg 0.5.1
    ("ffmpeg version 5.0.1 Copyright (c) 2000-2022", ["-vsync", "passthrough"]),
    ("ffmpeg version 5.1 Copyright (c) 2000-2022", ["-fps_mode", "passthrough"]),
    ("ffmpeg version n9.0.2-17-g2a571b6068-20260930 Copyright", ["-fps_mode", "passthrough"]),  # imageio-ffmpeg 0.8
    ("ffmpeg version N-112345-gabcdef Copyright", ["-fps_mode", "passthrough"]),  # git snapshot: newest
])
def test_passthrough_option_follows_the_ffmpeg_version(tmp_path, monkeypatch, banner, expected):
    """ffmpeg 4.x (imageio-ffmpeg 0.5.1) knows only -vsync, ffmpeg 8+ only -fps_mode: every video read
    failed on the older wheel before the option followed the binary's version."""
    from digital_human.media import ffmpeg_tools

    exe = tmp_path / "ffmpeg"
    exe.write_text(f"#!/bin/sh\necho '{banner}'\n")
    exe.chmod(0o755)
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(exe))
    ffmpeg_tools.ffmpeg_exe.cache_clear()
    try:
        assert ffmpeg_tools.passthrough_args() == expected
    finally:
        ffmpeg_tools.ffmpeg_exe.cache_clear()
