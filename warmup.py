"""A command's input-independent set-up, started on a background thread while its inputs are checked.

`run` spends its first seconds on one core (checking and decoding the voice clip and the face), while
importing torch (1.5-2.5 s on a 2-core VM) and opening Kokoro's ONNX Runtime session (1.3-2 s, with the
GIL released) wait for them although they depend on no input. The warm-up does both meanwhile; the
main path then finds torch imported and the session in the loader's cache (engines/loader.py loads one
model per key at a time, so it waits for a load in progress instead of repeating it).

Nothing here reports errors: a failed warm-up is logged at debug level and the main path loads the
same things itself, with its own clear messages. Only the CLI and batch workers call this; inside
ComfyUI the process and its imports are ComfyUI's.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("digital_human")


def start_warmup(tts_backend: str | None = None) -> threading.Thread:
    """Start the warm-up thread: import torch; with `tts_backend`, also load Kokoro's session on it."""

    def warm() -> None:
        try:
            import torch  # noqa: F401  (the talking-head path and AUDIO dicts need it later)

            if tts_backend is not None:
                from .engines import loader
                from .engines.kokoro.synth import kokoro_model_spec

                # the same spec, backend and precision as voice.tts.synthesize_speech asks for
                loader.get(kokoro_model_spec("fp32"), backend=tts_backend, precision="auto", stage="voice")
        except Exception as exc:  # the main path meets the same problem and says it properly
            log.debug("warm-up stopped early: %s", exc)

    # daemon: a run that stops at a bad input must exit at once, not after the warm-up
    thread = threading.Thread(target=warm, name="dh-warmup", daemon=True)
    thread.start()
    return thread
