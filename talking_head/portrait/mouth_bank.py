"""The person's own mouths for `portrait` on a video reference (a mouth bank, after Video Rewrite).

portrait re-poses the reference mouth with a smooth warp and draws the interior between the lips
(mouth_render.py); on a real face the drawn cavity and teeth band look worse than the person's own.
A talking video already holds that person's real teeth and mouth shapes, so:

  * build_bank: up to MAX_BANK_FRAMES frames of a talking video (the reference itself, or another
    video of the same person), evenly subsampled, each stored as a small lower-face patch in a
    canonical mouth frame (eye line horizontal, unit = inter-ocular distance "iod") with its lip
    landmarks, mouth-shape features (inner-lip gap, outer height, widths, lip thicknesses) and its lips'
    colour. Capped in frames and patch pixels, so its memory does not grow with the video.
  * select_frames: per output frame, the bank frame whose shape is nearest the driven target shape,
    with a temporal cost (Viterbi over each frame's nearest candidates): consecutive bank frames are
    free, holding one is cheap, a jump costs - so the mouth does not flicker between near ties.
  * blend_mouth (REGION "interior", the default): the frame's own lips (portrait's warp of them) are
    bent SHAPE_FOLLOW of the way from the driven shape to the chosen bank frame's real lip shape
    (reshape_lips), and the mouth opening between them - teeth, tongue, cavity - is the bank frame's,
    warped piecewise-affinely onto the inner lip contours, colour-matched through the two frames' lips
    and feathered in. On the held-out clip this beats replacing the lips too (REGION "lips"): the
    frame's own lips carry its light and texture, the bank only what portrait would have to draw.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ...vision import align as _align

log = logging.getLogger("digital_human")

# MediaPipe mesh lip contours, subject's right corner first (11 points each, corners shared)
OUTER_UPPER = (61, 185, 40, 39, 37, 0, 267, 269, 270, 409, 291)
OUTER_LOWER = (61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291)
INNER_UPPER = (78, 191, 80, 81, 82, 13, 312, 311, 310, 415, 308)
INNER_LOWER = (78, 95, 88, 178, 87, 14, 317, 402, 318, 324, 308)
CONTOURS = (OUTER_UPPER, INNER_UPPER, INNER_LOWER, OUTER_LOWER)
LIP_POINTS = np.array(sorted(set(sum(CONTOURS, ()))), np.int64)  # the 40 lip points a bank frame keeps
GAP_PAIRS = ((81, 178), (82, 87), (13, 14), (312, 317), (311, 402))  # as vision/lipsync_metrics
EYE_R, EYE_L = 33, 263

MAX_BANK_FRAMES = 400  # frames kept, subsampled evenly from a longer video
MAX_PX_PER_IOD = 160   # patch resolution cap: a 512 px crop's mouth is stored at most this sharp
MIN_PX_PER_IOD = 48
OVERSAMPLE = 1.0       # patch px per crop px: above 1 a patch is warped again with less blur
SPAN_U = (-0.62, 0.62)  # patch extent in iod around the mouth corners' midpoint, along the eye line
SPAN_V = (-0.42, 0.60)  # ... and down the face (nose base ~ -0.33, lower lip of an open mouth ~ +0.35)
MIN_BANK_FRAMES = 12    # fewer usable frames than this: no bank (too few shapes to choose from)

RING = 0.14       # iod: the warp's outer ring around the lips (skin carried along with them)
# what the bank replaces: "interior" = the mouth opening (teeth, tongue, cavity) between the driven inner
# lips, the frame's own lips (portrait's warp of them) kept; "lips" = the lips too, out to the outer contours
REGION = "interior"
MASK_OUT = 0.03   # iod: the "lips" blend mask's full-weight edge, outside the outer lip contours
FEATHER = 0.025   # iod: Gaussian feather sigma of the "lips" blend mask
MASK_IN = 0.012   # iod: the "interior" mask reaches this far past the inner lip contours (onto the lip edge)
FEATHER_IN = 0.01  # iod: its feather
# how far the bank lips are bent onto the driven lip shape: 0 = the bank frame's own lip shape, moved
# and scaled as a whole (a similarity fit) onto the driven lips; 1 = exactly the driven contours
SHAPE_FOLLOW = 0.3
STD_RATIO = (0.85, 1.18)  # colour match: contrast ratio kept in this range (lips keep their contrast)

# shape features and their weights in the match (after scaling each by the bank's spread)
FEATURES = ("gap", "height", "width", "inner_width", "upper", "lower")
WEIGHTS = np.array([1.0, 0.6, 0.7, 0.35, 0.3, 0.3])
CANDIDATES = 24    # Viterbi over each frame's nearest bank frames
HOLD_COST = 0.25   # showing the same bank frame again
JUMP_COST = 0.9    # a cut to a non-consecutive bank frame (plus how different the two shapes are)
JUMP_SHAPE = 0.35


@dataclass
class MouthFrame:
    """Canonical mouth frame of one face: origin between the outer mouth corners, ex along the eye
    line, ey down the face, iod = outer eye corners' distance (all in the landmarks' pixels)."""
    origin: np.ndarray
    ex: np.ndarray
    ey: np.ndarray
    iod: float


def mouth_frame(lms: np.ndarray) -> MouthFrame:
    p = np.asarray(lms, np.float64)[:, :2]
    eye = p[EYE_L] - p[EYE_R]
    iod = float(np.linalg.norm(eye))
    ex = eye / max(iod, 1e-6)
    ey = np.array([-ex[1], ex[0]])
    if (p[17] - p[0]) @ ey < 0:  # down = from the upper lip's top towards the lower lip's bottom
        ey = -ey
    return MouthFrame(origin=(p[61] + p[291]) / 2, ex=ex, ey=ey, iod=max(iod, 1e-6))


def shape_features(lms: np.ndarray) -> np.ndarray:
    """float32 [..., 6] mouth shape (FEATURES) of landmarks [..., 468, 2+] in any pixels: inner-lip
    gap, outer lip height, outer and inner width, upper and lower lip thickness, all / iod."""
    p = np.asarray(lms, np.float64)[..., :2]
    iod = np.maximum(np.linalg.norm(p[..., EYE_L, :] - p[..., EYE_R, :], axis=-1), 1e-6)
    ex = (p[..., EYE_L, :] - p[..., EYE_R, :]) / iod[..., None]
    ey = np.stack([-ex[..., 1], ex[..., 0]], -1)

    def down(a: int, b: int) -> np.ndarray:  # signed distance along ey from point a to point b
        return np.abs(((p[..., b, :] - p[..., a, :]) * ey).sum(-1))

    up = p[..., [a for a, _ in GAP_PAIRS], :]
    lo = p[..., [b for _, b in GAP_PAIRS], :]
    gap = np.linalg.norm(lo - up, axis=-1).mean(-1)
    width = np.linalg.norm(p[..., 291, :] - p[..., 61, :], axis=-1)
    inner = np.linalg.norm(p[..., 308, :] - p[..., 78, :], axis=-1)
    out = np.stack([gap, down(0, 17), width, inner, down(0, 13), down(14, 17)], -1) / iod[..., None]
    return out.astype(np.float32)


@dataclass
class MouthBank:
    """Mouth patches of a talking video. patches uint8 [K, H, W, 3] in the canonical mouth frame at
    `scale` px per iod (patch px (x, y) = ((u - SPAN_U[0]) x scale, (v - SPAN_V[0]) x scale));
    points float32 [K, 468, 2]: the lip points LIP_POINTS in patch px (other rows unused, zero);
    features float32 [K, 6]; source float [K]: the video frame each came from."""
    patches: np.ndarray
    points: np.ndarray
    features: np.ndarray
    source: np.ndarray
    scale: float
    stride: int
    origin: str = "the reference video"
    lip_stats: np.ndarray | None = None  # float32 [K, 2, 3] mean and std of each patch's lips (None: made on use)

    def __len__(self) -> int:
        return len(self.patches)

    @property
    def nbytes(self) -> int:
        extra = 0 if self.lip_stats is None else self.lip_stats.nbytes
        return int(self.patches.nbytes + self.points.nbytes + self.features.nbytes + self.source.nbytes + extra)

    def lips_colour(self, k: int) -> np.ndarray:
        """[2, 3] mean and std of bank frame k's lip pixels (between its outer and inner contours)."""
        if self.lip_stats is not None:
            return self.lip_stats[k]
        return lip_band_stats(self.patches[k], self.points[k])

    def summary(self) -> str:
        h, w = self.patches.shape[1:3]
        return (f"mouth bank: {len(self)} frames of {self.origin} (every {self.stride}), {w}x{h} px patches, "
                f"{self.nbytes / 2**20:.1f} MB")


