"""Synthetic completions: token counts, completion lengths and filler text.

Nothing here understands language. Prompt tokens are estimated from characters
(about four per token plus a few per message, as chat templates add), completion
lengths are drawn from a seeded log-normal distribution (or fixed), and the text
is a fixed vocabulary cycled so that ``n`` tokens are always the same ``n`` words.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "IMAGE_PROMPT_TOKENS",
    "CompletionShape",
    "Lengths",
    "count_prompt_tokens",
    "count_request_prompt",
    "filler",
]

IMAGE_PROMPT_TOKENS = 1_024
"""Prompt tokens one input image costs here (a vision encoder's patch tokens)."""

# Request fields a provider renders into the prompt (tool definitions, schemas).
_PROMPT_FIELDS = ("tools", "tool_choice", "response_format")

_WORDS = tuple(
    " ".join(
        [
            "the model writes a short answer about data sets tokens routing price cache",
            "provider latency budget stream quality careful draft training sample output",
            "reason check plan step result value input summary example detail number",
        ]
    ).split(" ")
)
_VOCAB_TOKENS = 4096


def _vocabulary(tokens: list[str]) -> tuple[str, list[int]]:
    return "".join(tokens), list(itertools.accumulate((len(t) for t in tokens), initial=0))


_BLOCK, _OFFSETS = _vocabulary(
    [" " + _WORDS[(i * 7 + i // len(_WORDS)) % len(_WORDS)] for i in range(_VOCAB_TOKENS)]
)
_REASONING_BLOCK, _REASONING_OFFSETS = _vocabulary(
    [
        " Considering" if i % 9 == 0 else " " + _WORDS[(i * 5) % len(_WORDS)]
        for i in range(_VOCAB_TOKENS)
    ]
)


def filler(start: int, stop: int, *, reasoning: bool = False) -> str:
    """The text of tokens ``start`` to ``stop`` (exclusive) of a synthetic output."""
    block, offsets = (_REASONING_BLOCK, _REASONING_OFFSETS) if reasoning else (_BLOCK, _OFFSETS)
    if stop <= start:
        return ""
    first, last = divmod(start, _VOCAB_TOKENS), divmod(stop, _VOCAB_TOKENS)
    if first[0] == last[0]:
        return block[offsets[first[1]] : offsets[last[1]]]
    parts = [block[offsets[first[1]] :]]
    parts.extend(block for _ in range(last[0] - first[0] - 1))
    parts.append(block[: offsets[last[1]]])
    return "".join(parts)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def _count_messages(messages: Sequence[Any]) -> tuple[int, int]:
    """(prompt tokens of the text, image parts) of the messages: about four characters
    per token, plus four per message and three to prime the reply."""
    total = 3
    images = 0
    for message in messages:
        if type(message) is dict:  # what json.loads makes: skip the ABC check
            content = message.get("content")
            if type(content) is str:  # the common case, in one step
                total += 4 + (len(content) + 3) // 4
                continue
        elif isinstance(message, Mapping):
            content = message.get("content")
        else:
            continue
        total += 4 + (len(_text_of(content)) + 3) // 4
        if isinstance(content, list):
            images += sum(
                1
                for part in content
                if isinstance(part, Mapping) and part.get("type") == "image_url"
            )
    return total, images


def count_prompt_tokens(messages: Sequence[Any]) -> int:
    """About four characters per token, plus four per message and three to prime the reply."""
    return _count_messages(messages)[0]


def count_request_prompt(body: Mapping[str, Any]) -> tuple[int, int]:
    """(prompt tokens, input images) of a chat request, as a provider bills them.

    The messages' text, :data:`IMAGE_PROMPT_TOKENS` per image part, and the JSON of
    the fields rendered into the prompt (``tools``, ``tool_choice``, ``response_format``)
    at about four characters per token.
    """
    total, images = _count_messages(body["messages"])
    total += images * IMAGE_PROMPT_TOKENS
    for name in _PROMPT_FIELDS:
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            total += (len(json.dumps(value, separators=(",", ":"))) + 3) // 4
    return total, images


@dataclass(frozen=True, slots=True)
class Lengths:
    """How long completions are: ``fixed`` tokens, or log-normal around ``median``."""

    median: float = 400.0
    sigma: float = 0.6
    fixed: int | None = None

    def draw(self, rng: random.Random) -> int:
        if self.fixed is not None:
            return self.fixed
        return max(1, round(self.median * math.exp(rng.gauss(0.0, self.sigma))))


_EFFORT_SHARE = {"minimal": 0.1, "low": 0.2, "medium": 0.35, "high": 0.55, "xhigh": 0.7, "max": 0.8}


@dataclass(frozen=True, slots=True)
class CompletionShape:
    """The tokens a request will produce: reasoning first, then content."""

    reasoning_tokens: int
    content_tokens: int
    finish_reason: str
    show_reasoning: bool

    @property
    def completion_tokens(self) -> int:
        return self.reasoning_tokens + self.content_tokens


def _reasoning_request(body: Mapping[str, Any]) -> tuple[float, bool, int | None] | None:
    """(share of output spent reasoning, whether to show it, reasoning cap) or None."""
    reasoning = body.get("reasoning")
    include = body.get("include_reasoning")
    effort = body.get("reasoning_effort")
    if reasoning is None and include is None and effort is None:
        return None
    if include is not None and reasoning is None:
        reasoning = {} if include else {"exclude": True}
    if not isinstance(reasoning, Mapping):
        reasoning = {}
    if reasoning.get("enabled") is False:
        return None
    effort = reasoning.get("effort", effort)
    if effort == "none":
        return None
    cap = reasoning.get("max_tokens")
    cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0 else None
    share = _EFFORT_SHARE.get(effort if isinstance(effort, str) else "medium", 0.35)
    return share, not reasoning.get("exclude", False), cap


_PLAIN_SHAPES: dict[tuple[int, int | None], CompletionShape] = {}
"""Shapes of requests without reasoning or tool calls, by (total, max_tokens): a frozen
dataclass is costly to build, and most answers have one of a few shapes."""
_PLAIN_SHAPES_LIMIT = 4096


def shape_completion(
    body: Mapping[str, Any], total: int, max_tokens: int | None, tool_tokens: int | None = None
) -> CompletionShape:
    """Split ``total`` drawn tokens into reasoning and content, honouring max_tokens.

    With ``tool_tokens`` the model calls tools: the content is those tokens, not
    the drawn remainder, and it finishes with ``tool_calls`` unless cut short."""
    wants = _reasoning_request(body)
    if wants is not None or tool_tokens is not None:
        return _shape(wants, total, max_tokens, tool_tokens)
    key = (total, max_tokens)
    shape = _PLAIN_SHAPES.get(key)
    if shape is None:
        if len(_PLAIN_SHAPES) >= _PLAIN_SHAPES_LIMIT:
            _PLAIN_SHAPES.clear()
        shape = _PLAIN_SHAPES[key] = _shape(None, total, max_tokens, None)
    return shape


def _shape(
    wants: tuple[float, bool, int | None] | None,
    total: int,
    max_tokens: int | None,
    tool_tokens: int | None,
) -> CompletionShape:
    """:func:`shape_completion` from the request's reasoning wishes (``_reasoning_request``)."""
    reasoning = 0
    show = False
    if wants is not None:
        share, show, cap = wants
        reasoning = round(total * share)
        if cap is not None:
            reasoning = min(reasoning, cap)
    content = max(total - reasoning, 1)
    finish = "stop"
    if tool_tokens is not None:
        content, finish = tool_tokens, "tool_calls"
    if max_tokens is not None and reasoning + content > max_tokens:
        finish = "length"
        reasoning = min(reasoning, max_tokens)
        content = max_tokens - reasoning
    return CompletionShape(reasoning, content, finish, show)
