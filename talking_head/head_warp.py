"""Idle motion as pixels: blinks and head pose applied to a photo's output frames by one smooth warp.

Why a warp of the finished frame (after the mouth is pasted): the mouth then moves with the head
for free, any model's crops work unchanged, and the warp runs at the frame's own resolution (no
detail lost to a crop round trip). Both output paths call `HeadMotion.apply` on uint8 frames: the node
path (driver.paste_generated) on the pasted frames, before a TemporalSmooth node; the headless video path
(render_video) on the finished frames, after pasting and smoothing exactly as without motion (the same box
and masks, none grown by the head's shift). The two orders differ by at most 2 levels on ~0.1% of pixels
at strength 0.5 (70 dB; tests/test_idle_motion.py).

Backward map of output pixel q (continuous px, source = the pasted reference frame):
  head:   q -> q + w(q) (T_i^-1(q) - q), T_i = roll / scale about a neck pivot + translation, w = 1
          on the head (an ellipse around the face oval, grown to take hair and ears) falling
          smoothly to 0 around it and at the frame's edges, so background and borders stay put;
  blink:  then, near each eye (in the eye's own frame: u along the corners, v down), the upper lid
          slides down over the eyeball to 85% of the lid gap and the lower lid up the rest; a strip of
          lid skin stretches to follow (the lash margin keeps its width), the eyeball itself is not
          moved (lids occlude it, as real lids do), and everything past the eye corners is untouched.
          The newly covered lid is then shaded towards the photo's under-eye skin colour with a thin
          lash line where the lids meet: stretched skin alone carries the brow's shadow and the
          lashes down as a dark smear that reads as an open eye.
The head weight is evaluated once per photo at every pixel of the region; a frame's head map is then one
[2, 5] x [5, pixels] product (the affine part of T_i^-1 times the weight); the lid field only inside the
eyes' boxes.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ..parallel import for_each_frame
from ..vision import align as _align
from ..vision.paste import FACE_OVAL
from .idle_motion import IdleMotion

STRIP_PIXELS = 1 << 20  # the warp maps and resamples at most this many region pixels a call (a 512-px head: one)

# MediaPipe face-mesh lids, corner to corner (checked on the sample photos: 159/145 and 386/374 are
# the upper / lower lid midpoints of the subject's right / left eye)
RIGHT_EYE = {"corners": (33, 133), "upper": (246, 161, 160, 159, 158, 157, 173),
             "lower": (7, 163, 144, 145, 153, 154, 155), "brow": (46, 53, 52, 65, 55)}
LEFT_EYE = {"corners": (263, 362), "upper": (466, 388, 387, 386, 385, 384, 398),
            "lower": (249, 390, 373, 374, 380, 381, 382), "brow": (276, 283, 282, 295, 285)}
EYE_R, EYE_L, FOREHEAD, CHIN = 33, 263, 10, 152

LID_MEET = 0.85        # where the lids meet, as a share of the open gap from the upper lid (it does most)
SKIN_ABOVE = 0.4       # lid skin that stretches, in lid gaps above the upper lid (capped below the brow)
SKIN_BELOW = 1.5       # ... below the lower lid
LASH = 0.2             # the upper lid's margin (lashes), in gaps: carried down as it is, not stretched,
                       # so a shut eye shows a thin dark line under smooth lid skin, as a real one does
CREASE = 1.0           # a shut lid's skin reaches this many lid gaps above the open upper lid
LASH_TONE = 0.7        # the shut lashes' line, blended towards the open lid's darkest colour
LID_TONE = 0.9        # how far the newly covered lid is blended towards the lid colour (the rest: texture)
# the mesh's lids sit a pixel or two inside the eye on small faces: this share of the gap next to each
# lid landmark is covered, not stretched, so no iris or white shows on a shut lid
UPPER_SKIP, LOWER_SKIP = 0.1, 0.35
HEAD_R1, HEAD_R2 = 1.25, 1.9  # weight 1 inside this many face-oval radii, 0 outside the second
NECK_PIVOT = 0.35      # roll / scale pivot below the chin, in face heights (forehead 10 -> chin 152)
EDGE_FADE = 0.04       # the weight reaches 0 this share of the frame's short side from its edges


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


@dataclass
class _Eye:
    origin: np.ndarray   # [2] frame px, the first corner
    ex: np.ndarray       # [2] unit, corner -> corner
    ey: np.ndarray       # [2] unit, down the face
    up_u: np.ndarray     # upper lid polyline (u sorted) ...
    up_v: np.ndarray
    lo_u: np.ndarray     # ... lower lid
    lo_v: np.ndarray
    above: float         # px of lid skin above the upper lid that stretches
    below: float         # ... below the lower lid
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 frame px the lid field can change
    to_brow: float = 1.0             # px from the upper lid up to the brow (nothing reaches it)
    # measured on the photo by measure_lid_colour: the shut lid's look
    gap_max: float = 1.0
    crease: float = 1.0
    lid_rgb: np.ndarray | None = None
    lash_rgb: np.ndarray | None = None

    @classmethod
    def measure(cls, p: np.ndarray, ids: dict, down: np.ndarray, height: int, width: int) -> "_Eye":
        a, b = p[ids["corners"][0]], p[ids["corners"][1]]
        ex = (b - a) / max(np.linalg.norm(b - a), 1e-6)
        ey = np.array([-ex[1], ex[0]])
        if ey @ down < 0:
            ey = -ey

        def uv(idx) -> tuple[np.ndarray, np.ndarray]:
            d = p[list(idx)] - a
            return d @ ex, d @ ey

        span = float(np.linalg.norm(b - a))
        up_u, up_v = uv(ids["upper"])
        lo_u, lo_v = uv(ids["lower"])
        # the corners close both curves: the gap is 0 there, so the field fades to nothing
        up_u, up_v = np.r_[0.0, up_u, span], np.r_[0.0, up_v, (b - a) @ ey]
        lo_u, lo_v = np.r_[0.0, lo_u, span], np.r_[0.0, lo_v, (b - a) @ ey]
        o1, o2 = np.argsort(up_u), np.argsort(lo_u)
        up_u, up_v, lo_u, lo_v = up_u[o1], up_v[o1], lo_u[o2], lo_v[o2]
        gap = float(np.max(np.interp(up_u, lo_u, lo_v) - up_v))
        brow_u, brow_v = uv(ids["brow"])
        ob = np.argsort(brow_u)
        to_brow = float(np.min(up_v[1:-1] - np.interp(up_u[1:-1], brow_u[ob], brow_v[ob])))
        above = max(1.0, min(SKIN_ABOVE * gap, 0.7 * to_brow))  # the brow itself never moves
        below = max(1.0, SKIN_BELOW * gap)
        corners = np.array([a, b, a - ey * (above + gap), b - ey * (above + gap), a + ey * (below + gap),
                            b + ey * (below + gap)])
        x0, y0 = np.floor(corners.min(0)).astype(int) - 2
        x1, y1 = np.ceil(corners.max(0)).astype(int) + 3
        return cls(a, ex, ey, up_u, up_v, lo_u, lo_v, above, below,
                   (max(x0, 0), max(y0, 0), min(x1, width), min(y1, height)), to_brow=max(to_brow, 1.0))

    def _lids(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        up = np.interp(u, self.up_u, self.up_v)
        lo = np.interp(u, self.lo_u, self.lo_v)
        inside = (u > self.up_u[0]) & (u < self.up_u[-1])
        gap = np.where(inside, np.maximum(lo - up, 0.0), 0.0)
        return up, lo, gap

    def source_v(self, u: np.ndarray, v: np.ndarray, closure: float) -> np.ndarray:
        """Backward lid map: the reference v shown at output (u, v) with the lids `closure` shut."""
        up, lo, gap = self._lids(u)
        up_out, lo_out = up + closure * LID_MEET * gap, lo - closure * (1 - LID_MEET) * gap
        top, bottom = up - self.above, lo + self.below
        # source of the upper lid, top to bottom: skin [top, margin), lash margin [margin, edge), then the
        # strip next to the landmark that ends up covered; the margin keeps its width, the skin stretches
        edge = up - closure * UPPER_SKIP * gap
        lash = closure * LASH * gap
        margin_out = up_out - lash
        skin_up = top + (v - top) * ((edge - lash - top) / np.maximum(margin_out - top, 1e-6))
        lash_up = v - up_out + edge
        skip = closure * LOWER_SKIP * gap
        skin_lo = lo + skip + (v - lo_out) * ((self.below - skip) / np.maximum(bottom - lo_out, 1e-6))
        out = np.where((v >= top) & (v < margin_out), skin_up, v)  # between the lids: the eyeball, unmoved
        out = np.where((v >= margin_out) & (v < up_out), lash_up, out)
        return np.where((v > lo_out) & (v <= bottom), skin_lo, out)

    def forward_v(self, u: np.ndarray, v: np.ndarray, closure: float) -> np.ndarray:
        """Where reference points (u, v) go with the lids `closure` shut (for the landmarks)."""
        up, lo, gap = self._lids(u)
        up_out, lo_out = up + closure * LID_MEET * gap, lo - closure * (1 - LID_MEET) * gap
        top, bottom = up - self.above, lo + self.below
        out = np.where((v >= top) & (v <= up) & (gap > 0), top + (v - top) * (up_out - top) / self.above, v)
        return np.where((v >= lo) & (v <= bottom) & (gap > 0), lo_out + (v - lo) * (bottom - lo_out) / self.below,
                        out)

    def to_uv(self, xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = xy - self.origin
        return d @ self.ex, d @ self.ey

    def measure_lid_colour(self, frame: np.ndarray) -> None:
        """The shut lid's colour: the skin just under the lower lid, middle of the eye. The skin over an
        open eye is often in the brow's shadow (stretching it alone leaves a dark hollow, which neither
        a viewer nor the face mesh reads as a shut eye); a shut lid faces the light like the cheek."""
        span = self.up_u[-1]
        gap = float(np.max(self._lids(self.up_u)[2]))
        u, v = np.meshgrid(np.linspace(0.25 * span, 0.75 * span, 9), np.linspace(0.5, 1.0, 4) * gap)
        _, lo, _ = self._lids(u)
        xy = self.origin + u[..., None] * self.ex + (lo + v)[..., None] * self.ey
        ij = np.clip(np.floor(xy).astype(int), 0, [frame.shape[1] - 1, frame.shape[0] - 1])
        self.lid_rgb = np.median(frame[ij[..., 1], ij[..., 0]].reshape(-1, 3).astype(np.float32), axis=0)
        self.gap_max = gap
        self.crease = min(CREASE * gap, 0.8 * self.to_brow)
        # the lashes' colour: the darkest pixels along the open upper lid
        uu = np.linspace(0.2 * span, 0.8 * span, 15)
        vv = np.interp(uu, self.up_u, self.up_v)[:, None] + np.linspace(-0.25, 0.05, 5)[None] * gap
        xy = self.origin + uu[:, None, None] * self.ex + vv[..., None] * self.ey
        ij = np.clip(np.floor(xy).astype(int), 0, [frame.shape[1] - 1, frame.shape[0] - 1])
        ring = frame[ij[..., 1], ij[..., 0]].reshape(-1, 3).astype(np.float32)
        self.lash_rgb = ring[np.argsort(ring.sum(1))[: max(1, len(ring) // 8)]].mean(0)

    def shade(self, pixels: np.ndarray, u: np.ndarray, v: np.ndarray, closure: float) -> None:
        """Blend the part of the eye the upper lid now covers (output (u, v) in the eye's reference
        frame) towards the lid's colour, keeping some of the warped skin's texture; in place, uint8."""
        up, _, gap = self._lids(u)
        margin_out = up + closure * (LID_MEET - LASH) * gap
        feather = max(1.0, 0.1 * self.gap_max)
        # rising smoothly from the crease (where a shut lid's skin starts) to full at the lid's old margin:
        # an edge anywhere above the lashes would read as an open eye's upper lid
        crease = up - self.crease
        alpha = (_smoothstep((v - crease) / np.maximum(up - crease, 1e-6)) * np.clip((margin_out - v) / feather, 0, 1)
                 * np.sqrt(gap / max(self.gap_max, 1e-6)) * LID_TONE * _smoothstep(np.asarray(closure) * 2))
        # the lashes meet in a thin dark line along the lid's margin
        width = max(0.8, 0.08 * self.gap_max)
        line = 1.0 - np.clip(np.abs(v - (up + closure * LID_MEET * gap - 0.5 * width)) / width, 0, 1)
        dark = (line * np.clip(gap / max(self.gap_max, 1e-6) * 3, 0, 1) * LASH_TONE * _smoothstep((closure - 0.5) * 2))
        if not np.any(alpha > 0):
            return
        a = alpha[..., None].astype(np.float32)
        d = dark[..., None].astype(np.float32)
        lid = pixels * (1 - a) + self.lid_rgb * a
        pixels[...] = np.clip(np.rint(lid * (1 - d) + self.lash_rgb * d), 0, 255).astype(np.uint8)


class HeadMotion:
    """Applies an IdleMotion to the output frames of one photo (landmarks [468, 3] source px)."""

    def __init__(self, landmarks: np.ndarray, frame: np.ndarray, motion: IdleMotion):
        p = np.asarray(landmarks, np.float64)[:, :2]
        self.motion, (self.height, self.width) = motion, frame.shape[:2]
        eye = p[EYE_L] - p[EYE_R]
        self.iod = float(np.linalg.norm(eye))
        self.ex = eye / max(self.iod, 1e-6)
        self.ey = np.array([-self.ex[1], self.ex[0]])
        if (p[CHIN] - p[FOREHEAD]) @ self.ey < 0:
            self.ey = -self.ey
        self.pivot = p[CHIN] + self.ey * NECK_PIVOT * float(np.linalg.norm(p[CHIN] - p[FOREHEAD]))
        oval = p[list(FACE_OVAL)]
        ou, ov = (oval - p[CHIN]) @ self.ex, (oval - p[CHIN]) @ self.ey
        self.centre = p[CHIN] + self.ex * (ou.min() + ou.max()) / 2 + self.ey * (ov.min() + ov.max()) / 2
        self.axes = np.array([max(np.ptp(ou) / 2, 1.0), max(np.ptp(ov) / 2, 1.0)])
        self.eyes = [_Eye.measure(p, ids, self.ey, self.height, self.width) for ids in (RIGHT_EYE, LEFT_EYE)]
        for e in self.eyes:
            e.measure_lid_colour(frame)
        self.region = self._region()
        rows, cols = self.region
        yy, xx = np.mgrid[rows, cols].astype(np.float64) + 0.5  # frame pixel centres
        weight = self.weight(np.stack([xx, yy], -1))
        self._changed = weight > 0
        for e in self.eyes:  # the lid field reaches past the head weight's support at a frame edge
            x0, y0, x1, y1 = e.box
            self._changed[max(y0 - rows.start, 0):max(y1 - rows.start, 0),
                          max(x0 - cols.start, 0):max(x1 - cols.start, 0)] = True
        # frame i's backward map in the region's pixel indices (what cv2.remap takes) is one small product
        # (`_region_maps`): index + w (T_i^-1 - I) [X, Y, 1] = index + coef_i [2, 3] . [w X, w Y, w], with the
        # weight w evaluated exactly per pixel once per photo. Where w = 0 the map is exactly the pixel's own
        # index (zero terms add nothing), which the bicubic remap returns bit for bit. The whole region is
        # mapped and resampled in one call each, not in bands of rows: every numpy/OpenCV call gives the
        # interpreter lock up and must win it back, and a live server's other threads (TTS, encoders) hold it
        # meanwhile; 16 bands were ~80 such hand-offs a frame (benchmarks/RESULTS_live.md, 2026-12-03 21:13). A region
        # over STRIP_PIXELS (a large photo's head) goes in strips of whole rows: bounded buffers per thread
        self._basis = np.ascontiguousarray(np.stack([weight * xx, weight * yy, weight]), np.float32)
        self._cols, self._rows = (np.arange(n, dtype=np.float32) for n in xx.shape[::-1])  # region indices
        strip = max(1, STRIP_PIXELS // max(1, xx.shape[1]))
        self._strips = [(r, min(r + strip, xx.shape[0])) for r in range(0, xx.shape[0], strip)]
        self._local = threading.local()  # per thread: the buffers a frame's warp writes (`_work`)

    def _work(self) -> dict[str, np.ndarray]:
        """This thread's buffers for one frame's warp, made once: fresh arrays every frame cost more (page
        faults, cache misses) than the arithmetic in them."""
        work = getattr(self._local, "work", None)
        if work is None:
            rows, cols = self.region
            h, w = rows.stop - rows.start, cols.stop - cols.start
            strip = max(r1 - r0 for r0, r1 in self._strips)
            work = self._local.work = {"src": np.empty((h, w, 3), np.float32),
                                       "maps": np.empty((2, strip, w), np.float32),
                                       "block": np.empty(3 * strip * w, np.float32)}
        return work

    # --- geometry ---------------------------------------------------------------------------------
    def weight(self, xy: np.ndarray) -> np.ndarray:
        """Head weight at frame points [..., 2]: 1 on the head, 0 on the background and frame edges."""
        d = xy - self.centre
        r = np.hypot((d @ self.ex) / self.axes[0], (d @ self.ey) / self.axes[1])
        edge = np.minimum.reduce([xy[..., 0], self.width - xy[..., 0], xy[..., 1], self.height - xy[..., 1]])
        fade = EDGE_FADE * min(self.height, self.width)
        return (1.0 - _smoothstep((r - HEAD_R1) / (HEAD_R2 - HEAD_R1))) * _smoothstep(edge / max(fade, 1.0))

    def _region(self) -> tuple[slice, slice]:
        """(rows, cols) of the frame box the motion can change (weight > 0, plus the eyes)."""
        t = np.linspace(0, 2 * np.pi, 73)
        ring = (self.centre + np.outer(np.cos(t) * self.axes[0] * HEAD_R2, self.ex)
                + np.outer(np.sin(t) * self.axes[1] * HEAD_R2, self.ey))
        pts = np.concatenate([ring, *[np.array([[e.box[0], e.box[1]], [e.box[2], e.box[3]]]) for e in self.eyes]])
        x0, y0 = (int(np.clip(np.floor(v) - 1, 0, lim)) for v, lim in zip(pts.min(0), (self.width, self.height)))
        x1, y1 = (int(np.clip(np.ceil(v) + 2, 0, lim)) for v, lim in zip(pts.max(0), (self.width, self.height)))
        return slice(y0, max(y1, y0)), slice(x0, max(x1, x0))

    def pose(self, i: int) -> np.ndarray:
        """Frame i's head transform T_i (2x3, reference frame px -> output frame px)."""
        m = self.motion
        c, s = np.cos(float(m.roll[i])), np.sin(float(m.roll[i]))
        lin = float(m.scale[i]) * np.array([[c, -s], [s, c]])
        shift = self.iod * (float(m.tx[i]) * self.ex + float(m.ty[i]) * self.ey)
        return np.concatenate([lin, (self.pivot - lin @ self.pivot + shift)[:, None]], axis=1)

    # --- pixels -----------------------------------------------------------------------------------
    def _coef(self, i: int) -> np.ndarray:
        """float32 [2, 3]: frame i's backward map = index + coef . [w X, w Y, w] (see __init__)."""
        inv = np.linalg.inv(np.vstack([self.pose(i), [0, 0, 1]]))[:2]
        return (inv - np.eye(2, 3)).astype(np.float32)

    def _region_maps(self, coef: np.ndarray, r0: int = 0, r1: int | None = None,
                     out: np.ndarray | None = None) -> np.ndarray:
        """float32 [2, r1 - r0, w]: the backward maps (region pixel indices; x, y) of the region's rows r0:r1 for
        `coef` (`_coef`), into `out` (a buffer of at least as many rows) when given. einsum's own loops, not BLAS:
        a threaded BLAS would spin threads for this thin product."""
        basis = self._basis[:, r0:r1]
        if out is not None:
            out = out[:, :basis.shape[1]]
        out = np.einsum("ij,jrc->irc", coef, basis, out=out, optimize=False)
        out[0] += self._cols  # + each pixel's own index: exact where the weight is 0
        out[1] += self._rows[r0:r1, None]
        return out

    def _maps(self, i: int) -> tuple[np.ndarray, np.ndarray, list]:
        """Backward maps of frame i over the whole region, in the region's pixel indices (float32 [h, w]: x,
        y; each pixel's own index where the head does not move it), and per eye (rows, cols, u, v): the region's
        pixels near the eye in the eye's reference frame (for the lid shading)."""
        rows, cols = self.region
        h, w = rows.stop - rows.start, cols.stop - cols.start
        xi, yi = np.arange(w, dtype=np.float32)[None], np.arange(h, dtype=np.float32)[:, None]
        mx, my = self._region_maps(self._coef(i))
        closure = float(self.motion.blink[i])
        near: list = []
        if closure > 0:
            origin = np.array([cols.start + 0.5, rows.start + 0.5])  # index -> continuous frame px
            pad = int(np.ceil(np.abs(mx - xi).max() + np.abs(my - yi).max())) + 2  # the head may move the eye
            for e in self.eyes:
                x0, y0, x1, y1 = e.box  # the lid field is zero outside the eye's box ...
                sy = slice(max(y0 - pad - rows.start, 0), max(min(y1 + pad - rows.start, h), 0))
                sx = slice(max(x0 - pad - cols.start, 0), max(min(x1 + pad - cols.start, w), 0))
                pts = np.stack([mx[sy, sx], my[sy, sx]], -1).astype(np.float64) + origin
                u, v = e.to_uv(pts)
                v2 = e.source_v(u, v, closure)
                moved = e.origin + u[..., None] * e.ex + v2[..., None] * e.ey - origin
                keep = self._changed[sy, sx]  # the padded slab may leave the region: exact indices there
                mx[sy, sx] = np.where(keep, moved[..., 0], xi[:, sx])
                my[sy, sx] = np.where(keep, moved[..., 1], yi[sy])
                near.append((sy, sx, u, v))
        return mx, my, near

    def apply(self, frames: np.ndarray, start: int, origin: tuple[int, int] = (0, 0)) -> np.ndarray:
        """Output frames start..start+k-1 from the pasted frames [k, bh, bw, 3] uint8 (a box of the frame
        whose top-left pixel is `origin` (x, y), holding `region`), warped in place and returned. Only
        pixels inside the region change; a frame whose motion is zero is not touched."""
        rows, cols = self.region
        r0, c0 = rows.start - int(origin[1]), cols.start - int(origin[0])
        h, w = rows.stop - rows.start, cols.stop - cols.start
        if r0 < 0 or c0 < 0 or r0 + h > frames.shape[1] or c0 + w > frames.shape[2]:
            raise ValueError(f"the frames' box (origin {origin}, {frames.shape[1:3]}) does not hold the head "
                             f"region rows {rows.start}:{rows.stop}, cols {cols.start}:{cols.stop}")
        if frames.dtype != np.uint8:
            raise ValueError(f"frames must be uint8, got {frames.dtype}")

        def one(j: int) -> None:  # writes only frame j (OpenCV and numpy release the GIL: frames overlap)
            i = start + j
            if self.motion.still(i):
                return
            # the source is exactly the region in both paths (the same pixels, the same replicate border);
            # the warp writes the region of frames[j] in place, from this copy
            box = frames[j, r0:r0 + h, c0:c0 + w]
            work = self._work()
            np.copyto(work["src"], box)
            closure = float(self.motion.blink[i])
            if closure > 0:  # a blink: the lids' field in the maps
                mx, my, near = self._maps(i)
                for a, b in self._strips:
                    _remap_into(box[a:b], work["src"], mx[a:b], my[a:b], work)
            else:
                coef, near = self._coef(i), []
                for a, b in self._strips:
                    map_x, map_y = self._region_maps(coef, a, b, work["maps"])
                    _remap_into(box[a:b], work["src"], map_x, map_y, work)
            for e, (sy, sx, u, v) in zip(self.eyes, near):
                e.shade(box[sy, sx], u, v, closure)

        for_each_frame(one, 0, len(frames))
        return frames

    def move_landmarks(self, landmarks: np.ndarray, start: int) -> np.ndarray:
        """Output landmarks [k, 468, 3] (source px) of frames start..: the lids and the head moved."""
        out = np.array(landmarks, np.float32, copy=True)
        for j in range(len(out)):
            i = start + j
            if self.motion.still(i):
                continue
            p = out[j, :, :2].astype(np.float64)
            closure = float(self.motion.blink[i])
            if closure > 0:
                for e in self.eyes:
                    u, v = e.to_uv(p)
                    p = e.origin + u[:, None] * e.ex + e.forward_v(u, v, closure)[:, None] * e.ey
            t = self.pose(i)
            w = self.weight(p)[:, None]
            p = p + w * (p @ t[:, :2].T + t[:, 2] - p)
            out[j, :, :2] = p
        return out


