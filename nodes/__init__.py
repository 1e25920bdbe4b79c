"""Node registry: every node class of the pack, keyed by its ComfyUI type name."""
from . import talking_head_nodes, video_nodes, voice_nodes
from .comfy_glue import with_plain_errors

_MODULES = (voice_nodes, video_nodes, talking_head_nodes)
NODE_CLASS_MAPPINGS: dict[str, type] = with_plain_errors(
    {k: v for m in _MODULES for k, v in m.NODE_CLASS_MAPPINGS.items()})
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {k: v for m in _MODULES for k, v in m.NODE_DISPLAY_NAME_MAPPINGS.items()}
