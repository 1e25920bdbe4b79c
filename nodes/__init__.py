"""Node registry: every node class of the pack, keyed by its ComfyUI type name."""
NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}
