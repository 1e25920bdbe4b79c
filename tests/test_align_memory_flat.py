"""`align` of a long video decoded on demand keeps its peak memory flat in the length (issue 13): the
per-frame landmarks (5.6 KB a frame) live in a temporary file (vision.row_spool), so 10,000 frames
peak within a few MB of 300 frames, where the landmarks held in memory would add 54 MB. The face
models are replaced by a fixed answer on small flat frames (this measures the track's bookkeeping,
not the models or the decoder), so the test is cheap; a child process per length gives a clean peak.
The saved file holds every frame's landmarks all the same."""
from __future__ import annotations

import json
import subprocess
import sys

_CHILD = r'''
import json, resource, sys
import numpy as np
from digital_human.engines.face.detect import FaceBox
import digital_human.vision.track as track_module
from digital_human.vision.align import align_faces

n, out = int(sys.argv[1]), sys.argv[2]


class Frames:
    """n flat 96x96 frames read on demand (the interface of media.frame_source.VideoFrames)."""
    dtype = np.dtype(np.uint8)

    def __init__(self, n):
        self.n, self.img = n, np.full((96, 96, 3), 128, np.uint8)

    def __len__(self):
        return self.n

    @property
    def shape(self):
        return (self.n, 96, 96, 3)

    def frame(self, t):
        return self.img

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            return self.img
        idx = np.arange(self.n)[key] if isinstance(key, slice) else np.asarray(key).reshape(-1)
        return np.repeat(self.img[None], len(idx), axis=0)


rng = np.random.default_rng(0)
mesh = rng.uniform(32, 160, (468, 3)).astype(np.float32)  # a face of ~64 px in the 96-px frames
mesh[33, :2], mesh[263, :2] = (70, 80), (122, 80)


def face_landmarks(frame, box, run_mesh=None):  # the mesh's answer in image pixels, without sampling a crop
    return mesh / 2.0, 0.99


track_module.face_landmarks = face_landmarks  # what the tracker calls for every frame


def detector(frame):
    keypoints = np.zeros((6, 2), np.float32)
    keypoints[0], keypoints[1] = (38, 44), (58, 44)
    return [FaceBox(28.0, 28.0, 68.0, 68.0, 0.9, keypoints)]


track = align_faces(Frames(n), 25.0, crop_size=64, runners=(None, None), detector=detector)
track.save_npz(out, include_frames=False)
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                  "spooled": type(track.landmarks).__name__}))
'''


def _peak(tmp_path, n: int) -> dict:
    out = tmp_path / f"track_{n}.npz"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(n), str(out)], capture_output=True, text=True,
                          check=False, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "out": out}


def test_long_track_peak_is_flat_and_the_file_is_whole(tmp_path):
    import numpy as np

    short, long = _peak(tmp_path, 300), _peak(tmp_path, 10000)
    assert short["spooled"] == long["spooled"] == "RowSpool"
    growth = long["peak_mb"] - short["peak_mb"]
    assert growth < 20, f"peak grew {growth:.0f} MB from 300 to 10,000 frames (the landmarks alone: 54 MB)"
    with np.load(long["out"], allow_pickle=False) as z:
        assert z["landmarks"].shape == (10000, 468, 3) and z["landmarks"].dtype == np.float32
        assert not np.isnan(z["landmarks"]).any() and z["found"].all()
        assert z["crops"].shape == (10000, 64, 64, 3)
