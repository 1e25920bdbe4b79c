"""Video I/O and temporal post-processing: ffmpeg location, muxing, probing, smoothing.

Nothing here imports ComfyUI; the VideoMux and TemporalSmooth nodes wrap these functions.
"""