def _outline(lips: np.ndarray, upper: tuple, lower: tuple) -> np.ndarray:
    return np.concatenate([lips[list(upper)], lips[list(lower)][::-1]])


def lip_band_stats(image: np.ndarray, lms: np.ndarray) -> np.ndarray:
    """float64 [2, 3]: mean and std of the pixels between the outer and inner lip contours of landmarks
    lms ([468, 2] in the image's px); zeros and ones when the lips cover no pixel."""
    outer = _outline(np.asarray(lms, np.float64), OUTER_UPPER, OUTER_LOWER)
    inner = _outline(np.asarray(lms, np.float64), INNER_UPPER, INNER_LOWER)
    x0, y0 = np.maximum(np.floor(outer.min(0)).astype(int) - 1, 0)
    x1, y1 = np.minimum(np.ceil(outer.max(0)).astype(int) + 2, [image.shape[1], image.shape[0]])
    if x1 <= x0 or y1 <= y0:
        return np.array([np.zeros(3), np.ones(3)])
    shape = (y1 - y0, x1 - x0)
    band = (_fill(shape, outer, (x0, y0)) > 0.5) & (_fill(shape, inner, (x0, y0)) < 0.5)
    if band.sum() < 8:
        return np.array([np.zeros(3), np.ones(3)])
    px = image[y0:y1, x0:x1][band].astype(np.float64)
    return np.array([px.mean(0), px.std(0)])


