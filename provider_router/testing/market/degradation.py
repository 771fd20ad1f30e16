"""What an endpoint really serves, whatever it declares: a simulation of degradation.

A market endpoint may carry ``serves: {agreement: 0.7, tool_schema_error_rate: 0.2,
prompt_token_skew: 1.05, after_requests: K}``: it still lists its declared
quantization, but its answers differ measurably from the model's own (a share of
content tokens replaced, tool arguments that break their schema, prompt tokens
reported and billed skewed), from its (K+1)-th request on (:class:`Onsets` counts by
arrival, so a test scripts "degraded after a third of the job" exactly). Every choice
is drawn from the simulator's seed, the endpoint's tag and the request's messages. A
simulation of what a verifier looks for (docs/simulator.md), not a model of any real
provider.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

from provider_router.testing.chat.synth import filler
from provider_router.testing.chat.tools import PlannedCall, split_pieces

__all__ = ["Onsets", "Serves", "request_salt"]

_E = TypeVar("_E")

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
    after_requests: int = 0
    """Requests served honestly before the degradation starts (0: from the first)."""

    def __post_init__(self) -> None:
        if self.after_requests < 0:
            raise ValueError(f"after_requests must be ≥ 0, got {self.after_requests}")
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


class Onsets:
    """When each endpoint with a delayed ``serves`` turns degraded: it counts, per
    endpoint tag, the requests served, and says whether the next one is degraded."""

    def __init__(self) -> None:
        self._served: dict[str, int] = {}
        self._honest: dict[str, Any] = {}

    def degraded(self, tag: str, serves: Serves | None) -> bool:
        """Count one request served by ``tag``; whether it is served degraded."""
        if serves is None:
            return False
        count = self._served.get(tag, 0) + 1
        self._served[tag] = count
        return count > serves.after_requests

    def honest(self, tag: str, endpoint: _E) -> _E:
        """``endpoint`` serving the model's own answers (its ``serves`` dropped), made once."""
        twin = self._honest.get(tag)
        if twin is None:
            twin = self._honest[tag] = replace(cast(Any, endpoint), serves=None)
        return cast(_E, twin)
