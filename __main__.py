"""`python -m digital_human ...` runs the command line (same node code as in ComfyUI)."""
from .cli import main

raise SystemExit(main())
