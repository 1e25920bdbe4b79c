"""MuseTalk's optional BiSeNet face-parsing mask: parity with outputs of the reference code (committed
fixture made by benchmarks/musetalk_parsing_parity.py; the full-size random weights are re-made from its
seed), strict loading of face-parse-bisent/, and the paste-mask choice in the MuseTalk renderer."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from digital_human.engines.musetalk import face_parsing as fp  # noqa: E402
from digital_human.engines.musetalk.files import (MuseTalkFilesError, MuseTalkWeightsError,  # noqa: E402
                                                  optional_status)
from digital_human.engines.musetalk.random_release import (bisenet_shapes, resnet18_shapes,  # noqa: E402
                                                           write_face_parsing)
from digital_human.talking_head.musetalk.blend import cut_square, paste_face, parsing_face_mask, square_box  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "musetalk" / "face_parsing.npz"


@pytest.fixture(scope="module")
def fixture() -> dict:
    return dict(np.load(FIXTURE))


@pytest.fixture(scope="module")
def parsing_root(tmp_path_factory, fixture) -> Path:
    root = tmp_path_factory.mktemp("mt_parse")
    write_face_parsing(root, seed=int(fixture["seed"]))
    return root


@pytest.fixture(scope="module")
def parser(parsing_root) -> fp.FaceParser:
    return fp.FaceParser(fp.load_bisenet(parsing_root / "musetalk" / fp.PARSING_FILE))


# --- parity with the reference's FaceParsing and get_image ----------------------------------------------
def test_bisenet_logits_labels_and_mask_match_reference(fixture, parser):
    rgb = np.ascontiguousarray(fixture["image_bgr"][:, :, ::-1])
    box = tuple(int(v) for v in fixture["box"])
    large = cut_square(rgb, square_box(box))
    logits = parser.logits(large)
    s = int(fixture["logit_stride"])
    diff = float(np.abs(logits[:, ::s, ::s] - fixture["logits_strided"]).max())
    labels = logits.argmax(0)
    differing = float((labels != fixture["labels512"]).mean())
    print(f"\nBiSeNet logits max abs diff vs reference {diff:.2e}; label pixels differing {differing:.2e}")
    assert diff <= 1e-4 and differing <= 1e-4
    # the labels are not trivial: skin, nose and mouth are present, so the jaw mode's steps are exercised
    assert all((fixture["labels512"] == k).any() for k in (1, 10, 12))
    assert np.array_equal(fp.labels_to_mask(fixture["labels512"], "jaw"), fixture["mask512_jaw"])
    assert np.array_equal(parser.mask(large, "jaw"), fixture["seg"])


def test_blend_with_parsing_matches_reference(fixture, parser):
    rgb = np.ascontiguousarray(fixture["image_bgr"][:, :, ::-1])
    face = np.ascontiguousarray(fixture["face_bgr"][:, :, ::-1])
    box = tuple(int(v) for v in fixture["box"])
    out = paste_face(rgb, face, box, parsing_face_mask(rgb, box, parser))
    d = int(np.abs(out.astype(int) - fixture["blended_bgr"][..., ::-1].astype(int)).max())
    print(f"\nblended frame max abs diff vs reference get_image: {d}")
    assert d <= 1


def test_jaw_mode_on_a_face_shaped_label_map_matches_reference(fixture):
    # labels drawn from a real face mesh (skin, nose, lips, mouth) through the reference's jaw mode
    ours = fp.labels_to_mask(fixture["ideal_labels512"], "jaw")
    assert np.array_equal(ours, fixture["ideal_mask512_jaw"])
    assert not np.array_equal(ours, fp.labels_to_mask(fixture["ideal_labels512"], "raw"))  # jaw differs from raw


def test_random_release_names_match_the_network():
    with torch.device("meta"):
        net = fp.build_bisenet()
    assert fp.expected_shapes(net) == bisenet_shapes()
    assert fp.expected_shapes(net.cp.resnet) == resnet18_shapes(classifier=False)


# --- strict loading -----------------------------------------------------------------------------------
def _edit(src: Path, dst: Path, change) -> Path:
    state = torch.load(str(src), map_location="cpu", weights_only=True)
    change(state)
    dst.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, str(dst))
    return dst


def test_missing_key_named_with_the_file(tmp_path, parsing_root):
    bad = _edit(parsing_root / "musetalk" / fp.PARSING_FILE, tmp_path / "79999_iter.pth",
                lambda s: s.pop("ffm.conv1.weight"))
    with pytest.raises(MuseTalkWeightsError) as err:
        fp.load_bisenet(bad)
    assert str(bad) in str(err.value) and "missing key" in str(err.value) and "ffm.conv1.weight" in str(err.value)


def test_wrong_shape_and_unexpected_key_named_with_the_file(tmp_path, parsing_root):
    def change(s):
        s["conv_out.conv_out.weight"] = torch.zeros(18, 256, 1, 1)  # 18 classes: not this checkpoint
        s["sp.conv1.conv.weight"] = torch.zeros(1)

    bad = _edit(parsing_root / "musetalk" / fp.PARSING_FILE, tmp_path / "79999_iter.pth", change)
    with pytest.raises(MuseTalkWeightsError) as err:
        fp.load_bisenet(bad)
    msg = str(err.value)
    assert str(bad) in msg and "conv_out.conv_out.weight: file (18, 256, 1, 1), expected (19, 256, 1, 1)" in msg
    assert "sp.conv1.conv.weight" in msg


def test_checkpoint_without_bn_counters_loads_and_equals(tmp_path, parsing_root, parser):
    # checkpoints saved before torch 0.4.1 have no num_batches_tracked; eval never reads them
    old = _edit(parsing_root / "musetalk" / fp.PARSING_FILE, tmp_path / "79999_iter.pth",
                lambda s: [s.pop(k) for k in [k for k in s if k.endswith("num_batches_tracked")]])
    net = fp.load_bisenet(old)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(net(x), parser.net(x))


def test_backbone_file_checked(tmp_path, parsing_root):
    good = parsing_root / "musetalk" / fp.BACKBONE_FILE
    fp.check_backbone(good)  # torchvision's names, with its fc classifier
    bad = _edit(good, tmp_path / "resnet18-5c106cde.pth", lambda s: s.__setitem__("layer1.0.conv1.weight",
                                                                                   torch.zeros(64, 64, 1, 1)))
    with pytest.raises(MuseTalkWeightsError, match="resnet18-5c106cde.pth"):
        fp.check_backbone(bad)


def test_pickled_code_refused(tmp_path):
    path = tmp_path / "79999_iter.pth"
    torch.save({"x": torch.zeros(1), "obj": Path("/")}, str(path))  # a non-tensor object needs pickle
    with pytest.raises(MuseTalkWeightsError, match="79999_iter.pth"):
        fp.load_bisenet(path)


# --- layout: optional, never blocking --------------------------------------------------------------------
def test_optional_files_reported_not_required(tmp_path, parsing_root):
    assert [present for _, present, _ in optional_status(tmp_path)] == [False, False]
    assert [present for _, present, _ in optional_status(parsing_root)] == [True, True]
    with pytest.raises(MuseTalkFilesError, match="face-parse-bisent/79999_iter.pth"):
        fp.require_parsing_file(tmp_path)


def test_setup_check_lists_optional(tmp_path, parsing_root, monkeypatch, capsys):
    import argparse

    from digital_human.cli import _cmd_setup

    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(parsing_root))
    report = _cmd_setup(argparse.Namespace(check="musetalk", wheel_dir=None, only=None))
    out = capsys.readouterr().out
    assert report["optional"] == {fp.PARSING_FILE: True, fp.BACKBONE_FILE: True}
    assert len(report["missing"]) == 7 and "79999_iter.pth" not in " ".join(report["missing"])
    assert "(optional)" in out


# --- the renderer's paste mask: face parsing when placed, else the mesh, said in the warnings -------------
@pytest.fixture(scope="module")
def release_with_parsing(tmp_path_factory, parsing_root):
    pytest.importorskip("diffusers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
    pytest.importorskip("transformers", reason="MuseTalk is an optional extra: pip install .[musetalk]")
    from digital_human.engines.musetalk.random_release import write_release

    root = tmp_path_factory.mktemp("mt_release_parse")
    write_release(root, "reduced", seed=3)
    shutil.copytree(parsing_root / "musetalk" / "face-parse-bisent", root / "musetalk" / "face-parse-bisent")
    return root


@pytest.fixture(scope="module")
def photo_track(data_dir, face_runners):
    from digital_human.media.probe import read_video_frames
    from digital_human.vision import align_faces

    frames, _ = read_video_frames(data_dir / "image" / "face_02_male.png")
    return align_faces(frames, 0, runners=face_runners)


def test_renderer_mask_source(photo_track, release_with_parsing, tmp_path, monkeypatch):
    from digital_human.talking_head.musetalk.blend import blend_mask
    from digital_human.talking_head.musetalk.crops import musetalk_crops

    monkeypatch.delenv("DIGITAL_HUMAN_MUSETALK_MASK", raising=False)
    wave = (0.1 * np.sin(np.arange(8000) * 0.05)).astype(np.float32)  # 0.5 s of a tone: not silent
    gen = musetalk_crops(photo_track, wave, 16000, 25.0, batch_size=4, models_root=release_with_parsing,
                         streaming=True)
    assert any(w.startswith("paste mask: BiSeNet face parsing") for w in gen.warnings)
    m = gen.mask(0)
    s = photo_track.crop_size
    assert m.shape == (s, s) and m.dtype == np.float32 and 0.0 <= m.min() and m.max() <= 1.0 and m.max() > 0.5
    assert "face_parsing" in gen.timings
    # the same as get_image's steps on the crop, done by hand
    from digital_human.talking_head.musetalk.crops import _MuseTalkRenderer

    box = _MuseTalkRenderer(None, photo_track, np.array([0]), None, 1, None).box(0)
    sq = square_box(box)
    parser = fp.cached_parser("cpu", release_with_parsing)
    want = blend_mask(parsing_face_mask(np.asarray(photo_track.crops[0]), box, parser), box, sq)
    xs, ys = sq[0], sq[1]
    x0, y0, x1, y1 = max(sq[0], 0), max(sq[1], 0), min(sq[2], s), min(sq[3], s)
    assert np.allclose(m[y0:y1, x0:x1], want[y0 - ys:y1 - ys, x0 - xs:x1 - xs] / 255.0)

    mesh = musetalk_crops(photo_track, wave, 16000, 25.0, models_root=release_with_parsing, streaming=True,
                          mask="mesh")
    assert any("paste mask: face mesh (chosen" in w for w in mesh.warnings)
    assert not np.allclose(mesh.mask(0), m)
    monkeypatch.setenv("DIGITAL_HUMAN_MUSETALK_MASK", "mesh")
    assert any("chosen by DIGITAL_HUMAN_MUSETALK_MASK" in w for w in musetalk_crops(
        photo_track, wave, 16000, 25.0, models_root=release_with_parsing, streaming=True).warnings)
    monkeypatch.delenv("DIGITAL_HUMAN_MUSETALK_MASK")

    # without the BiSeNet file: the mesh, announced as the fallback; asking for face parsing is an error
    bare = tmp_path / "bare"
    shutil.copytree(release_with_parsing / "musetalk", bare / "musetalk",
                    ignore=shutil.ignore_patterns("face-parse-bisent"))
    fallback = musetalk_crops(photo_track, wave, 16000, 25.0, models_root=bare, streaming=True)
    assert any(w.startswith("paste mask: face mesh (fallback") and "79999_iter.pth" in w for w in fallback.warnings)
    assert np.allclose(fallback.mask(0), mesh.mask(0))
    with pytest.raises(MuseTalkFilesError, match="79999_iter.pth"):
        musetalk_crops(photo_track, wave, 16000, 25.0, models_root=bare, mask="face-parsing")
    with pytest.raises(ValueError, match="mask must be one of"):
        musetalk_crops(photo_track, wave, 16000, 25.0, models_root=bare, mask="bisenet")
