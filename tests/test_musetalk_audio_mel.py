"""MuseTalk's log-mel over the speech only (engines/musetalk/audio.log_mel) equals whisper's extractor, which pads
every call to 30 s: live mode computes one per speech piece (0.3-1 s), so most of that work was of zeros."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers", reason="MuseTalk is an optional extra: pip install .[musetalk]")


@pytest.mark.parametrize("samples", [0, 1, 159, 7680, 52801, 480000])
def test_log_mel_equals_the_extractors(samples):
    from transformers import WhisperFeatureExtractor

    from digital_human.engines.musetalk.audio import log_mel

    extractor = WhisperFeatureExtractor(feature_size=80)
    wave = (0.3 * np.random.default_rng(samples).standard_normal(samples)).astype(np.float32)
    ref = extractor(wave, return_tensors="pt", sampling_rate=16000).input_features
    got = log_mel(extractor, wave)
    assert got.shape == ref.shape == (1, 80, 3000)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=0, atol=1e-5)


def test_log_mel_refuses_more_than_one_segment():
    from transformers import WhisperFeatureExtractor

    from digital_human.engines.musetalk.audio import log_mel

    with pytest.raises(ValueError, match="at most 480000 samples"):
        log_mel(WhisperFeatureExtractor(feature_size=80), np.zeros(480001, np.float32))
