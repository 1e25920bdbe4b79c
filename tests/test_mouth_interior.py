"""The drawn mouth interior of `portrait` on photos (mouth_render._interior): teeth, tongue and cavity
appear when and where a mouth shows them, in colours taken from the face. A synthetic mouth frame (no
face models), plus one check on a shared photo."""
from __future__ import annotations

import numpy as np

from digital_human.talking_head.portrait import mouth_render as mr

LUMA = np.array([0.299, 0.587, 0.114])
IOD = 160.0  # a large face: a 512-px crop


def _geometry(lip=(196.0, 119.0, 121.0), skin=(240.0, 194.0, 176.0), curve: float = 0.0) -> mr.MouthGeometry:
    """An upright mouth at (256, 300) of a 512-px crop, lips closed in the reference; curve: how far (px)
    the inner upper lip's corners sit above (<0) or below (>0) its middle."""
    col_u = np.linspace(-42.0, 42.0, 11)
    return mr.MouthGeometry(origin=np.array([256.0, 300.0]), ex=np.array([1.0, 0.0]), ey=np.array([0.0, 1.0]),
                            iod=IOD, u0=0.0, half_w=42.0, col_u=col_u, gap_ref=np.zeros(11),
                            v_up=curve * (col_u / 42.0) ** 2, v_nose=-60.0, v_chin=120.0,
                            lip_rgb=np.array(lip), skin_rgb=np.array(skin), roi=(120, 200, 392, 470))


def _interior(g: mr.MouthGeometry, pose: tuple[float, float, float, float]):
    """What render_mouth draws between the lips: (rgb [h, w, 3], alpha [h, w], v [h, w], v_top, v_bot) over the
    opening's box, computed as render_mouth does."""
    p = mr.MouthPose(*map(float, pose))
    x0, y0, x1, y1 = g.roi
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float64) + 0.5
    u, v = g.to_uv(np.stack([xx, yy], -1))
    du_t, dv_t = mr._fields(g, p, g.col_u, g.v_up, lower=False)
    du_b, dv_b = mr._fields(g, p, g.col_u, g.v_up + g.gap_ref, lower=True)
    top_u, top_v, bot_u = g.col_u + du_t, g.v_up + dv_t, g.col_u + du_b
    bot_v = np.maximum(g.v_up + g.gap_ref + dv_b, top_v)
    v_top, v_bot = np.interp(u, top_u, top_v), np.interp(u, bot_u, bot_v)
    inside = np.abs(u - (top_u[0] + top_u[-1]) / 2) < (top_u[-1] - top_u[0]) / 2
    alpha = np.clip(np.minimum(v - v_top, v_bot - v) + 0.5, 0.0, 1.0) * inside
    if not alpha.any():
        return None
    rows, cols = np.flatnonzero(alpha.any(1)), np.flatnonzero(alpha.any(0))
    box = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
    rgb = mr._interior(g, p, u[box], v[box], v_top[box], v_bot[box])
    return rgb, alpha[box], v[box], v_top[box], v_bot[box]


def _lum(rgb: np.ndarray) -> np.ndarray:
    return rgb @ LUMA


def _inside(res, margin: float = 1.0) -> np.ndarray:
    """Pixels fully inside the opening (alpha 1, at least `margin` px from both lips)."""
    _rgb, alpha, v, v_top, v_bot = res
    return (alpha >= 1.0) & (v - v_top >= margin) & (v_bot - v >= margin)


def test_closed_mouth_draws_nothing():
    """Closed lips: no opening to draw in, and render_mouth with the interior equals the warp alone except
    for at most a half-covered seam pixel per column, which only darkens (no teeth, no tongue)."""
    g = _geometry()
    crop = np.full((512, 512, 3), g.skin_rgb, np.uint8)
    crop[294:306] = g.lip_rgb.astype(np.uint8)
    closed = (0.0, 0.0, 0.0, 0.0)
    res = _interior(g, closed)
    assert res is None or not _inside(res, 0.0).any()
    with_interior = mr.render_mouth(crop, g, mr.MouthPose(*closed)).astype(int)
    warp_only = mr.render_mouth(crop, g, mr.MouthPose(*closed), interior=False).astype(int)
    changed = np.any(with_interior != warp_only, -1)
    assert changed.sum(0).max() <= 1
    assert np.all(with_interior <= warp_only)


