"""media.frame_source: frames decoded on demand equal a full decode, in any order, with a small cache."""
from __future__ import annotations

import numpy as np
import pytest

from digital_human.media.frame_source import VideoFrames, capped_size, load_face_frames, load_photo
from digital_human.media.probe import read_video_frames


def test_capped_size_keeps_aspect_and_small_inputs():
    assert capped_size(4000, 3000, 1920) == (1920, 1440)
    assert capped_size(1080, 1920, 1920) == (1080, 1920)
    assert capped_size(3511, 3511, 1920) == (1920, 1920)
    assert capped_size(512, 512, 0) == (512, 512)


@pytest.mark.parametrize("max_side", [None, 128])
def test_random_access_equals_full_decode(data_dir, max_side):
    path = data_dir / "video" / "talk_en_male_01a.mp4"
    size = None if max_side is None else (128, 128)
    expected, fps = read_video_frames(path, max_frames=90, size=size)
    frames = VideoFrames(path, max_frames=90, max_side=max_side, cache_bytes=12 * 256 * 256 * 3)
    assert len(frames) == 90 and frames.shape == expected.shape and frames.fps == pytest.approx(fps)
    for t in range(0, 90):
        np.testing.assert_array_equal(frames[t], expected[t], err_msg=f"frame {t}")
    before = frames.decoded
    for t in range(88, 40, -1):  # a ping-pong schedule going back
        np.testing.assert_array_equal(frames[t], expected[t], err_msg=f"frame {t}")
    # backward runs are decoded as runs of frames (one seek each), not one seek per frame
    assert frames.decoded - before <= 48 * 1.5
    for t in (3, 70, 12, 89, 0):  # jumps
        np.testing.assert_array_equal(frames[t], expected[t], err_msg=f"frame {t}")
    np.testing.assert_array_equal(frames[[5, 1, 60]], expected[[5, 1, 60]])
    np.testing.assert_array_equal(frames[10:14, 20:40, 5:9], expected[10:14, 20:40, 5:9])
    frames.close()


def test_photo_is_capped_on_its_longest_side(tmp_path, data_dir):
    from PIL import Image

    big = tmp_path / "big.jpg"
    Image.open(data_dir / "image" / "face_02_male.png").convert("RGB").resize((2400, 1800)).save(big)
    assert load_photo(big, 1920).shape == (1, 1440, 1920, 3)
    assert load_photo(big, 0).shape == (1, 1800, 2400, 3)
    frames, fps, source = load_face_frames(big, 60, 1000)
    assert frames.shape == (1, 750, 1000, 3) and fps == 25.0 and source == (2400, 1800)


def test_readers_apart_keep_their_own_decoders(data_dir, monkeypatch):
    """Three forward readers further apart than the cache holds (the renderer's model, paste and
    composition passes) each keep a decoder moving forward: every frame decoded at most once per reader,
    three decoder starts, frames equal to a full decode. With one decoder they thrash (a restart, with an
    accurate seek, whenever the reader changes)."""
    from digital_human.media import frame_source

    path = data_dir / "video" / "talk_en_male_01a.mp4"
    expected, _ = read_video_frames(path, max_frames=90)
    monkeypatch.setattr(frame_source, "KEPT_FRAMES_BYTES", 0)  # decoders measured here, not frames kept
    starts = []
    start = frame_source.VideoFrames._start

    def counted(self, t):
        starts.append(t)
        return start(self, t)

    monkeypatch.setattr(frame_source.VideoFrames, "_start", counted)

    def read(frames):
        for t in range(90 + 40):  # readers 0, 20 and 40 frames behind the first, interleaved
            for lag in (0, 20, 40):
                if 0 <= t - lag < 90:
                    np.testing.assert_array_equal(frames[t - lag], expected[t - lag], err_msg=f"frame {t - lag}")

    frames = VideoFrames(path, max_frames=90, cache_bytes=8 * 256 * 256 * 3)
    read(frames)
    assert frames.decoded <= 3 * 90 and len(starts) == 3
    frames.close()
    monkeypatch.setattr(frame_source, "MAX_DECODERS", 1)
    starts.clear()
    frames = VideoFrames(path, max_frames=90, cache_bytes=8 * 256 * 256 * 3)
    read(frames)
    assert len(starts) > 20
    frames.close()


