"""DH_FACES: the aligned-face track that FaceAlign hands to TRT_TalkingHead and TrainAvatar.

Coordinate convention (shared with engines/face/detect.py): continuous pixel coordinates, pixel
(i, j) covers [j, j+1) x [i, i+1), so its centre is (j + 0.5, i + 0.5). Landmarks, boxes and the
2x3 affines all use it; `vision.align.warp_image` converts to OpenCV's centre-at-integer convention.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..atomic_file import atomic_path

NPZ_VERSION = 1


class NoFaceError(ValueError):
    """No usable face anywhere in the input."""


def invert_affines(affines: np.ndarray) -> np.ndarray:
    """Inverse of [..., 2, 3] affine maps (crop -> source for a source -> crop map)."""
    a = np.asarray(affines, np.float64)
    lin = a[..., :2]
    inv_lin = np.linalg.inv(lin)
    inv_t = -np.einsum("...ij,...j->...i", inv_lin, a[..., 2])
    return np.concatenate([inv_lin, inv_t[..., None]], axis=-1)


def apply_affines(points: np.ndarray, affines: np.ndarray) -> np.ndarray:
    """Map [..., K, 2] points through [..., 2, 3] affines (one affine per leading index)."""
    a = np.asarray(affines, np.float64)
    p = np.asarray(points, np.float64)
    return np.einsum("...ij,...kj->...ki", a[..., :2], p) + a[..., None, :, 2]


class CropLandmarks:
    """`FaceTrack.crop_landmarks()` computed one frame at a time, for the renderers that read a frame's
    crop landmarks on demand: a long video's whole array (with its float64 temporaries) would grow with
    the length. Same values as the whole array (same arithmetic per frame)."""

    def __init__(self, track: "FaceTrack") -> None:
        self._landmarks, self._affines = track.landmarks, track.affines

    def __len__(self) -> int:
        return len(self._landmarks)

    def __getitem__(self, r: int) -> np.ndarray:
        r = int(r)
        return apply_affines(self._landmarks[r][..., :2], self._affines[r]).astype(np.float32)


@dataclass
class FaceTrack:
    """One face followed through a photo (N = 1) or the frames of a video.

    frames: uint8 [N, H, W, 3] source frames; crops: uint8 [N, S, S, 3] aligned crops.
    found[t] is False where no face was accepted on frame t; such frames keep a transform and
    landmarks interpolated from their neighbours (counted in `interpolated_count`).
    boxes [N, 4] x0, y0, x1, y1 of the landmarks (source px); landmarks [N, 468, 3] float32 source px
    (z scaled like x; for frames decoded on demand a vision.row_spool.RowSpool: index it, e.g.
    landmarks[t] or landmarks[idx], rather than computing on it whole); affines [N, 2, 3] source -> crop; presence [N] mesh face-presence score.
    """

    frames: np.ndarray
    fps: float
    crop_size: int
    found: np.ndarray
    boxes: np.ndarray
    landmarks: np.ndarray
    affines: np.ndarray
    presence: np.ndarray
    crops: np.ndarray
    interpolated_count: int = 0
    warnings: list[str] = field(default_factory=list)
    face_index: int = 0
    expand: float = 0.35
    scene_cuts: list[int] = field(default_factory=list)
    max_faces_seen: int = 1

    def __post_init__(self) -> None:
        n = len(self.frames)
        for name in ("found", "boxes", "landmarks", "affines", "presence", "crops"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"FaceTrack.{name} has {len(getattr(self, name))} entries for {n} frames")

    def __len__(self) -> int:
        return len(self.frames)

    def subset(self, indices) -> "FaceTrack":
        """A track of frames `indices` only, in memory (previews, a few frames of a long video)."""
        idx = np.asarray(indices, np.int64)
        return FaceTrack(frames=np.asarray(self.frames[idx]), fps=self.fps, crop_size=self.crop_size,
                         found=self.found[idx], boxes=self.boxes[idx], landmarks=self.landmarks[idx],
                         affines=self.affines[idx], presence=self.presence[idx], crops=np.asarray(self.crops[idx]),
                         interpolated_count=int(np.count_nonzero(~self.found[idx])), warnings=list(self.warnings),
                         face_index=self.face_index, expand=self.expand, max_faces_seen=self.max_faces_seen)

    def crop_landmarks(self) -> np.ndarray:
        """[N, 468, 2] landmarks in crop pixels."""
        return apply_affines(self.landmarks[..., :2], self.affines).astype(np.float32)

    def inverse_affines(self) -> np.ndarray:
        """[N, 2, 3] crop -> source maps (what paste-back warps with)."""
        return invert_affines(self.affines)

    def summary(self) -> str:
        n = len(self)
        h, w = self.frames.shape[1:3]
        found = int(np.count_nonzero(self.found))
        kind = "photo" if n == 1 else f"{n} frames @ {self.fps:g} fps"
        size = np.median(self.boxes[self.found, 3] - self.boxes[self.found, 1]) if found else float("nan")
        lines = [f"{kind}, {w}x{h}: face found in {found}/{n} ({100.0 * found / max(n, 1):.1f}%), "
                 f"{self.interpolated_count} interpolated; crop {self.crop_size}px, expand {self.expand:g}, "
                 f"face_index {self.face_index}; face height ~{size:.0f}px; up to {self.max_faces_seen} face(s) seen"]
        if self.scene_cuts:
            lines.append(f"scene cuts at frames {self.scene_cuts}")
        lines += [f"warning: {w_}" for w_ in self.warnings]
        return "\n".join(lines)

    # --- persistence: plain arrays only, loadable with allow_pickle=False ----------------------
    def save_npz(self, path: str | Path, include_frames: bool = True) -> Path:
        path = Path(path)
        arrays = {
            "version": np.array(NPZ_VERSION), "fps": np.array(float(self.fps)),
            # asarray, not astype: no second copy of a long video's landmarks (~6 KB a frame) while saving
            "crop_size": np.array(int(self.crop_size)), "found": np.asarray(self.found, bool),
            "boxes": np.asarray(self.boxes, np.float32), "landmarks": _float32_rows(self.landmarks),
            "affines": np.asarray(self.affines, np.float64), "presence": np.asarray(self.presence, np.float32),
            "crops": self.crops, "interpolated_count": np.array(int(self.interpolated_count)),
            "warnings": np.array(self.warnings, dtype=str), "face_index": np.array(int(self.face_index)),
            "expand": np.array(float(self.expand)), "scene_cuts": np.array(self.scene_cuts, dtype=np.int64),
            "max_faces_seen": np.array(int(self.max_faces_seen)),
        }
        if include_frames:
            arrays["frames"] = self.frames
        final = path if path.suffix == ".npz" else path.with_name(path.name + ".npz")
        # through a temporary name: a crash never leaves a truncated track that looks valid
        with atomic_path(final) as partial, open(partial, "wb") as handle:
            if all(isinstance(a, np.ndarray) for a in arrays.values()):
                np.savez_compressed(handle, **arrays)
            else:  # frames/crops decoded on demand (a long video): written frame by frame
                _savez_streaming(handle, arrays)
        return final

    @classmethod
    def load_npz(cls, path: str | Path, frames: np.ndarray | None = None) -> "FaceTrack":
        """Load a saved track; `frames` must be given if it was saved without them."""
        with np.load(Path(path), allow_pickle=False) as z:
            z = _ScalarsOfOldFiles(z)
            if int(z["version"]) != NPZ_VERSION:
                raise ValueError(f"{path}: DH_FACES file version {int(z['version'])}, expected {NPZ_VERSION}; "
                                 "run FaceAlign again to regenerate it")
            if frames is None:
                if "frames" not in z:
                    raise ValueError(f"{path} was saved without its frames; pass frames=... to load_npz")
                frames = z["frames"]
            return cls(frames=frames, fps=float(z["fps"]), crop_size=int(z["crop_size"]), found=z["found"],
                       boxes=z["boxes"], landmarks=z["landmarks"], affines=z["affines"], presence=z["presence"],
                       crops=z["crops"], interpolated_count=int(z["interpolated_count"]),
                       warnings=[str(s) for s in z["warnings"]], face_index=int(z["face_index"]),
                       expand=float(z["expand"]), scene_cuts=[int(c) for c in z["scene_cuts"]],
                       max_faces_seen=int(z["max_faces_seen"]))


class _ScalarsOfOldFiles:
    """A loaded .npz whose one-value entries read as 0-d arrays: files of videos saved before the streaming
    writer kept scalars 0-d hold them as shape (1,), which int()/float() refuse; the arrays are the same."""
    _SCALARS = ("version", "fps", "crop_size", "interpolated_count", "face_index", "expand", "max_faces_seen")

    def __init__(self, z) -> None:
        self._z = z

    def __contains__(self, name: str) -> bool:
        return name in self._z

    def __getitem__(self, name: str) -> np.ndarray:
        value = self._z[name]
        return value.reshape(()) if name in self._SCALARS and value.shape == (1,) else value


def _float32_rows(values):
    """float32 landmarks to save: an ndarray as it is (asarray: no copy), a RowSpool (a long video's rows in
    a file) left as it is, written a row at a time by _savez_streaming."""
    if isinstance(values, np.ndarray) or not hasattr(values, "blocks"):
        return np.asarray(values, np.float32)
    if np.dtype(values.dtype) != np.float32:
        raise ValueError(f"landmarks rows must be float32, got {values.dtype}")
    return values


def _savez_streaming(handle, arrays: dict) -> None:
    """np.savez_compressed's file layout, writing array-likes (len, shape, dtype, [i]) one item at a
    time so an on-demand video's crops are never all in memory; np.load reads it as usual."""
    import zipfile

    with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
        for name, value in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                if isinstance(value, np.ndarray):
                    # not np.ascontiguousarray: it turns a 0-d scalar (version, fps, ...) into shape (1,), which
                    # load_npz's int()/float() refused; np.savez keeps shape ()
                    value = value if value.flags.c_contiguous else np.ascontiguousarray(value)
                    np.lib.format.write_array(member, value, allow_pickle=False)
                    continue
                header = {"descr": np.lib.format.dtype_to_descr(np.dtype(value.dtype)), "fortran_order": False,
                          "shape": tuple(int(d) for d in value.shape)}
                np.lib.format.write_array_header_2_0(member, header)
                for i in range(len(value)):
                    member.write(np.ascontiguousarray(value[i], dtype=value.dtype).tobytes())