def _remap_into(dst: np.ndarray, srcf: np.ndarray, map_x: np.ndarray, map_y: np.ndarray,
                work: dict | None = None) -> None:
    """dst [r, c, 3] uint8 (a view, written in place) = srcf [h, w, 3] (a float32 copy of the pixels)
    sampled at (map_x, map_y) [r, c] (OpenCV pixel indices into srcf, replicated border), bicubic, rounded.
    Bicubic, not bilinear: a bilinear resample at a fraction of a pixel visibly softens the whole head, and
    by a different amount every frame. Float32 pixels: OpenCV's bicubic remap is vectorised there (uint8
    is not; ~1.5x), and rounding back gives the uint8 remap's values. Float maps, not OpenCV's fixed point
    (cv2.convertMaps): with OpenCV 5.0 on this pack's CPUs the fixed-point float32 remap is no faster
    (2.5-3.3 ms a 512-px head either way, measured interleaved) and rounds positions to 1/32 px.
    `work` (HeadMotion._work): a flat buffer for the float block."""
    r, c = map_x.shape
    if _align._cv2 is not None:
        cv2 = _align._cv2
        block = None if work is None else work["block"][:3 * r * c].reshape(r, c, 3)
        block = cv2.remap(srcf, map_x, map_y, cv2.INTER_CUBIC, dst=block, borderMode=cv2.BORDER_REPLICATE)
        cv2.add(block, 0.0, dst=dst, dtype=cv2.CV_8U)  # rounded to nearest (as np.rint), saturated
        return
    h, w = srcf.shape[:2]  # bilinear without OpenCV (only where it is missing)
    x0, y0 = np.floor(map_x).astype(np.int64), np.floor(map_y).astype(np.int64)
    fx, fy = (map_x - x0)[..., None], (map_y - y0)[..., None]
    acc = np.zeros((r, c, srcf.shape[2]), np.float32)
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            acc += wx * wy * srcf[np.clip(y0 + dy, 0, h - 1), np.clip(x0 + dx, 0, w - 1)]
    dst[...] = np.clip(np.rint(acc), 0, 255).astype(np.uint8)


def attach_idle_motion(gen, wave: np.ndarray, sample_rate: int, seed: int = 0):
    """`gen` (GeneratedCrops of a photo) with idle motion: the frames are warped after the paste (and, on the
    headless path, after the smoothing); the output track's landmarks are moved to match (output_track).
    A video reference is returned as it is (it has its own motion)."""
    from dataclasses import replace

    from .idle_motion import idle_motion

    track = gen.track
    if len(track) != 1 or len(gen) == 0:
        return gen
    head = HeadMotion(track.landmarks[0], track.frames[0], idle_motion(wave, sample_rate, gen.fps, len(gen), seed))
    return replace(gen, motion=head, backend=gen.backend + "; idle motion")