def test_a_video_shorter_than_its_header_repeats_its_last_frame(data_dir):
    """When the decoder ends before the frame count the container promised, the last frame is repeated
    (the read re-enters frame() under the lock: it must not deadlock)."""
    import threading

    path = data_dir / "video" / "talk_en_male_01a.mp4"
    frames = VideoFrames(path)
    total = len(frames)
    last = np.array(frames[total - 1])
    frames.close()
    frames = VideoFrames(path)
    frames._count = total + 5  # as a header that counts frames the stream does not hold
    out = {}
    frames[total - 10]  # the decoder now reads on from here, as a tracker's sequential pass does

    reader = threading.Thread(target=lambda: out.update(frame=np.array(frames[total + 3])), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive(), "frame() deadlocked on a video shorter than its header"
    assert len(frames) == total
    np.testing.assert_array_equal(out["frame"], last)
    frames.close()


def test_decoded_frames_are_kept_between_objects_under_a_byte_cap(data_dir, tmp_path, monkeypatch):
    """A second VideoFrames of the same file (a repeat request) decodes nothing and gives the same frames; a file
    with other bytes under the same path is a miss; the kept bytes never pass KEPT_FRAMES_BYTES."""
    import shutil

    from digital_human.media import frame_source

    frame_source.clear_kept_frames()
    src = tmp_path / "v.mp4"
    shutil.copyfile(data_dir / "video" / "talk_en_male_01a.mp4", src)
    expected, _ = read_video_frames(src, max_frames=30)
    first = VideoFrames(src, max_frames=30)
    np.testing.assert_array_equal(first[:], expected)
    first.close()
    second = VideoFrames(src, max_frames=30)
    np.testing.assert_array_equal(second[:], expected)
    assert second.decoded == 0 and frame_source.kept_frames_bytes() == expected.nbytes
    second.close()
    # the same path, other bytes: decoded again, its own frames
    shutil.copyfile(data_dir / "video" / "talk_en_male_01b.mp4", src)
    other_expected, _ = read_video_frames(src, max_frames=10)
    other = VideoFrames(src, max_frames=10)
    np.testing.assert_array_equal(other[:], other_expected)
    assert other.decoded == 10
    other.close()
    # a cap of 12 frames: the least recently used go first, never more than the cap held
    monkeypatch.setattr(frame_source, "KEPT_FRAMES_BYTES", 12 * expected[0].nbytes)
    frame_source.clear_kept_frames()
    third = VideoFrames(src, max_frames=30)
    third[:]
    assert frame_source.kept_frames_bytes() == 12 * expected[0].nbytes
    third.close()
    monkeypatch.setattr(frame_source, "KEPT_FRAMES_BYTES", 0)  # none kept
    frame_source.clear_kept_frames()
    fourth = VideoFrames(src, max_frames=5)
    fourth[:]
    assert frame_source.kept_frames_bytes() == 0
    fourth.close()
    frame_source.clear_kept_frames()


def test_frames_with_row_and_column_slices_copy_only_the_box(data_dir):
    """frames[index array, rows, cols] (the renderer's face box) equals the full decode's box, contiguous."""
    path = data_dir / "video" / "talk_en_male_01a.mp4"
    expected, _ = read_video_frames(path, max_frames=20)
    frames = VideoFrames(path, max_frames=20)
    idx = np.array([3, 1, 7, 7, 19])
    got = frames[idx, 40:200, 10:250]
    np.testing.assert_array_equal(got, expected[idx, 40:200, 10:250])
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(frames[2:9, 5:6], expected[2:9, 5:6])
    np.testing.assert_array_equal(frames[[0, 4]], expected[[0, 4]])
    frames.close()
