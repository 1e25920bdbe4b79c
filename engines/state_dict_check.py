"""Strict checkpoint loading: what a state dict lacks, holds extra, or holds at the wrong shape, as one message.

Each model's loader raises its own error type with this message (musetalk, latentsync, and sonic through musetalk)."""
from __future__ import annotations

from pathlib import Path


def state_dict_mismatch(state: dict, expected: dict[str, tuple[int, ...]], path: Path, what: str,
                        ignore_prefixes: tuple[str, ...] = ()) -> str | None:
    """None when every expected key is present with its shape and no unknown key is (outside ignore_prefixes);
    else one message naming the missing, unexpected and mis-shaped keys (at most 8 of each)."""
    missing = sorted(k for k in expected if k not in state)
    unexpected = sorted(k for k in state if k not in expected and not k.startswith(ignore_prefixes))
    wrong = sorted(f"{k}: file {tuple(state[k].shape)}, expected {expected[k]}"
                   for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k]))
    if not (missing or unexpected or wrong):
        return None

    def part(title: str, items: list[str]) -> str:
        if not items:
            return ""
        shown = "\n    ".join(items[:8]) + (f"\n    ... and {len(items) - 8} more" if len(items) > 8 else "")
        return f"\n  {len(items)} {title}:\n    {shown}"

    return (f"{path} does not match the {what} architecture of its config"
            + part("missing key(s)", missing) + part("unexpected key(s)", unexpected) + part("shape mismatch(es)", wrong)
            + "\n  Use the release's file and its own config next to it.")
