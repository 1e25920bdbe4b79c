"""The talking-head pipeline: speech + aligned faces -> lip-synced frames or a video.

One folder per model (`portrait/`, `clone/`, `musetalk/`), each exposing a `MODEL` that meets
contract.py, listed in registry.py. Shared by all: the output-frame driver (clock, reference-frame
schedule, paste-back, input checks) in driver.py, the headless streaming renderer in render_video.py,
and the log-mel speech windows in audio_features.py. Networks, their files and the engine backends
live in engines/ (engines/clone_model.py, engines/musetalk/); lip-sync metrics in vision/lipsync_metrics.py.
"""
from .driver import (
                     LOOP_MODES,
                     AudioInputError,
                     TalkingHeadResult,
                     frame_schedule,
                     output_frame_count,
                     render_frames,
                     schedule_track,
                     validate_audio,
                     validate_track,
)
from .portrait.animate import animate_portrait

__all__ = ["LOOP_MODES", "AudioInputError", "TalkingHeadResult", "animate_portrait", "frame_schedule",
           "output_frame_count", "render_frames", "schedule_track", "validate_audio", "validate_track"]
