"""Talking-head models: `portrait` (zero-shot, no weights) and `clone` (trained per person).

The shared output-frame driver (clock, reference-frame schedule, paste-back, input checks) is in
driver.py; lip-sync metrics are in vision/lipsync_metrics.py.
"""
from .driver import (LOOP_MODES, AudioInputError, TalkingHeadResult, frame_schedule, output_frame_count,
                     render_frames, schedule_track, validate_audio, validate_track)
from .portrait import animate_portrait

__all__ = ["LOOP_MODES", "AudioInputError", "TalkingHeadResult", "animate_portrait", "frame_schedule",
           "output_frame_count", "render_frames", "schedule_track", "validate_audio", "validate_track"]
