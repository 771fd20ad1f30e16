"""What an endpoint really serves, whatever it declares: a simulation of degradation.

A market endpoint may carry ``serves: {agreement: 0.7, tool_schema_error_rate: 0.2,
prompt_token_skew: 1.05}``: it still lists its declared quantization (``int4``), but
its answers differ measurably from the model's own:

- ``agreement`` is the share of content tokens that are the model's (the others are
  another word of the vocabulary), so a greedy comparison against an honest endpoint
  measures about this share;
- ``tool_schema_error_rate`` is the share of tool calls whose arguments break the
  function's schema (alternately: not JSON, or an empty object missing its required
  properties);
- ``prompt_token_skew`` scales the prompt tokens it reports and bills (a different
  chat template shows here).

Every choice is drawn from the simulator's seed, the endpoint's tag and the request's
messages, so the same request to the same endpoint is degraded the same way. This is a
simulation of the kinds of degradation a verifier looks for (docs/simulator.md), not a
model of any real provider.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from provider_router.testing.synth import filler
from provider_router.testing.tools import PlannedCall, split_pieces

__all__ = ["Serves", "request_salt"]

_SWAPS = (" quietly", " sideways", " purple", " seventeen", " lattice", " orbit")
"""Words the model never writes: a swapped token never equals the model's own by chance."""


def request_salt(seed: int, tag: str, messages: Sequence[Any]) -> int:
    """A number fixed by the simulator's seed, the endpoint and the request's messages."""
    text = json.dumps(messages, sort_keys=True, default=str, separators=(",", ":"))
    return zlib.crc32(f"{seed}:{tag}:{text}".encode())


@dataclass(frozen=True, slots=True)
class Serves:
    """How an endpoint's answers depart from the model's (1, 0, 1: they do not)."""

    agreement: float = 1.0
    tool_schema_error_rate: float = 0.0
    prompt_token_skew: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.agreement <= 1.0:
            raise ValueError(f"agreement must be within 0..1, got {self.agreement}")
        if not 0.0 <= self.tool_schema_error_rate <= 1.0:
            raise ValueError(
                f"tool_schema_error_rate must be within 0..1, got {self.tool_schema_error_rate}"
            )
        if not 0.5 <= self.prompt_token_skew <= 2.0:
            raise ValueError(
                f"prompt_token_skew must be within 0.5..2, got {self.prompt_token_skew}"
            )

    def prompt_tokens(self, tokens: int) -> int:
        """The prompt tokens this endpoint reports (and bills) for ``tokens``."""
        if self.prompt_token_skew == 1.0:
            return tokens
        return max(1, round(tokens * self.prompt_token_skew))

    def text(self, start: int, stop: int, salt: int, *, reasoning: bool = False) -> str:
        """Content tokens ``start`` to ``stop``, each the model's with ``agreement``'s odds."""
        if self.agreement >= 1.0:
            return filler(start, stop, reasoning=reasoning)
        words = []
        for index in range(start, stop):
            draw = random.Random(salt * 1_000_003 + index).random()
            if draw < self.agreement:
                words.append(filler(index, index + 1, reasoning=reasoning))
            else:
                words.append(_SWAPS[index % len(_SWAPS)])
        return "".join(words)

    def calls(self, calls: tuple[PlannedCall, ...], salt: int) -> tuple[PlannedCall, ...]:
        """The calls as this endpoint makes them: some with arguments that break the schema."""
        if self.tool_schema_error_rate <= 0.0 or not calls:
            return calls
        out = []
        for i, call in enumerate(calls):
            rng = random.Random(salt * 7_919 + i)
            if rng.random() < self.tool_schema_error_rate:
                cut = rng.random() < 0.5
                broken = call.arguments[: max(1, len(call.arguments) // 2)] if cut else "{}"
                if broken == call.arguments:  # "{}" for a function without parameters
                    broken = "{"
                call = replace(call, arguments=broken, pieces=split_pieces(broken))
            out.append(call)
        return tuple(out)
