"""A command's input-independent set-up, started on a background thread while its inputs are checked.

`run` spends its first seconds on one core (checking and decoding the voice clip and the face), while
importing torch (1.5-2.5 s on a 2-core VM) and opening Kokoro's ONNX Runtime session (1.3-2 s, with the
GIL released) wait for them although they depend on no input. The warm-up does both meanwhile; the
main path then finds torch imported and the session in the loader's cache (engines/loader.py loads one
model per key at a time, so it waits for a load in progress instead of repeating it).

Nothing here reports errors: a failed warm-up is logged at debug level and the main path loads the
same things itself, with its own clear messages. Only the CLI and batch workers call this; inside
ComfyUI the process and its imports are ComfyUI's. The CLI waits for the thread before it exits
(wait_for_warmup): a process that ends while ONNX Runtime is still building a session on another
thread aborts in C++ ("terminate called without an active exception"), e.g. when an input check fails
at once.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("digital_human")
_STARTED: list[threading.Thread] = []
_STOP = threading.Event()  # set by wait_for_warmup: what has not started yet is skipped


def _import_scipy_stats() -> None:
    """Import scipy.stats whole before the warm-up imports torch. Why: scipy.stats builds its docs at import, and its
    array-API checks read sys.modules["torch"]; with torch half-imported on the warm-up thread, the main thread's
    librosa -> scipy.signal -> scipy.stats import failed with "partially initialized module 'torch' has no attribute
    'Tensor'" (README's first command, 2026-12-03, the first run after setup). On the calling thread, not the
    warm-up's: two threads importing parts of scipy at once fail too (KeyError 'scipy', seen here). ~0.7 s on
    2 cores, which the run needs anyway (librosa)."""
    try:
        import scipy.stats  # noqa: F401
    except ImportError:  # librosa brings scipy; without it there is nothing to race
        pass


def start_warmup(tts_backend: str | None = None) -> threading.Thread:
    """Start the warm-up thread: import torch; with `tts_backend`, also load Kokoro's session on it."""

    def warm() -> None:
        try:
            if tts_backend is not None:
                from .engines import loader
                from .engines.kokoro.synth import kokoro_model_spec

                # first, while the main thread's input checks hold the GIL: ONNX Runtime builds the session
                # without it (and the loader asks torch about CUDA only where a GPU driver exists). The same
                # spec, backend and precision as voice.tts.synthesize_speech asks for.
                loader.get(kokoro_model_spec("fp32"), backend=tts_backend, precision="auto", stage="voice")
            scipy_imported.wait()  # torch only once scipy.stats is whole (_import_scipy_stats)
            if not _STOP.is_set():  # a run that already ended (a bad input) does not wait for torch
                import torch  # noqa: F401  (then: the AUDIO dicts and the talking-head path need it)
        except Exception as exc:  # the main path meets the same problem and says it properly
            log.debug("warm-up stopped early: %s", exc)

    # daemon: a Python-level exit never hangs on it; main() still joins it (wait_for_warmup)
    _STOP.clear()
    scipy_imported = threading.Event()
    thread = threading.Thread(target=warm, name="dh-warmup", daemon=True)
    thread.start()
    _STARTED.append(thread)
    try:
        _import_scipy_stats()  # meanwhile the warm-up builds Kokoro's session
    finally:
        scipy_imported.set()
    return thread


def wait_for_warmup() -> None:
    """Before the process exits: skip what the warm-up has not started yet and wait for what it is doing
    (a session build cannot be interrupted; an input error at once waits for its end, ~1-2 s on 2 cores)."""
    _STOP.set()
    while _STARTED:
        _STARTED.pop().join()
