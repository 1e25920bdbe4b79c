"""LatentSync's face geometry, re-implemented (the reference's latentsync/utils/affine_transform.py AlignRestore and
image_processor.py), fed by FaceAlign's face mesh instead of insightface's 106-point detector.

- Three points per frame: the two eyebrow centres and the nose centre, rounded to whole pixels. The reference
  takes means of insightface 2d106 points ([43, 48, 49, 51, 50], [101..105], [74, 77, 83, 86]); the mesh points
  used instead (MESH_*) are the same anatomical features: each brow's ten mesh points (upper and lower edge) and
  four points down the middle of the nose ridge. The 2d106 detector's weights are not available here, so how
  far these centres sit from insightface's on the same faces is NOT measured (said in docs/latentsync.md).
- A similarity transform (Umeyama-style, SVD, reflection removed) from the three points to the template
  [[17, 20], [58, 20], [37.5, 40]] x ratio (ratio = resolution / 256 x 2.8), in a (75 x ratio, 100 x ratio)
  face box, with the reference's temporal smoothing of the translation (`p_bias`: 0.2 old + 0.8 new, in
  normalised units, chained over the reference video's frames in order).
- The face: a bilinear warp with grey (127) fill, truncated to uint8, then a Lanczos-4 resize to resolution x
  resolution (the box is 3:4, so the face is stretched vertically as in training).
- Restore: the generated face resized back to the box (bicubic, antialiased), warped back with the inverse
  transform; the box's mask warped the same way, eroded 2 px, then by 2 x w_edge (w_edge = sqrt(area) // 20)
  and Gaussian-blurred (2 w_edge + 1, sigma 0.3((k - 1) / 2 - 1) + 0.8): the paste weight.
The warps are kornia's warp_affine (align_corners=True, fill mode) written with torch's grid_sample, so no
kornia at run time; benchmarks/latentsync_parity.py measures both against the reference's code.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

# FaceAlign's 468-point mesh (MediaPipe numbering): image-left brow (the subject's right), image-right brow, nose.
MESH_LEFT_BROW = (70, 63, 105, 66, 107, 46, 53, 52, 65, 55)
MESH_RIGHT_BROW = (300, 293, 334, 296, 336, 276, 283, 282, 295, 285)
MESH_NOSE = (197, 195, 5, 4)
TEMPLATE = np.array([[19 - 2, 30 - 10], [56 + 2, 30 - 10], [37.5, 45 - 5]])


def template_for(resolution: int) -> tuple[np.ndarray, tuple[int, int]]:
    """(template points x ratio, (box width, box height)) for a model resolution."""
    ratio = resolution / 256 * 2.8
    return TEMPLATE * ratio, (int(75 * ratio), int(100 * ratio))


def three_points(landmarks: np.ndarray) -> np.ndarray:
    """(3, 2) float64: brow centres and nose centre of a frame's [468, 2+] mesh landmarks, rounded as the reference."""
    lm = np.asarray(landmarks, np.float64)[:, :2]
    pts = [lm[list(MESH_LEFT_BROW)].mean(0), lm[list(MESH_RIGHT_BROW)].mean(0), lm[list(MESH_NOSE)].mean(0)]
    return np.round(np.array(pts))


def transformation_from_points(points1: np.ndarray, points0: np.ndarray, smooth: bool = True,
                               p_bias: torch.Tensor | None = None) -> tuple[np.ndarray, torch.Tensor | None]:
    """(2x3 float32 affine points1 -> points0 with the smoothed translation, the new p_bias)."""
    p2 = torch.tensor(points0, dtype=torch.float32)
    p1 = torch.tensor(points1, dtype=torch.float32)
    c1, c2 = p1.mean(0), p2.mean(0)
    p1c, p2c = p1 - c1, p2 - c2
    s1, s2 = torch.std(p1c), torch.std(p2c)
    p1n, p2n = p1c / s1, p2c / s2
    u, _, v = torch.svd(p1n.T @ p2n)
    r = v @ u.T
    if torch.det(r) < 0:
        v[:, -1] = -v[:, -1]
        r = v @ u.T
    sr = (s2 / s1) * r
    t = c2.reshape(2, 1) - (s2 / s1) * (r @ c1.reshape(2, 1))
    m = torch.cat((sr, t), dim=1)
    if smooth:
        bias = p2n[2] - p1n[2]
        if p_bias is not None:
            bias = p_bias * 0.2 + bias * 0.8
        p_bias = bias
        m[:, 2] = m[:, 2] + bias
    return m.numpy(), p_bias


def smoothed_affines(points: np.ndarray, resolution: int) -> np.ndarray:
    """(N, 2, 3) float32 source -> face-box affines of N frames' three points, smoothed in frame order."""
    template, _ = template_for(resolution)
    out = np.empty((len(points), 2, 3), np.float32)
    bias = None
    for i, p in enumerate(points):
        out[i], bias = transformation_from_points(p, template, True, bias)
    return out


