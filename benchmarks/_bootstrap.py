"""Import the pack as `digital_human` from a plain checkout (the GPU machine has no pip install of it)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_pack():
    if "digital_human" in sys.modules:
        return sys.modules["digital_human"]
    try:  # installed (pip install -e .), or on PYTHONPATH
        import digital_human

        return digital_human
    except ModuleNotFoundError as exc:
        if exc.name != "digital_human":  # found but broken: never fall back to another copy silently
            raise
    spec = importlib.util.spec_from_file_location("digital_human", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["digital_human"] = module
    spec.loader.exec_module(module)
    return module
