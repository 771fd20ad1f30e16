"""How many lines the batch route may send now toward a dataset's targets.

A dataset may cap its requests and set an output-token target. Batches answer late,
so lines go in waves: what is done plus what is in batches stays within the cap,
and a wave covers what the target still needs at the mean answer length seen so far
(``max_tokens`` before any), shrunk while few lines were seen.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["WAVE_SHARE", "WAVE_TAIL_LINES", "wave_room"]

WAVE_SHARE: Final = 0.95
"""The most of the lines an output-token target still needs that one wave sends."""
WAVE_TAIL_LINES: Final = 20
"""When no more than this many lines are left to a target, they go in one wave."""


def wave_room(
    target: int | None,
    cap: int | None,
    completed: int,
    output_tokens: int,
    max_tokens: int,
    live: int,
) -> int:
    """Lines that may go now: ``completed`` lines wrote ``output_tokens``, ``live`` are
    in batches; ``target`` output tokens and ``cap`` requests (None: no limit)."""
    room = 1 << 62
    if cap is not None:
        room = min(room, cap - completed - live)
    if target is not None:
        per_line = output_tokens / completed if completed else max_tokens
        left = target - output_tokens
        lines = left / max(per_line, 1)
        # A wave covers what is left at the observed mean, shrunk so that a mean
        # read from few lines (answer lengths vary about as much as their mean) two
        # standard errors too low still does not overshoot; the last few go at once.
        share = min(WAVE_SHARE, 1 / (1 + 2 / math.sqrt(max(completed, 1))))
        wave = lines if lines <= WAVE_TAIL_LINES else lines * share
        room = min(room, math.ceil(wave) - live if left > 0 else 0)
    return max(room, 0)