def warp_affine(src: torch.Tensor, m: np.ndarray | torch.Tensor, size: tuple[int, int], fill: float | None) -> torch.Tensor:
    """kornia.geometry.transform.warp_affine(src (B, C, H, W), m (2, 3) src -> dst px, dsize (h, w), bilinear,
    align_corners=True): dst(x, y) = src(m^-1 (x, y)); fill: `padding_mode="fill"` value, None = zeros."""
    b, c, h, w = src.shape
    oh, ow = size
    m3 = torch.eye(3, dtype=torch.float64)
    m3[:2] = torch.as_tensor(np.asarray(m, np.float64))
    inv = torch.linalg.inv(m3)
    ys, xs = torch.meshgrid(torch.arange(oh, dtype=torch.float64), torch.arange(ow, dtype=torch.float64), indexing="ij")
    sx = inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2]
    sy = inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2]
    grid = torch.stack([2 * sx / max(w - 1, 1e-14) - 1, 2 * sy / max(h - 1, 1e-14) - 1], dim=-1)
    grid = grid[None].to(device=src.device, dtype=src.dtype).expand(b, -1, -1, -1)
    out = F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    if fill is None:
        return out
    inside = F.grid_sample(torch.ones_like(src[:, :1]), grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    return out + (1 - inside) * fill


def face_crop(image: np.ndarray, m: np.ndarray, resolution: int) -> np.ndarray:
    """uint8 (res, res, 3): the reference's align_warp_face (warp, grey fill, truncation) + Lanczos-4 resize."""
    import cv2

    _, (bw, bh) = template_for(resolution)
    src = torch.from_numpy(np.array(image, np.float32)).permute(2, 0, 1)[None]
    box = warp_affine(src, m, (bh, bw), 127.0)[0].permute(1, 2, 0).numpy().astype(np.uint8)
    return cv2.resize(box, (resolution, resolution), interpolation=cv2.INTER_LANCZOS4)


def paste_weight(m: np.ndarray, size: tuple[int, int], resolution: int) -> tuple[np.ndarray, np.ndarray]:
    """(paste weight, support) float32 (h, w) of the face box warped back by the inverse of `m` (restore_img's
    masks: the box eroded 2 px = support; eroded by 2 w_edge more and Gaussian-blurred = the weight)."""
    import cv2

    _, (bw, bh) = template_for(resolution)
    m3 = np.eye(3)
    m3[:2] = np.asarray(m, np.float64)
    inv = np.linalg.inv(m3)[:2]
    inv_mask = warp_affine(torch.ones(1, 1, bh, bw), inv, size, None)[0, 0].numpy()
    support = cv2.erode(inv_mask, np.ones((2, 2), np.uint8))
    w_edge = int(float(support.sum()) ** 0.5) // 20
    centre = cv2.erode(support, np.ones((max(1, w_edge * 2),) * 2, np.uint8))
    k = w_edge * 2 + 1
    sigma = 0.3 * ((k - 1) * 0.5 - 1) + 0.8
    soft = cv2.GaussianBlur(centre, (k, k), sigma, borderType=cv2.BORDER_REFLECT_101) if k > 1 else centre
    return soft.astype(np.float32), support


def face_back(face: torch.Tensor, m: np.ndarray, size: tuple[int, int], resolution: int) -> torch.Tensor:
    """restore_img's generated face (3, res, res) in [-1, 1] resized to the face box and warped back into an image
    of `size` (h, w) by the inverse of `m`: float32 (3, h, w) in 0..255 (meaningful inside the support)."""
    _, (bw, bh) = template_for(resolution)
    face = F.interpolate(face.float()[None], size=(bh, bw), mode="bicubic", antialias=True, align_corners=False)
    m3 = np.eye(3)
    m3[:2] = np.asarray(m, np.float64)
    inv = np.linalg.inv(m3)[:2]
    inv_face = warp_affine(face, inv, size, 127.0)[0]
    return (inv_face / 2 + 0.5).clamp(0, 1) * 255


def restore(image: np.ndarray, face: torch.Tensor, m: np.ndarray, resolution: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The reference's restore_img of a generated face (3, res, res) in [-1, 1] into `image` (H, W, 3) uint8 whose
    pixels map to the face box by `m`. Returns (the blended image uint8 as the reference returns it, the face warped
    into the image (uint8; meaningful where the support is > 0), the paste weight float32 (H, W), the support: the
    warped box eroded by 2 px, float32 (H, W), outside which the paste weight is 0)."""
    h, w = image.shape[:2]
    inv_face = face_back(face, m, (h, w), resolution)
    soft, support = paste_weight(m, (h, w), resolution)
    pasted = torch.from_numpy(support)[None] * inv_face
    img = torch.from_numpy(np.array(image, np.float32)).permute(2, 0, 1)
    st = torch.from_numpy(soft)[None]
    back = (st * pasted + (1 - st) * img).permute(1, 2, 0).to(torch.uint8).numpy()
    return back, inv_face.permute(1, 2, 0).to(torch.uint8).numpy(), soft, support