def _patch_affine(frame: MouthFrame, scale: float) -> np.ndarray:
    """2x3 affine crop px -> patch px (continuous coordinates) of one face's mouth frame."""
    rot = np.stack([frame.ex, frame.ey]) * (scale / frame.iod)  # crop offset -> patch px
    t = -rot @ frame.origin - np.array([SPAN_U[0], SPAN_V[0]]) * scale
    return np.concatenate([rot, t[:, None]], axis=1)


def _patch_size(scale: float) -> tuple[int, int]:
    return int(np.ceil((SPAN_U[1] - SPAN_U[0]) * scale)), int(np.ceil((SPAN_V[1] - SPAN_V[0]) * scale))


def bank_frames(n: int, found: np.ndarray, max_frames: int = MAX_BANK_FRAMES) -> tuple[np.ndarray, int]:
    """(frame indices, stride): every stride-th frame with a found face, at most max_frames of them."""
    usable = np.flatnonzero(np.asarray(found, bool)[:n])
    stride = max(1, int(np.ceil(len(usable) / max(int(max_frames), 1))))
    return usable[::stride][:max_frames], stride


def build_bank(track, max_frames: int = MAX_BANK_FRAMES, origin: str = "the reference video") -> MouthBank | None:
    """The mouth bank of a FaceTrack of a talking video (frames with a found face, every stride-th so at
    most max_frames); None when it has fewer than MIN_BANK_FRAMES usable frames (a photo, say).
    Reads one crop at a time (a video decoded on demand stays so). The warps and masks are OpenCV's (a
    pack dependency); where it is missing there is no bank, said in the log, and portrait draws the mouth."""
    from ...vision.faces import CropLandmarks

    if len(track) < MIN_BANK_FRAMES:
        return None
    if _align._cv2 is None:
        log.info("[digital_human] portrait: no mouth bank without OpenCV (pip install opencv-python); "
                 "the mouth interior is drawn")
        return None
    picks, stride = bank_frames(len(track), track.found, max_frames)
    if len(picks) < MIN_BANK_FRAMES:
        return None
    crop_lms = CropLandmarks(track)
    iods = np.array([mouth_frame(crop_lms[int(r)]).iod for r in picks[:: max(1, len(picks) // 16)]])
    scale = float(np.clip(OVERSAMPLE * np.median(iods), MIN_PX_PER_IOD, MAX_PX_PER_IOD))
    w, h = _patch_size(scale)
    patches = np.empty((len(picks), h, w, 3), np.uint8)
    points = np.zeros((len(picks), 468, 2), np.float32)
    features = np.empty((len(picks), len(FEATURES)), np.float32)
    for k, r in enumerate(picks):
        lms = crop_lms[int(r)]
        a = _patch_affine(mouth_frame(lms), scale)
        patches[k] = np.clip(np.rint(_align.warp_image(np.asarray(track.crops[int(r)]), a, w, h)), 0, 255)
        points[k, LIP_POINTS] = lms[LIP_POINTS] @ a[:, :2].T + a[:, 2]
        features[k] = shape_features(lms)
    lip_stats = np.stack([lip_band_stats(patches[k], points[k]) for k in range(len(picks))]).astype(np.float32)
    return MouthBank(patches=patches, points=points, features=features, source=picks.astype(np.float32),
                     scale=scale, stride=stride, origin=origin, lip_stats=lip_stats)


# --- selection -------------------------------------------------------------------------------------
def _spread(features: np.ndarray) -> np.ndarray:
    """Per-feature scale of the match: the bank's own spread (floored: a feature that barely varies in
    the bank must not dominate with tiny differences)."""
    return np.maximum(features.std(0), 0.01)


def select_frames(bank_features: np.ndarray, targets: np.ndarray, bank_source: np.ndarray | None = None,
                  stride: int = 1, candidates: int | None = None, hold_cost: float | None = None,
                  jump_cost: float | None = None) -> np.ndarray:
    """int64 [N]: the bank frame shown at each of N output frames whose target shapes are `targets`
    [N, 6]. Minimises the shape distance plus a temporal cost (Viterbi): the next bank frame (the next
    moment of the source video) is free, the same one again costs hold_cost, any other costs jump_cost
    plus JUMP_SHAPE x how far its shape is from the previous one (None: the module's constants)."""
    candidates = CANDIDATES if candidates is None else candidates
    hold_cost = HOLD_COST if hold_cost is None else hold_cost
    jump_cost = JUMP_COST if jump_cost is None else jump_cost
    bf = np.asarray(bank_features, np.float64)
    t = np.asarray(targets, np.float64)
    n, k = len(t), len(bf)
    if n == 0:
        return np.zeros(0, np.int64)
    src = np.arange(k, dtype=np.float64) * stride if bank_source is None else np.asarray(bank_source, np.float64)
    wsd = np.sqrt(WEIGHTS[: bf.shape[1]]) / _spread(bf)
    bw, tw = bf * wsd, t * wsd
    m = min(int(candidates), k)
    cand = np.empty((n, m), np.int64)
    unary = np.empty((n, m))
    for start in range(0, n, 512):  # [512, K] distances at a time: bounded for long outputs
        d = ((tw[start:start + 512, None, :] - bw[None, :, :]) ** 2).sum(-1)
        part = np.argpartition(d, m - 1, axis=1)[:, :m] if m < k else np.tile(np.arange(k), (len(d), 1))
        cand[start:start + 512] = part
        unary[start:start + 512] = np.take_along_axis(d, part, 1)
    cost = unary[0].copy()
    back = np.zeros((n, m), np.int64)
    for i in range(1, n):
        a, b = cand[i - 1][:, None], cand[i][None, :]
        shape_d = np.sqrt(((bw[cand[i - 1]][:, None, :] - bw[cand[i]][None, :, :]) ** 2).sum(-1))
        step = np.where(b == a, hold_cost, jump_cost + JUMP_SHAPE * shape_d)
        nxt = (b == a + 1) & (np.abs(src[np.minimum(b, k - 1)] - src[a] - stride) <= stride)
        step = np.where(nxt, 0.0, step)
        total = cost[:, None] + step
        back[i] = np.argmin(total, 0)
        cost = total[back[i], np.arange(m)] + unary[i]
    path = np.empty(n, np.int64)
    j = int(np.argmin(cost))
    for i in range(n - 1, -1, -1):
        path[i] = cand[i, j]
        j = back[i, j]
    return path


# --- warp and blend ----------------------------------------------------------------------------------
def _mesh(points: np.ndarray, frame: MouthFrame, ring_of: np.ndarray | None = None) -> np.ndarray:
    """[6 x 11, 2] vertices of the warp mesh from lip points (any pixels): ring above, the four lip
    contours, ring below. The ring lies RING iod out from the outer lips (of `ring_of`'s lip points when
    given), away from the corners' midpoint, so the skin right around the lips follows them."""
    contours = [points[list(c)] for c in CONTOURS]
    ring_src = contours if ring_of is None else [ring_of[list(c)] for c in CONTOURS]
    rings = []
    for outer in (ring_src[0], ring_src[3]):
        d = outer - frame.origin
        d = d / np.maximum(np.linalg.norm(d, axis=-1, keepdims=True), 1e-6)
        rings.append(outer + d * RING * frame.iod)
    return np.concatenate([rings[0], *contours, rings[1]]).astype(np.float64)


def _triangles() -> np.ndarray:
    """int [T, 3] vertex indices of the strips between consecutive polylines of _mesh."""
    tris = []
    for row in range(5):
        a, b = row * 11, (row + 1) * 11
        for k in range(10):
            tris += [(a + k, a + k + 1, b + k + 1), (a + k, b + k + 1, b + k)]
    return np.array(tris, np.int64)


TRIANGLES = _triangles()
INNER_TRIANGLES = TRIANGLES[20:80]  # the strips from the outer to the inner lips and across the opening


def _similarity(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """2x3 least-squares similarity taking dst points to src points (a backward map)."""
    ms, md = src.mean(0), dst.mean(0)
    s0, d0 = src - ms, dst - md
    den = max((d0 ** 2).sum(), 1e-9)
    p = (d0[:, 0] * s0[:, 0] + d0[:, 1] * s0[:, 1]).sum() / den
    q = (d0[:, 0] * s0[:, 1] - d0[:, 1] * s0[:, 0]).sum() / den
    rot = np.array([[p, -q], [q, p]])
    return np.concatenate([rot, (ms - rot @ md)[:, None]], axis=1)


def warp_maps(src_pts: np.ndarray, dst_pts: np.ndarray, box: tuple[int, int, int, int],
              outside: str = "similarity", triangles: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Backward map (map_x, map_y) [h, w] (continuous source px) of the output pixels in box
    (x0, y0, x1, y1): piecewise affine over TRIANGLES from the mesh vertices dst_pts -> src_pts [V, 2];
    outside the mesh the least-squares similarity of the vertices, or the identity ("identity": the
    source is the output's own image, moved inside the mesh only). triangles: a subset of TRIANGLES
    (None: all), when only part of the mesh is needed."""
    cv2 = _align._cv2
    x0, y0, x1, y1 = box
    h, w = y1 - y0, x1 - x0
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float64) + 0.5
    sim = _similarity(src_pts, dst_pts) if outside == "similarity" else np.array([[1.0, 0, 0], [0, 1.0, 0]])
    mx = sim[0, 0] * xx + sim[0, 1] * yy + sim[0, 2]
    my = sim[1, 0] * xx + sim[1, 1] * yy + sim[1, 2]
    tris = TRIANGLES if triangles is None else triangles
    d, s = dst_pts[tris], src_pts[tris]  # [T, 3, 2]
    e1, e2 = d[:, 1] - d[:, 0], d[:, 2] - d[:, 0]
    area = 0.5 * np.abs(e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0])
    live = np.flatnonzero(area > 0.05)
    if not len(live):
        return mx, my
    dm = np.concatenate([d[live].transpose(0, 2, 1), np.ones((len(live), 1, 3))], 1)  # [T, 3, 3]
    aff = s[live].transpose(0, 2, 1) @ np.linalg.inv(dm)  # [T, 2, 3] dst -> src
    label = np.full((h, w), -1, np.int32)
    polys = np.rint((d[live] - 0.5 - np.array([x0, y0])) * 16).astype(np.int32)  # 4 fractional bits
    for j, poly in enumerate(polys):
        cv2.fillConvexPoly(label, poly, j, lineType=cv2.LINE_8, shift=4)
    inside = label >= 0
    a = aff[label[inside]]
    px, py = xx[inside], yy[inside]
    mx[inside] = a[:, 0, 0] * px + a[:, 0, 1] * py + a[:, 0, 2]
    my[inside] = a[:, 1, 0] * px + a[:, 1, 1] * py + a[:, 1, 2]
    return mx, my


def _fill(shape: tuple[int, int], poly: np.ndarray, origin: tuple[int, int]) -> np.ndarray:
    """float32 [h, w] 1 inside the polygon (continuous px, box origin (x0, y0)), 0 outside."""
    out = np.zeros(shape, np.float32)
    cv2 = _align._cv2
    cv2.fillPoly(out, [np.rint((poly - 0.5 - origin) * 16).astype(np.int32)], 1.0, lineType=cv2.LINE_AA, shift=4)
    return out


def _blur(img: np.ndarray, sigma: float) -> np.ndarray:
    return _align._cv2.GaussianBlur(img, (0, 0), sigma, borderType=_align._cv2.BORDER_CONSTANT)


def placed_lips(target_lms: np.ndarray, bank: MouthBank, k: int, follow: float | None = None) -> np.ndarray:
    """[468, 2] target_lms with the lip points LIP_POINTS where blend_mouth puts bank frame k's lips:
    the bank lips moved as a whole onto the target's (least-squares similarity), then bent `follow`
    (None: SHAPE_FOLLOW) of the way onto the target contours."""
    follow = SHAPE_FOLLOW if follow is None else float(follow)
    tgt = np.asarray(target_lms, np.float64)[:, :2]
    src = np.asarray(bank.points[k], np.float64)[LIP_POINTS]
    fit = _similarity(tgt[LIP_POINTS], src)  # bank patch px -> target px
    moved = src @ fit[:, :2].T + fit[:, 2]
    out = tgt.copy()
    out[LIP_POINTS] = moved + follow * (tgt[LIP_POINTS] - moved)
    return out


def reshape_lips(crop: np.ndarray, lms_from: np.ndarray, lms_to: np.ndarray) -> np.ndarray:
    """The crop with its lips (at lms_from's lip points) moved to lms_to's, piecewise affinely inside a
    ring RING iod around lms_from's outer lips (the same ring for both, so the skin beyond it is untouched)."""
    a, b = np.asarray(lms_from, np.float64)[:, :2], np.asarray(lms_to, np.float64)[:, :2]
    if np.allclose(a[LIP_POINTS], b[LIP_POINTS], atol=0.05):
        return crop
    frame = mouth_frame(a)
    src, dst = _mesh(a, frame), _mesh(b, frame, ring_of=a)
    x0, y0 = np.maximum(np.floor(np.minimum(src.min(0), dst.min(0))).astype(int) - 1, 0)
    x1, y1 = np.minimum(np.ceil(np.maximum(src.max(0), dst.max(0))).astype(int) + 2, [crop.shape[1], crop.shape[0]])
    if x1 <= x0 or y1 <= y0:
        return crop
    mx, my = warp_maps(src, dst, (x0, y0, x1, y1), outside="identity")
    out = crop.copy()
    out[y0:y1, x0:x1] = _remap_linear(crop, mx, my)
    return out


def _remap_linear(image: np.ndarray, map_x: np.ndarray, map_y: np.ndarray) -> np.ndarray:
    """image sampled bilinearly at continuous px (map_x, map_y) (OpenCV's centre-at-integer: minus 0.5)."""
    cv2 = _align._cv2
    return cv2.remap(image, (map_x - 0.5).astype(np.float32), (map_y - 0.5).astype(np.float32),
                     interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def _grown(points: np.ndarray, centre: np.ndarray, by: float) -> np.ndarray:
    """Polygon points moved `by` px away from `centre`."""
    d = points - centre
    return points + d / np.maximum(np.linalg.norm(d, axis=-1, keepdims=True), 1e-6) * by


def blend_mouth(crop: np.ndarray, target_lms: np.ndarray, bank: MouthBank, k: int,
                follow: float | None = None, region: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(crop [S, S, 3] uint8 with bank frame k's lips and mouth warped onto the lip landmarks
    target_lms ([468, 2] crop px; only LIP_POINTS and the eye corners are read), colour-matched to the
    crop around the lips and blended through a feathered mask, pixels away from the lips unchanged;
    the landmarks with the lip points where the bank lips now are: placed_lips).
    region: "interior" (None: REGION) puts in only the mouth opening between the target's inner lips,
    bent exactly onto it (follow 1), and keeps the crop's lips; "lips" the lips as well."""
    region = REGION if region is None else region
    if region not in ("interior", "lips"):
        raise ValueError(f"region must be 'interior' or 'lips', got {region!r}")
    driven = np.asarray(target_lms, np.float64)[:, :2]
    tgt = placed_lips(driven, bank, k, follow)
    if region == "interior":  # the frame's own lips take the placed shape (their texture stays theirs)
        crop = reshape_lips(crop, driven, tgt)
        driven = tgt
    frame = mouth_frame(tgt)
    if region == "interior":
        inner = _outline(tgt, INNER_UPPER, INNER_LOWER)
        x, y = inner[:, 0], inner[:, 1]
        if 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))) < 1.0:  # lips shut: no opening
            return crop, tgt
        # the opening, a little onto the inner lip edge, feathered: only it (and its box) is warped
        grown = _grown(inner, frame.origin, MASK_IN * frame.iod)
        pad, tris = 3.0 * FEATHER_IN * frame.iod + 2, INNER_TRIANGLES
        area = grown
    else:  # the outer lip contours, placed and driven (the frame's own warped lips lie there and must not
        # show as a second lip edge), pushed MASK_OUT iod outwards, feathered
        grown = [_grown(_outline(lips, OUTER_UPPER, OUTER_LOWER), frame.origin, MASK_OUT * frame.iod)
                 for lips in (tgt, driven)]
        pad, tris = 3.0 * FEATHER * frame.iod + 2, None
        area = np.concatenate(grown)
    x0, y0 = np.maximum(np.floor(area.min(0) - pad).astype(int), 0)
    x1, y1 = np.minimum(np.ceil(area.max(0) + pad).astype(int), [crop.shape[1], crop.shape[0]])
    if x1 <= x0 or y1 <= y0:
        return crop, tgt
    shape = (y1 - y0, x1 - x0)
    if region == "interior":
        mask = np.clip(_blur(_fill(shape, grown, (x0, y0)), FEATHER_IN * frame.iod), 0.0, 1.0)
    else:
        mask = np.maximum(_fill(shape, grown[0], (x0, y0)), _fill(shape, grown[1], (x0, y0)))
        mask = np.clip(_blur(mask, FEATHER * frame.iod), 0.0, 1.0)
    src_frame = MouthFrame(origin=np.array([-SPAN_U[0], -SPAN_V[0]]) * bank.scale, ex=np.array([1.0, 0.0]),
                           ey=np.array([0.0, 1.0]), iod=bank.scale)
    src = _mesh(np.asarray(bank.points[k], np.float64), src_frame)
    mx, my = warp_maps(src, _mesh(tgt, frame), (x0, y0, x1, y1), triangles=tris)
    warped = _remap_linear(bank.patches[k], mx, my).astype(np.float32)
    # colour: the bank frame's lips matched to the frame's own (mean, and contrast within STD_RATIO), so the
    # teeth and cavity take the frame's light; the lips, not the opening, are what both frames share
    mu_c, sd_c = lip_band_stats(crop, driven)
    mu_w, sd_w = bank.lips_colour(k)
    if sd_c.sum() > 3.0:  # the frame's lips cover pixels (a tiny face: no match)
        warped = (warped - mu_w) * np.clip(sd_c / np.maximum(sd_w, 1.0), *STD_RATIO) + mu_c
    pixels = crop[y0:y1, x0:x1].astype(np.float32)
    out = crop.copy()
    m = mask[..., None]
    out[y0:y1, x0:x1] = np.clip(np.rint(pixels * (1 - m) + warped * m), 0, 255).astype(np.uint8)
    return out, tgt
