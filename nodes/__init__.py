"""Node registry: every node class of the pack, keyed by its ComfyUI type name."""
from . import video_nodes, voice_nodes

NODE_CLASS_MAPPINGS: dict[str, type] = {**voice_nodes.NODE_CLASS_MAPPINGS, **video_nodes.NODE_CLASS_MAPPINGS}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {**voice_nodes.NODE_DISPLAY_NAME_MAPPINGS,
                                              **video_nodes.NODE_DISPLAY_NAME_MAPPINGS}
