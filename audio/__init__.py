"""Reference-audio input: decode any common format, clean it, and convert to/from ComfyUI AUDIO."""
from .decode import (
    AudioDecodeError,
    AudioFileNotFoundError,
    AudioInputError,
    EmptyAudioError,
    EmptyAudioFileError,
    decode_audio,
)
from .prepare import (
    NotEnoughSpeechError,
    PreparedAudio,
    SilentAudioError,
    load_reference,
    prepare_reference,
)
from .comfy_audio import from_comfy_audio, to_comfy_audio

__all__ = [
    "AudioInputError", "AudioFileNotFoundError", "EmptyAudioFileError", "AudioDecodeError",
    "EmptyAudioError", "SilentAudioError", "NotEnoughSpeechError", "PreparedAudio",
    "decode_audio", "prepare_reference", "load_reference", "to_comfy_audio", "from_comfy_audio",
]
