"""Move a face's mouth in its aligned crop: a two-layer smooth warp + a rendered mouth interior.

Geometry, in a mouth frame (u along the eye line, v down, origin between the inner lips, unit =
inter-ocular distance "iod" of the outer eye corners):
  * The reference mouth is first *closed*: where the reference lips are apart by g(u), the upper
    lip comes down by ALPHA g and the lower lip (with the jaw) up by the rest, so any source mouth,
    open or shut, starts from the same neutral closed line.
  * Then it is opened to the driven gap G s(u) (s: an elliptic profile, 0 at the corners): the
    upper lip goes up by BETA of it, the lower lip down by the rest; the jaw drops the chin by
    jaw_open x JAW_MAX, fading towards the jaw angles and into the neck; width/round move the
    corners out/in (a horizontal field that fades away from the mouth).
  * The face above the dividing line between the lips follows the "upper" field (fading to zero at
    the nose base), the face below it the "lower" field (fading to zero below the chin and at the
    jaw angles). Both fields are smooth and equal (zero) outside the mouth corners, so the skin
    never tears; between the two target inner-lip curves is the mouth interior, which is drawn
    (_interior): a shaded cavity, upper teeth hanging from the upper lip, lower teeth and a tongue
    on wide openings, colours derived from this face's lips and skin.
The warp is backward (output pixel -> reference pixel, fixed-point inversion of the smooth forward
field) and resampled with cv2.remap (numpy bilinear fallback). The driven landmarks (all 468) are
the forward field applied to the reference ones, which updates DH_FACES.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...vision import align as _align

# MediaPipe mesh indices (subject's right = image left first)
INNER_UPPER = (78, 191, 80, 81, 82, 13, 312, 311, 310, 415, 308)
INNER_LOWER = (78, 95, 88, 178, 87, 14, 317, 402, 318, 324, 308)
OUTER_UPPER = (61, 185, 40, 39, 37, 0, 267, 269, 270, 409, 291)
OUTER_LOWER = (61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291)
UPPER_SET = frozenset(INNER_UPPER + OUTER_UPPER) - {78, 308, 61, 291}
LOWER_SET = frozenset(INNER_LOWER + OUTER_LOWER) - {78, 308, 61, 291}
_IS_UPPER = np.isin(np.arange(468), list(UPPER_SET))  # per mesh index: a lookup, not a set test per call
_IS_LOWER = np.isin(np.arange(468), list(LOWER_SET))
NOSE_BASE, CHIN, EYE_R, EYE_L = 2, 152, 33, 263
CHEEKS = (205, 425, 50, 280)

ALPHA = 0.35    # share of a reference gap closed by the upper lip coming down
BETA = 0.28     # share of a driven gap made by the upper lip going up
GAP_MAX = 0.13  # inner-lip gap at lip_open = 1, in iod (tuned on dev clip 01a: mouth-landmark distance)
JAW_MAX = 0.12  # chin drop at jaw_open = 1, in iod
JAW_HALF_WIDTH = 0.85  # the jaw's drop fades to 0 at this |u| (iod): the jaw angles stay put
NECK_FADE = 0.40       # the lower field fades to 0 this far (iod) below the chin
SPREAD_GAIN, ROUND_GAIN = 0.22, 0.35  # corner motion at width/round = 1, in mouth half-widths


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


@dataclass
class MouthGeometry:
    """Per reference crop: the mouth frame and the reference lip profile (see module doc)."""
    origin: np.ndarray      # [2] crop px, between the inner lips
    ex: np.ndarray          # [2] unit, along the eye line
    ey: np.ndarray          # [2] unit, down the face
    iod: float              # crop px
    u0: float               # mouth centre along u (inner corners' midpoint)
    half_w: float           # inner half-width (corners 78..308)
    col_u: np.ndarray       # [11] u of the inner-lip columns
    gap_ref: np.ndarray     # [11] reference inner gap per column (>= 0)
    v_up: np.ndarray        # [11] v of reference upper inner lip
    v_nose: float           # v of the nose base (upper field fades to 0 there)
    v_chin: float           # v of the chin
    lip_rgb: np.ndarray     # [3] float
    skin_rgb: np.ndarray    # [3] float
    roi: tuple[int, int, int, int]  # x0, y0, x1, y1 crop px the warp can touch

    def to_uv(self, xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = xy - self.origin
        return d @ self.ex, d @ self.ey

    def from_uv(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        return self.origin + u[..., None] * self.ex + v[..., None] * self.ey


def mouth_geometry(crop: np.ndarray, lms: np.ndarray) -> MouthGeometry:
    """Measure the mouth frame, lip profile and colours of one aligned crop [S, S, 3] with its
    crop landmarks [468, 2]."""
    return _geometry(np.asarray(lms, np.float64)[:, :2], crop.shape[0], crop)


def mouth_shape(lms: np.ndarray, crop_size: int) -> MouthGeometry:
    """mouth_geometry without the colours (zero): all that drive_landmarks needs, from the landmarks
    alone (no crop decoded), e.g. for the target shape of every output frame before any is rendered."""
    return _geometry(np.asarray(lms, np.float64)[:, :2], int(crop_size), None)


def _geometry(p: np.ndarray, s: int, crop: np.ndarray | None) -> MouthGeometry:
    eye = p[EYE_L] - p[EYE_R]
    iod = float(np.linalg.norm(eye))
    ex = eye / max(iod, 1e-6)
    ey = np.array([-ex[1], ex[0]])
    if (p[CHIN] - p[NOSE_BASE]) @ ey < 0:
        ey = -ey
    origin = (p[13] + p[14]) / 2
    d = p - origin
    u, v = d @ ex, d @ ey
    up, lo = np.array(INNER_UPPER), np.array(INNER_LOWER)
    col_u = (u[up] + u[lo]) / 2
    order = np.argsort(col_u)
    gap = np.maximum(v[lo] - v[up], 0.0)
    u0 = float((u[78] + u[308]) / 2)
    half_w = float(max(abs(u[308] - u[78]) / 2, 0.05 * iod))

    def sample(points: np.ndarray) -> np.ndarray:
        if crop is None:
            return np.zeros(3)
        ij = np.clip(np.rint(points - 0.5).astype(int), 0, s - 1)
        return crop[ij[:, 1], ij[:, 0]].astype(np.float64).mean(0)

    lip_pts = np.concatenate([(p[list(OUTER_UPPER[2:-2])] + p[list(INNER_UPPER[2:-2])]) / 2,
                              (p[list(OUTER_LOWER[2:-2])] + p[list(INNER_LOWER[2:-2])]) / 2])
    x_all = np.array([p[:, 0].min(), p[:, 0].max()])
    roi_pts = np.concatenate([p[[234, 454, 172, 397, NOSE_BASE, CHIN]],
                              (p[CHIN] + ey * (NECK_FADE + 0.1) * iod)[None]])
    x0, y0 = np.floor(roi_pts.min(0)).astype(int) - 2
    x1, y1 = np.ceil(roi_pts.max(0)).astype(int) + 3
    x0, x1 = max(int(x_all[0]) - 2, x0, 0), min(int(x_all[1]) + 3, x1, s)
    return MouthGeometry(origin=origin, ex=ex, ey=ey, iod=iod, u0=u0, half_w=half_w, col_u=col_u[order],
                         gap_ref=gap[order], v_up=v[up][order], v_nose=float(v[NOSE_BASE]),
                         v_chin=float(v[CHIN]), lip_rgb=sample(lip_pts), skin_rgb=sample(p[list(CHEEKS)]),
                         roi=(x0, max(y0, 0), x1, min(y1, s)))


@dataclass
class MouthPose:
    """Driven controls for one frame (0..1, see speech_drive.MouthParams)."""
    jaw_open: float
    lip_open: float
    width: float
    round: float


def _profile(g: MouthGeometry, u: np.ndarray) -> np.ndarray:
    """Elliptic opening profile: 1 at the mouth centre, 0 at (and beyond) the inner corners."""
    x = (u - g.u0) / g.half_w
    return np.sqrt(np.clip(1.0 - x * x, 0.0, 1.0)) ** 0.8


def _fields(g: MouthGeometry, pose: MouthPose, u: np.ndarray, v: np.ndarray,
            lower: bool) -> tuple[np.ndarray, np.ndarray]:
    """Forward displacement (du, dv) in px at reference points (u, v) for the upper or lower layer."""
    gap_u = np.interp(u, g.col_u, g.gap_ref, left=0.0, right=0.0)
    gap_t = pose.lip_open * GAP_MAX * g.iod * _profile(g, u)
    # horizontal: corners out (spread) or in (round); fades within ~2 half-widths and vertically
    k = pose.width * SPREAD_GAIN - pose.round * ROUND_GAIN
    x = (u - g.u0) / (2.2 * g.half_w)
    du = k * (u - g.u0) * np.clip(1.0 - x * x, 0.0, 1.0) ** 2 * np.exp(-0.5 * (v / (0.28 * g.iod)) ** 2)
    if not lower:
        v_lip = np.interp(u, g.col_u, g.v_up)
        w = _smoothstep((v - g.v_nose) / np.maximum(v_lip - g.v_nose, 1.0))
        dv = (ALPHA * gap_u - BETA * gap_t) * w
        return du, dv
    lip = -(1.0 - ALPHA) * gap_u + (1.0 - BETA) * gap_t
    gap_c = float(np.interp(g.u0, g.col_u, g.gap_ref))
    # the jaw: drop to the driven opening, minus the reference's own drop (~ its lip gap)
    jaw_d = pose.jaw_open * JAW_MAX * g.iod - 0.8 * (1.0 - ALPHA) * gap_c
    xj = (u - g.u0) / (JAW_HALF_WIDTH * g.iod)
    jaw = jaw_d * np.clip(1.0 - xj * xj, 0.0, 1.0) ** 2
    depth = max(g.v_chin, 1.0)
    wj = _smoothstep(v / (0.55 * depth))
    neck = 1.0 - _smoothstep((v - depth) / (NECK_FADE * g.iod))
    return du, (lip * (1.0 - wj) + jaw * wj) * neck


def drive_landmarks(g: MouthGeometry, lms: np.ndarray, pose: MouthPose,
                    points: np.ndarray | None = None) -> np.ndarray:
    """The reference crop landmarks [468, 2] moved by the forward fields (lip points by their side;
    other points by which side of the reference's closed lip line they are on). points: mesh indices
    to move (returns [len(points), 2]); None = all 468."""
    ids = np.arange(len(lms)) if points is None else np.asarray(points, np.int64)
    p = np.asarray(lms, np.float64)[ids, :2]
    u, v = g.to_uv(p)
    v_closed = np.interp(u, g.col_u, g.v_up + ALPHA * g.gap_ref)
    lower = v > v_closed
    lower[_IS_UPPER[ids]] = False
    lower[_IS_LOWER[ids]] = True
    out = p.copy()
    for side in (False, True):
        sel = lower == side
        du, dv = _fields(g, pose, u[sel], v[sel], side)
        out[sel] = g.from_uv(u[sel] + du, v[sel] + dv)
    return out


def _remap(src: np.ndarray, map_x: np.ndarray, map_y: np.ndarray) -> np.ndarray:
    """Bilinear sample of src [S, S, 3] at continuous coords (map_x, map_y) -> float32 [h, w, 3]."""
    cv2 = _align._cv2
    if cv2 is not None:
        return cv2.remap(src, (map_x - 0.5).astype(np.float32), (map_y - 0.5).astype(np.float32),
                         interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE).astype(np.float32)
    h, w = src.shape[:2]
    x, y = map_x - 0.5, map_y - 0.5
    x0, y0 = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
    fx, fy = (x - x0)[..., None], (y - y0)[..., None]
    out = np.zeros(map_x.shape + (src.shape[2],), np.float32)
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            out += (wx * wy) * src[np.clip(y0 + dy, 0, h - 1), np.clip(x0 + dx, 0, w - 1)]
    return out


_LUMA = np.array([0.299, 0.587, 0.114])
# Colour per unit luminance (rgb / luma): a tongue's or gums' pink under white light; teeth (ivory); the
# skin of the shared photos (a face's own skin chroma against this says how warm or cool the light is).
_PINK = np.array([1.58, 0.73, 0.78])
_IVORY = np.array([1.03, 1.00, 0.93])
_SKIN_TYPICAL = np.array([1.18, 0.94, 0.85])
# Tooth boundaries seen from the front, from the midline in iod (outer eye corners ~ 90 mm): central
# incisor ~8.5 mm, lateral ~6.5 mm and the canine foreshortened by the arch; the lower ones narrower.
# Each boundary's weight: the midline shows most, the canines (further back, foreshortened) least.
UPPER_TEETH = ((0.0, 1.0), (0.094, 0.8), (0.160, 0.45), (0.205, 0.25))
LOWER_TEETH = ((0.0, 1.0), (0.060, 0.7), (0.115, 0.4))


def interior_palette(g: MouthGeometry) -> dict[str, np.ndarray]:
    """RGB colours of the drawn mouth interior, from this face's lips and skin: the exposure from their
    luminance, the light's tint from the skin's chroma, so a darker or lighter face (or a warm or cool
    photo) gets a matching mouth rather than one fixed palette."""
    lip, skin = np.maximum(g.lip_rgb, 1.0), np.maximum(g.skin_rgb, 1.0)
    l_lip, l_skin = float(lip @ _LUMA), float(skin @ _LUMA)
    # the light's colour, weakly: a skin's chroma is also its tone (darker skin is warmer), not only the light's
    tint = np.clip((skin / l_skin) / _SKIN_TYPICAL, 0.6, 1.6) ** 0.3
    flesh = 0.4 * lip / l_lip + 0.6 * _PINK * tint  # inner-mouth chroma: between the lips' and a pink
    # teeth: brighter than the skin (much brighter on dark skin), never paper-white, in the photo's light
    l_teeth = min(l_skin + 0.4 * (236.0 - l_skin), 1.5 * l_skin + 20.0)
    teeth = _IVORY * tint / float((_IVORY * tint) @ _LUMA) * l_teeth
    # the tongue's pink is lighter than dark lips: part of its brightness follows the teeth (the exposure)
    return {"throat": flesh * (0.08 * l_lip) + 1.0, "cavity": flesh * (0.30 * l_lip),
            "tongue": flesh * (0.45 * l_lip + 0.25 * l_teeth),
            "wet_lip": lip * 0.62, "teeth": np.clip(teeth, 0.0, 245.0)}


def _separations(s: np.ndarray, edges: tuple[tuple[float, float], ...], iod: float) -> np.ndarray:
    """0..1: how much of a gap between two teeth is at |s| (px from the midline): a ~1 px wide bump at
    each boundary (edges: (iod from the midline, weight)), zero where the teeth are too small to show.
    Tabulated at 1/4 px along |s| and interpolated (a few exp per boundary, not per pixel)."""
    gain = float(np.clip((iod - 60.0) / 60.0, 0.0, 1.0))
    if gain == 0.0:
        return np.zeros_like(s)
    grid = np.arange(0.0, edges[-1][0] * iod + 4.0, 0.25)
    table = np.zeros_like(grid)
    for e, wt in edges:
        table += wt * np.exp(-(grid - e * iod) ** 2)
    return np.interp(np.abs(s), grid, table * gain, right=0.0)


def _interior(g: MouthGeometry, pose: MouthPose, u: np.ndarray, v: np.ndarray, v_top: np.ndarray,
              v_bot: np.ndarray) -> np.ndarray:
    """RGB float [h, w, 3] of the mouth interior at output points (u, v) (px, mouth frame) between the
    inner-lip curves v_top (upper lip) and v_bot (lower lip), back to front:
      * cavity: darkest in the middle of the opening (the throat), dimly lit near the lips;
      * tongue: a dome resting on the lower lip, only on wide openings with the jaw well down (open
        vowels), shaded from its lit front (bottom) to its back (top edge, into the throat);
      * lower teeth: their tips above the lower lip, only when the jaw is well open, in shadow;
      * upper teeth: a band hanging from the upper lip and following its curve, with the lip's shadow
        at the top, a greyer biting edge slightly notched between teeth, faint separations at the
        incisors and canines, and darker towards the corners (further back);
      * a thin wet, darker lip edge along the lower lip.
    All edges are ramps ~1 px wide (anti-aliased); colours from interior_palette."""
    pal = interior_palette(g)
    iod = g.iod
    gap = np.maximum(v_bot - v_top, 1e-3)
    open_cols = gap > 0.5
    if not open_cols.any():
        return np.broadcast_to(pal["throat"], u.shape + (3,)).astype(np.float64)
    uo = u[open_cols]
    u_l, u_r = float(uo.min()), float(uo.max())
    x = (u - (u_l + u_r) / 2) / max((u_r - u_l) / 2, 1.0)  # -1..1 across the opening
    x2 = np.minimum(x * x, 1.0)
    big = float(gap.max())  # the opening at its widest, px
    op = big / iod
    below = v - v_top
    t = np.clip(below / gap, 0.0, 1.0)  # 0 at the upper lip, 1 at the lower

    # cavity: throat-dark in the middle, dimly lit towards the lips, dark again in the corners
    lit = np.minimum(((t - 0.45) / 0.55) ** 2 + x2 * x2, 1.0) * (1.0 - 0.6 * np.clip((x2 - 0.6) / 0.4, 0, 1))
    col = pal["throat"] + (pal["cavity"] - pal["throat"]) * lit[..., None]

    def over(c: np.ndarray, a: np.ndarray) -> None:
        nonlocal col
        col = col + a[..., None] * (c - col)

    # tongue (open vowels): a dome on the lower lip, its height growing with the opening
    vis_t = (_smoothstep((op - 0.05) / 0.05) * _smoothstep((pose.jaw_open - 0.35) / 0.4)
             * (1.0 - 0.6 * pose.round))
    if vis_t > 0.0:
        h_t = vis_t * 0.45 * big * np.sqrt(np.clip(1.0 - x2 / 0.65, 0.0, 1.0))
        top = v_bot - h_t
        a_t = np.clip((v - top) / 1.8 + 0.5, 0.0, 1.0) * np.clip(h_t - 0.3, 0.0, 1.0)  # a soft silhouette
        front = np.clip((v - top) / np.maximum(h_t, 1.0), 0.0, 1.0)
        shade = (0.4 + 0.65 * np.sqrt(front)) * (1.0 - 0.4 * x2)  # its back recedes into the throat
        over(pal["tongue"] * shade[..., None], a_t)

    teeth = pal["teeth"]
    s = u - g.u0  # tooth positions are fixed to the face's midline, not to the moving lip corners

    # lower teeth: tips just above the lower lip when the jaw is well open, in the upper teeth's shadow
    vis_l = _smoothstep((op - 0.09) / 0.04) * _smoothstep((pose.jaw_open - 0.6) / 0.3)
    if vis_l > 0.0:
        across = np.sqrt(np.clip(1.0 - x2 / 0.25, 0.0, 1.0))  # the lower incisors only
        h_l = vis_l * min(0.12 * big, 0.022 * iod) * across
        a_l = np.clip(v - (v_bot - h_l) + 0.5, 0.0, 1.0) * np.clip(h_l - 0.3, 0.0, 1.0)
        sep = _separations(s, LOWER_TEETH, iod)
        shade = 0.62 * across * (1.0 - 0.12 * sep)
        over(teeth * shade[..., None], a_l)

    # upper teeth: a band under the upper lip along its curve
    vis_u = _smoothstep((op - 0.01) / 0.03) * (1.0 - 0.35 * pose.round)
    if vis_u > 0.0:
        sep = _separations(s, UPPER_TEETH, iod)
        h_u = vis_u * np.minimum(0.45 * gap, (0.022 + 0.18 * op) * iod) * (1.0 - 0.35 * x2) - 0.6 * sep
        a_u = np.clip(h_u - below + 0.5, 0.0, 1.0) * np.clip((0.92 - np.sqrt(x2)) / 0.15, 0.0, 1.0)
        rel = np.clip(below / np.maximum(h_u, 1.0), 0.0, 1.0)
        front = np.abs(s) / iod
        shade = ((0.62 + 0.38 * _smoothstep(below / np.maximum(1.6, 0.35 * h_u)))  # the upper lip's shadow
                 * (1.0 - 0.12 * _smoothstep((rel - 0.55) / 0.45))                # greyer biting edge
                 * (1.0 - 0.08 * _smoothstep((front - 0.07) / 0.07) - 0.45 * x2)  # side teeth further back
                 * (1.0 - 0.14 * sep))                                            # faint separations
        over(teeth * shade[..., None], a_u)

    # the lower lip's wet inner edge (not on a slit, which stays a dark line)
    over(pal["wet_lip"], 0.55 * np.clip(1.6 - (v_bot - v), 0.0, 1.0) * np.clip((gap - 2.0) / 3.0, 0.0, 1.0))
    return col


# The backward map is solved on a grid of this pitch, upsampled, and refined by one fixed-point step at
# every pixel: within 0.3 px of the converged map on the shared photos (the per-pixel 4-step solve is
# within 0.3 px too), at about a fifth of the per-pixel solve's cost.
GRID_PX = 4


def _backward_map(g: MouthGeometry, pose: MouthPose, x0: int, y0: int, h: int, w: int, lower_layer: bool,
                  iterations: int, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference (u, v) displacement [h, w] of the output pixels of the box at (x0, y0): q = s + d(s)
    solved by fixed-point iteration with one layer's field, on a grid of pitch `grid` px, bilinearly
    upsampled (1: at every pixel). Each layer's field is smooth, so its inverse is too; the caller picks
    the layer per pixel."""
    gh, gw = -(-h // grid) + 1, -(-w // grid) + 1
    # coarse sample j sits where cv2.resize puts it: at pixel j * grid + (grid - 1) / 2
    gy = y0 + np.arange(gh, dtype=np.float64) * grid + (grid - 1) / 2 + 0.5
    gx = x0 + np.arange(gw, dtype=np.float64) * grid + (grid - 1) / 2 + 0.5
    yy, xx = np.meshgrid(gy, gx, indexing="ij")
    d = np.stack([xx, yy], -1) - g.origin
    u, v = d @ g.ex, d @ g.ey
    su, sv = u.copy(), v.copy()
    for _ in range(iterations):
        du, dv = _fields(g, pose, su, sv, lower_layer)
        su, sv = u - du, v - dv
    disp = [su - u, sv - v]
    cv2 = _align._cv2
    if grid == 1:
        return disp[0][:h, :w], disp[1][:h, :w]
    if cv2 is not None:
        size = (gw * grid, gh * grid)
        return tuple(cv2.resize(a.astype(np.float32), size, interpolation=cv2.INTER_LINEAR)[:h, :w]
                     .astype(np.float64) for a in disp)
    return tuple(np.repeat(np.repeat(a, grid, 0), grid, 1)[:h, :w] for a in disp)


def render_mouth(crop: np.ndarray, g: MouthGeometry, pose: MouthPose, iterations: int = 4,
                 interior: bool = True, grid: int = GRID_PX) -> np.ndarray:
    """The crop [S, S, 3] uint8 with its mouth re-posed; pixels outside g.roi are unchanged.
    interior: draw the mouth interior between the lips (False: the warp only, for a caller that
    covers the mouth with real pixels, the mouth bank). grid: pitch (px) of the backward map's coarse
    solve (1: `iterations` steps at every pixel, no coarse solve)."""
    x0, y0, x1, y1 = g.roi
    out = crop.copy()
    if x1 <= x0 or y1 <= y0:
        return out
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float64) + 0.5
    d = np.stack([xx, yy], -1) - g.origin
    u, v = d @ g.ex, d @ g.ey
    # target inner-lip curves (forward-mapped reference columns)
    du_t, dv_t = _fields(g, pose, g.col_u, g.v_up, lower=False)
    top_u, top_v = g.col_u + du_t, g.v_up + dv_t
    v_lo_ref = g.v_up + g.gap_ref
    du_b, dv_b = _fields(g, pose, g.col_u, v_lo_ref, lower=True)
    bot_u, bot_v = g.col_u + du_b, v_lo_ref + dv_b
    v_top = np.interp(u, top_u, top_v)
    v_bot = np.interp(u, bot_u, np.maximum(bot_v, top_v))
    divider = np.interp(u, (top_u + bot_u) / 2, (top_v + np.maximum(bot_v, top_v)) / 2)
    lower = v > divider
    # backward map: solve q = s + d(s) per layer (each smooth), then take each pixel's layer
    h, w = y1 - y0, x1 - x0
    du_l, dv_l = _backward_map(g, pose, x0, y0, h, w, True, iterations, grid)
    du_u, dv_u = _backward_map(g, pose, x0, y0, h, w, False, iterations, grid)
    su = u + np.where(lower, du_l, du_u)
    sv = v + np.where(lower, dv_l, dv_u)
    if grid > 1:  # one step at every pixel, with its own layer's field, removes the upsampling's error
        for layer in (True, False):
            sel = lower == layer
            du, dv = _fields(g, pose, su[sel], sv[sel], layer)
            su[sel], sv[sel] = u[sel] - du, v[sel] - dv
    src = g.origin + su[..., None] * g.ex + sv[..., None] * g.ey
    warped = _remap(crop, src[..., 0], src[..., 1])
    # interior between the target curves, inside the corners (1 px anti-aliased edges)
    inside_w = np.abs(u - (top_u[0] + top_u[-1]) / 2) < (top_u[-1] - top_u[0]) / 2
    alpha = np.clip(np.minimum(v - v_top, v_bot - v) + 0.5, 0.0, 1.0) * inside_w
    if interior and alpha.any():
        # drawn only over the rows and columns the opening covers (a small part of the warp's box)
        rows, cols = np.flatnonzero(alpha.any(1)), np.flatnonzero(alpha.any(0))
        box = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
        a = alpha[box][..., None]
        drawn = _interior(g, pose, u[box], v[box], v_top[box], v_bot[box])
        warped[box] = warped[box] * (1 - a) + drawn * a
    out[y0:y1, x0:x1] = np.clip(np.rint(warped), 0, 255).astype(np.uint8)
    return out