def test_upper_teeth_brighter_than_cavity_and_only_when_open():
    g = _geometry()
    pal = mr.interior_palette(g)
    # a sliver of an opening (< 1 % of the iod): a dark line, no teeth yet
    rgb, *_ = _interior(g, (0.05, 0.05, 0.0, 0.0))
    assert _lum(rgb).max() <= _lum(pal["cavity"]) + 1.0
    # half open: a bright band right under the upper lip, the cavity below it much darker
    res = _interior(g, (0.5, 0.5, 0.0, 0.0))
    rgb, _alpha, v, v_top, v_bot = res
    lum = _lum(rgb)
    centre = np.abs(np.arange(rgb.shape[1]) - rgb.shape[1] / 2) < rgb.shape[1] * 0.15
    inside = _inside(res) & centre[None]
    depth = (v - v_top) / np.maximum(v_bot - v_top, 1e-3)
    teeth = lum[inside & (depth < 0.3)]
    cavity = lum[inside & (depth > 0.5) & (depth < 0.8)]
    assert teeth.size and cavity.size
    assert np.median(teeth) > 3.0 * np.median(cavity)
    assert np.median(teeth) > _lum(g.lip_rgb)  # teeth read brighter than the lips around them


def test_upper_teeth_follow_the_upper_lip():
    """On a curved upper lip the teeth band keeps hanging from it: in every column of the middle half the
    first bright pixel is within 2 px of the lip, and the band's edge follows the curve."""
    for curve in (-6.0, 6.0):
        res = _interior(_geometry(curve=curve), (0.7, 0.7, 0.0, 0.0))
        rgb, alpha, v, v_top, _v_bot = res
        lum = _lum(rgb) * (alpha >= 1.0)
        w = rgb.shape[1]
        starts, tops = [], []
        for c in range(w // 4, 3 * w // 4):
            bright = np.flatnonzero(lum[:, c] > 100.0)
            assert bright.size, (curve, c)
            starts.append(v[bright[0], c] - v_top[bright[0], c])
            tops.append(v_top[0, c])
        assert max(starts) < 2.0, curve
        # the band's top moves with the lip between the centre and the edge of the middle half
        first = [v[np.flatnonzero(lum[:, c] > 100.0)[0], c] for c in (w // 4, w // 2)]
        assert abs((first[0] - first[1]) - (tops[0] - tops[len(tops) // 2])) < 1.5, curve


def _tongue_pixels(g: mr.MouthGeometry, pose) -> int:
    """Pixels in the lower half of the opening lit well above the cavity and red (the tongue)."""
    res = _interior(g, pose)
    rgb, _alpha, v, v_top, v_bot = res
    depth = (v - v_top) / np.maximum(v_bot - v_top, 1e-3)
    pal = mr.interior_palette(g)
    red = (rgb[..., 0] > 1.3 * rgb[..., 1]) & (_lum(rgb) > 2.0 * _lum(pal["cavity"]))
    return int(np.sum(red & _inside(res) & (depth > 0.5)))


def test_tongue_only_on_wide_openings():
    g = _geometry()
    open_vowel = _tongue_pixels(g, (1.0, 1.0, 0.0, 0.0))
    assert open_vowel > 100
    assert _tongue_pixels(g, (0.3, 0.35, 0.0, 0.0)) == 0  # a small opening: no tongue
    assert _tongue_pixels(g, (1.0, 1.0, 0.0, 1.0)) < 0.6 * open_vowel  # rounded (oo): the tongue is back


def test_lower_teeth_only_when_the_jaw_is_well_open():
    g = _geometry()
    pal = mr.interior_palette(g)

    def lower_teeth(pose) -> int:  # light grey-white pixels just above the lower lip
        res = _interior(g, pose)
        rgb, alpha, v, _v_top, v_bot = res
        near_lip = (v_bot - v > 0.5) & (v_bot - v < 4.0) & (alpha >= 1.0)
        whiteish = (_lum(rgb) > 0.4 * _lum(pal["teeth"])) & (rgb[..., 0] < 1.25 * rgb[..., 1])
        return int(np.sum(near_lip & whiteish))

    assert lower_teeth((1.0, 1.0, 0.0, 0.0)) > 10
    assert lower_teeth((0.5, 0.5, 0.0, 0.0)) == 0


def test_colours_follow_the_face():
    """A darker face gets a darker mouth (teeth still brighter than its skin); nothing drawn is brighter than
    near-white; a cool (bluish) photo gets cooler teeth than a warm one."""
    light = _geometry()
    dark = _geometry(lip=(80.0, 45.0, 40.0), skin=(105.0, 72.0, 55.0))
    pose = (1.0, 1.0, 0.0, 0.0)
    rgb_l, *_ = _interior(light, pose)
    rgb_d, *_ = _interior(dark, pose)
    assert rgb_l.max() <= 245.0 and rgb_d.min() >= 0.0
    assert _lum(rgb_d).max() < _lum(rgb_l).max()
    assert _lum(rgb_d).max() > _lum(dark.skin_rgb)  # teeth still brighter than the (dark) skin
    assert np.percentile(_lum(rgb_d), 50) < np.percentile(_lum(rgb_l), 50)
    cool = _geometry(skin=(200.0, 190.0, 200.0), lip=(170.0, 115.0, 140.0))
    t_warm, t_cool = mr.interior_palette(light)["teeth"], mr.interior_palette(cool)["teeth"]
    assert t_cool[2] / t_cool[0] > t_warm[2] / t_warm[0]


def test_edges_are_anti_aliased():
    """The teeth band's lower edge is a ramp, not a step: in the middle column some pixel lies between the
    cavity and the teeth."""
    res = _interior(_geometry(), (0.6, 0.6, 0.0, 0.0))
    rgb, alpha, *_ = res
    col = _lum(rgb[:, rgb.shape[1] // 2 + 3])
    inside = alpha[:, rgb.shape[1] // 2 + 3] >= 1.0
    hi, lo = col[inside].max(), col[inside].min()
    mid = (col > lo + 0.2 * (hi - lo)) & (col < hi - 0.35 * (hi - lo)) & inside
    assert mid.any()


def test_photo_mouth_reads_as_teeth_and_cavity(data_dir, face_runners):
    """On a shared photo at a 512-px crop, an open vowel shows a light band under the upper lip and a dark
    cavity, both inside the face's colour range."""
    from digital_human.media.frame_source import load_photo
    from digital_human.vision import align_faces
    from digital_human.vision.faces import CropLandmarks

    track = align_faces(load_photo(data_dir / "image" / "face_01_female.jpg"), 0, crop_size=512,
                        runners=face_runners)
    crop = np.asarray(track.crops[0])
    g = mr.mouth_geometry(crop, CropLandmarks(track)[0])
    assert g.iod > 120  # a large face: tooth separations are drawn
    out = mr.render_mouth(crop, g, mr.MouthPose(0.9, 0.9, 0.1, 0.0)).astype(float)
    warp = mr.render_mouth(crop, g, mr.MouthPose(0.9, 0.9, 0.1, 0.0), interior=False).astype(float)
    drawn = np.any(np.abs(out - warp) > 8, -1)
    lum = _lum(out)[drawn]
    assert drawn.sum() > 500
    assert np.percentile(lum, 95) > _lum(g.lip_rgb) and np.percentile(lum, 20) < 0.3 * _lum(g.lip_rgb)
    assert lum.max() <= 245.0
