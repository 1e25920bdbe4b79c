"""vision.row_spool.RowSpool (a long video's landmarks in a temporary file) reads and writes like the
ndarray it replaces, and fill_gaps on it gives the same values as on an in-memory array."""
from __future__ import annotations

import numpy as np
import pytest
from digital_human.vision.row_spool import RowSpool, runs
from digital_human.vision.track import fill_gaps


def _spool_of(arr: np.ndarray) -> RowSpool:
    spool = RowSpool(len(arr), arr.shape[1:], arr.dtype, fill=np.nan)
    spool[:] = arr
    return spool


def test_reads_and_writes_like_an_ndarray():
    rng = np.random.default_rng(0)
    arr = rng.normal(size=(37, 5, 3)).astype(np.float32)
    spool = _spool_of(arr)
    assert spool.shape == arr.shape and len(spool) == 37 and spool.dtype == np.float32 and spool.ndim == 3
    assert spool.nbytes == arr.nbytes
    mask = rng.random(37) > 0.5
    for key in (0, -1, np.int64(12), slice(None), slice(3, 30, 4), slice(None, None, -1), [5, 2, 2, 30],
                np.array([], np.int64), mask, (slice(None), [0, 2]), (np.arange(4), slice(None), 1),
                (Ellipsis, slice(None, 2)), (7, 1)):
        got = spool[key]
        assert isinstance(got, np.ndarray) and np.array_equal(got, arr[key]), key
    assert np.array_equal(np.asarray(spool), arr)

    spool[3] = 1.5
    arr[3] = 1.5
    spool[[9, 4, 5, 6]] = arr[[1, 2, 3, 4]] * 2  # unordered rows, a consecutive run among them
    arr[[9, 4, 5, 6]] = arr[[1, 2, 3, 4]] * 2
    spool[20:24] = np.zeros((4, 5, 3))
    arr[20:24] = 0
    assert np.array_equal(np.asarray(spool), arr)
    with pytest.raises(IndexError):
        spool[37]
    with pytest.raises(IndexError):
        spool[0, 1] = 2.0  # rows are written whole

    twin = spool.copy()
    twin[0] = -1
    assert np.array_equal(np.asarray(spool), arr) and np.all(twin[0] == -1)
    assert [b for b in spool.blocks(16)] == [(0, 16), (16, 32), (32, 37)]
    spool.close()


def test_new_spool_is_filled():
    assert np.isnan(np.asarray(RowSpool(1000, (468, 3)))).all()
    assert not np.asarray(RowSpool(10, (2,), np.float64, fill=None)).any()


def test_runs():
    assert list(runs(np.array([1, 2, 3, 7, 9, 10, 4]))) == [(1, 4), (7, 8), (9, 11), (4, 5)]
    assert list(runs(np.array([], np.int64))) == []


@pytest.mark.parametrize("seed", range(6))
def test_fill_gaps_on_a_spool_equals_the_in_memory_fill(seed):
    rng = np.random.default_rng(seed)
    n = 120
    values = rng.normal(size=(n, 7, 3)).astype(np.float32) * 100
    found = rng.random(n) > 0.3
    found[:4] = False  # a leading gap
    found[-3:] = False  # a trailing gap
    found[50:62] = False  # a shot without any face (between cuts 50 and 62)
    found[rng.integers(0, n)] = True
    cuts = sorted({50, 62, int(rng.integers(5, 45)), int(rng.integers(70, 110))})
    values[~found] = np.nan
    expected = fill_gaps(values.copy(), found, cuts, in_place=True)
    spool = _spool_of(values)
    assert fill_gaps(spool, found, cuts, in_place=True) is spool
    assert np.array_equal(np.asarray(spool), expected)  # bit for bit, no NaN left
    assert not np.isnan(expected).any()


def test_a_video_decoded_on_demand_saves_the_arrays_an_in_memory_clip_saves(data_dir, face_runners, tmp_path):
    """The spooled track (frames decoded on demand) and the in-memory one (the code path before the spool,
    unchanged) of the same frames save identical arrays, and the file loads back."""
    from digital_human.media.frame_source import VideoFrames
    from digital_human.vision.align import align_faces
    from digital_human.vision.faces import FaceTrack

    frames = VideoFrames(data_dir / "video" / "talk_en_male_01a.mp4", max_frames=40)
    lazy = align_faces(frames, frames.fps, runners=face_runners)
    whole = align_faces(np.asarray(frames), frames.fps, runners=face_runners)
    assert isinstance(lazy.landmarks, RowSpool) and isinstance(whole.landmarks, np.ndarray)
    paths = [t.save_npz(tmp_path / f"{name}.npz", include_frames=False)
             for name, t in (("lazy", lazy), ("whole", whole))]
    with np.load(paths[0], allow_pickle=False) as a, np.load(paths[1], allow_pickle=False) as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
            assert np.array_equal(a[name], b[name]), name
    back = FaceTrack.load_npz(paths[0], frames=frames)
    assert np.array_equal(back.landmarks, np.asarray(lazy.landmarks))
    assert np.array_equal(lazy.subset([0, 39]).landmarks, whole.landmarks[[0, 39]])


def test_a_video_file_saved_with_one_element_scalars_still_loads(tmp_path):
    """Videos aligned before the streaming writer kept scalars 0-d hold version, fps, ... as shape (1,)."""
    from digital_human.vision.faces import NPZ_VERSION, FaceTrack

    n = 3
    arrays = {"version": np.array([NPZ_VERSION]), "fps": np.array([25.0]), "crop_size": np.array([64]),
              "found": np.ones(n, bool), "boxes": np.zeros((n, 4), np.float32),
              "landmarks": np.zeros((n, 468, 3), np.float32), "affines": np.zeros((n, 2, 3)),
              "presence": np.ones(n, np.float32), "crops": np.zeros((n, 64, 64, 3), np.uint8),
              "interpolated_count": np.array([0]), "warnings": np.array([], dtype=str), "face_index": np.array([0]),
              "expand": np.array([0.35]), "scene_cuts": np.array([], np.int64), "max_faces_seen": np.array([1])}
    np.savez(tmp_path / "old.npz", **arrays)
    track = FaceTrack.load_npz(tmp_path / "old.npz", frames=np.zeros((n, 8, 8, 3), np.uint8))
    assert track.fps == 25.0 and track.crop_size == 64 and track.expand == 0.35 and len(track) == n
