"""The tracker reads a lazily decoded video ahead on a thread (vision.track.ReadAhead): same track."""
from __future__ import annotations

import numpy as np

from digital_human.vision import track as track_mod
from digital_human.vision.align import align_faces


def test_read_ahead_gives_the_in_memory_track(data_dir, face_runners, monkeypatch):
    from digital_human.media.frame_source import load_face_frames

    frames, fps, _ = load_face_frames(data_dir / "video" / "talk_en_male_01a.mp4", 0.5)
    track_mod.clear_track_cache()  # an earlier test's track of the same clip would be served without reading
    made = []
    real = track_mod.ReadAhead
    monkeypatch.setattr(track_mod, "ReadAhead", lambda *a: made.append(real(*a)) or made[-1])
    lazy = align_faces(frames, fps, runners=face_runners)
    assert len(made) == 1 and made[0]._stop.is_set()  # used, and its thread stopped at the end
    eager = align_faces(frames[:], fps, runners=face_runners)
    assert len(made) == 1  # in-memory frames: no thread
    assert np.array_equal(lazy.landmarks, eager.landmarks) and np.array_equal(lazy.affines, eager.affines)


def test_read_ahead_failure_falls_back_to_direct_reads():
    class Frames:
        shape = (5, 4, 4, 3)

        def __init__(self):
            self.arr = np.arange(5 * 48, dtype=np.uint8).reshape(5, 4, 4, 3)

        def frame(self, t):
            if t == 2:
                raise OSError("decoder died")
            return self.arr[t]

        def __getitem__(self, t):
            return self.arr[t]

    frames = Frames()
    ahead = track_mod.ReadAhead(frames, 5)
    got = [ahead.get(t) for t in range(5)]
    ahead.close()
    assert all(np.array_equal(g, frames.arr[t]) for t, g in enumerate(got))
