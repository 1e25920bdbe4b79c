"""Prompt-time checks (VALIDATE_INPUTS) and how the pack's errors reach ComfyUI."""
from __future__ import annotations

import pytest

from digital_human.audio.decode import AudioDecodeError
from digital_human.nodes.comfy_glue import plain_exception, require_fps, with_plain_errors
from digital_human.nodes.talking_head_nodes import TalkingHeadVideo, TrainAvatar
from digital_human.nodes.video_nodes import FrameRate, VideoMux
from digital_human.nodes.voice_nodes import ExtractSpeakerEmbedding
from digital_human.vision.faces import NoFaceError


@pytest.mark.parametrize("name", ["../../../escaped", "a/b", "/etc/x", "..\\x", ".hidden", "C:x"])
def test_save_name_must_be_plain(name: str) -> None:
    message = ExtractSpeakerEmbedding.VALIDATE_INPUTS(save_name=name)
    assert isinstance(message, str) and message.startswith("save_name") and "my_voice" in message
    assert "/root" not in message and "custom_nodes" not in message


@pytest.mark.parametrize("name", ["", "my_voice", "Anna 2"])
def test_plain_save_names_pass(name: str) -> None:
    assert ExtractSpeakerEmbedding.VALIDATE_INPUTS(save_name=name) is True


@pytest.mark.parametrize("prefix", ["../out", "/tmp/x", "a/../../b", "", "C:\\x"])
def test_filename_prefix_must_stay_in_output(prefix: str) -> None:
    for node in (VideoMux, TalkingHeadVideo):
        message = node.VALIDATE_INPUTS(filename_prefix=prefix)
        assert isinstance(message, str) and "filename_prefix" in message and "digital_human/clone" in message


def test_good_prefix_and_model_pass() -> None:
    assert VideoMux.VALIDATE_INPUTS(filename_prefix="digital_human/clone_from_photo") is True
    assert TalkingHeadVideo.VALIDATE_INPUTS(model="portrait", filename_prefix="digital_human/x") is True
    assert "not found" in TalkingHeadVideo.VALIDATE_INPUTS(model="clone:no_such_avatar_here", filename_prefix="x")


@pytest.mark.parametrize("name,ok", [("my_avatar", True), ("andrew 01", True), ("", False), ("a/b", False),
                                     ("..", False), ("-x", False)])
def test_avatar_name(name: str, ok: bool) -> None:
    result = TrainAvatar.VALIDATE_INPUTS(name=name)
    assert (result is True) == ok, result
    if not ok:
        assert result.startswith("name")


def test_zero_fps_fails_before_work() -> None:
    with pytest.raises(ValueError, match="Frame Rate: fps is 0; the frame rate must be above 0"):
        FrameRate().value(0.0)
    assert FrameRate().value(25.0) == (25.0,)
    assert FrameRate.INPUT_TYPES()["required"]["fps"][1]["min"] >= 1  # ComfyUI refuses 0 when queued
    with pytest.raises(ValueError, match="TRT_TalkingHead: fps is -1"):
        require_fps(-1, "TRT_TalkingHead")


def test_pack_exceptions_become_builtin_ones() -> None:
    plain = plain_exception(AudioDecodeError("could not decode 'x.wav'"))
    assert type(plain) is ValueError and str(plain) == "could not decode 'x.wav'"
    builtin = FileNotFoundError("gone")
    assert plain_exception(builtin) is builtin
    foreign = pytest.fail.Exception("not ours")  # a third-party class stays as it is
    assert plain_exception(foreign) is foreign


def test_node_functions_raise_builtin_exceptions_inside_comfyui() -> None:
    class Node:
        FUNCTION = "run"

        def run(self, x: int):
            if x:
                raise NoFaceError("no face found in the photo 'cat.jpg'")
            return (x,)

    with_plain_errors({"Node": Node}, force=True)
    assert Node().run(0) == (0,)
    with pytest.raises(ValueError) as caught:
        Node().run(1)
    assert type(caught.value) is ValueError and "cat.jpg" in str(caught.value)
    assert isinstance(caught.value.__cause__, NoFaceError)  # the log keeps the original


def test_missing_musetalk_files_are_listed_without_the_server_path(tmp_path, monkeypatch) -> None:
    # the refusal goes to whoever sent the prompt: each missing file relative to models/digital_human
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path))
    message = TalkingHeadVideo.VALIDATE_INPUTS(model="musetalk", filename_prefix="digital_human/x")
    assert isinstance(message, str) and "models/digital_human/musetalk/musetalkV15/unet.pth" in message
    assert "whisper/preprocessor_config.json" in message and "nothing is downloaded" in message
    assert str(tmp_path) not in message
