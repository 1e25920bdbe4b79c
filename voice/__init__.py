"""Voice side of the pack: speaker profiles (DH_SPEAKER), their cache, and voice imitation."""
from .speaker import SpeakerProfile, content_hash, extract_speaker_profile

__all__ = ["SpeakerProfile", "content_hash", "extract_speaker_profile"]
