"""What a chat request can be billed for, or why it cannot be priced.

The ledger reserves a request's worst case before it is sent, so the worst case must
bound every charge the request can cause on any allowed endpoint: its prompt (the
UTF-8 bytes of its text, since a byte-level BPE token is at least one byte, plus
template overhead, the structured fields a provider renders into the prompt, and
:data:`IMAGE_PROMPT_TOKENS_BOUND` tokens per image), its completion (the largest of
``max_tokens``, ``max_completion_tokens`` and ``reasoning.max_tokens``) and its fees.
A field that could add a charge the reservation cannot bound (``n > 1``, ``models``
fallbacks, plugins other than ``context-compression`` or one turned off, priced
``service_tier`` values, audio or file parts...) is refused with a
:class:`~provider_router.ConfigurationError` that names it and says why.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from provider_router._exceptions import ConfigurationError

__all__ = [
    "IMAGE_PROMPT_TOKENS_BOUND",
    "MESSAGE_OVERHEAD_TOKENS",
    "REQUEST_OVERHEAD_TOKENS",
    "Billable",
    "check_fields",
    "completion_cap",
    "field_tokens",
    "measure",
    "measure_messages",
]

MESSAGE_OVERHEAD_TOKENS: Final = 8
"""Template tokens a chat message adds around its content (role markers, separators)."""
REQUEST_OVERHEAD_TOKENS: Final = 16
"""Template tokens a request adds once (the assistant turn's opening)."""
IMAGE_PROMPT_TOKENS_BOUND: Final = 16_384
"""The most prompt tokens one input image is assumed to cost.

Vision encoders turn an image into patch tokens: a few hundred for a small image,
about 4,000 for a 4K image at 28-pixel patches; this bound holds with room to spare.
"""

_encode: Final = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode

# Fields whose charge the reservation cannot bound, and why (docs/client.md).
_REFUSED: Final[Mapping[str, str]] = {
    "models": "model fallbacks can be served by other models at other prices, "
    "and the reservation prices one model",
    "route": "'route' turns on model fallbacks at other prices",
    "web_search_options": "web search adds per-search fees the reservation cannot bound",
    "prediction": "rejected predicted tokens are billed as completion tokens "
    "beyond the completion cap",
    "audio": "audio output is billed at audio prices the reservation does not assume",
}
_FREE_PLUGINS: Final = frozenset({"context-compression"})
"""Plugins that add no fee: context compression only ever shortens the prompt."""
# ``service_tier`` values billed at no more than the listed price.
_FREE_TIERS: Final = frozenset({"default", "flex"})
_TEXT_PARTS: Final = frozenset({"text"})
_IMAGE_PARTS: Final = frozenset({"image_url"})
_MESSAGE_EXTRAS: Final = ("tool_calls", "name", "tool_call_id", "reasoning")


@dataclass(frozen=True, slots=True)
class Billable:
    """The billable size of one request's messages.

    Attributes:
        prompt_tokens: an upper bound on the text prompt tokens (images excluded).
        images: image parts: each costs up to :data:`IMAGE_PROMPT_TOKENS_BOUND`
            prompt tokens and the per-image fee.
    """

    prompt_tokens: int
    images: int = 0

    @property
    def estimate(self) -> int:
        """All prompt tokens assumed, image tokens included."""
        return self.prompt_tokens + self.images * IMAGE_PROMPT_TOKENS_BOUND


def _refuse(where: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"{where}: refused, {why} (docs/client.md, 'What is reserved')")


def check_fields(fields: Mapping[str, Any], where: str = "chat()") -> None:
    """Refuse request fields whose charge a reservation cannot bound.

    Raises:
        ConfigurationError: names the field and says why it cannot be priced.
    """
    for name in fields:
        why = _REFUSED.get(name)
        if why is not None and fields[name] is not None:
            raise _refuse(f"{where} field {name!r}", why)
    plugins = fields.get("plugins")
    if plugins is not None:
        _check_plugins(plugins, where)
    n = fields.get("n")
    if n is not None and n != 1:
        raise _refuse(
            f"{where} field 'n'={n!r}",
            "each of n choices is billed but only the first is kept; send n requests instead",
        )
    tier = fields.get("service_tier")
    if tier is not None and tier not in _FREE_TIERS:
        raise _refuse(
            f"{where} field 'service_tier'={tier!r}",
            f"a tier other than {sorted(_FREE_TIERS)} may be billed above the listed prices",
        )
    modalities = fields.get("modalities")
    if modalities is not None and list(modalities) != ["text"]:
        raise _refuse(
            f"{where} field 'modalities'={modalities!r}",
            "image or audio output is billed at prices the reservation does not assume",
        )
    tools = fields.get("tools")
    if tools is not None:
        for i, tool in enumerate(tools):
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            if kind != "function":
                raise _refuse(
                    f"{where} field 'tools[{i}]' of type {kind!r}",
                    "server-side tools add fees; only 'function' tools are priced",
                )
    for name in ("max_tokens", "max_completion_tokens"):
        value = fields.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(
                f"{where} field {name!r} must be a positive int, got {value!r}"
            )


def _check_plugins(plugins: object, where: str) -> None:
    """Plugins are refused, except one turned off (``enabled: false``) and
    ``context-compression``: neither adds a fee."""
    if not isinstance(plugins, list | tuple):
        raise _refuse(f"{where} field 'plugins'", "it must be a list of plugin objects")
    for i, plugin in enumerate(plugins):
        name = plugin.get("id") if isinstance(plugin, Mapping) else None
        if isinstance(plugin, Mapping) and (
            plugin.get("enabled") is False or name in _FREE_PLUGINS
        ):
            continue
        raise _refuse(
            f"{where} field 'plugins' (entry {i}, {name!r})",
            "plugins (web search, file parsing) add fees the reservation cannot bound; "
            "only turning a plugin off, or context-compression, is priced",
        )


def completion_cap(max_tokens: int | None, fields: Mapping[str, Any]) -> int | None:
    """The most completion tokens a request can be billed for: the larger cap given.

    A ``reasoning.max_tokens`` above the caps counts too: some providers raise the
    completion limit to fit the reasoning budget (reserving more is the safe side).
    """
    if max_tokens is None:
        max_tokens = fields.get("max_tokens")
    caps = [c for c in (max_tokens, fields.get("max_completion_tokens")) if c is not None]
    if not caps:
        return None
    reasoning = fields.get("reasoning")
    if isinstance(reasoning, Mapping):
        budget = reasoning.get("max_tokens")
        if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
            caps.append(budget)
    return max(int(c) for c in caps)


def field_tokens(fields: Mapping[str, Any]) -> int:
    """An upper bound on the prompt tokens structured fields add (``tools``, schemas...).

    Their compact JSON's UTF-8 length bounds the text a provider renders from them.
    Scalar fields (``temperature``...) render nothing.
    """
    total = 0
    for value in fields.values():
        if isinstance(value, Mapping | list | tuple):
            total += len(_encode(value).encode())
        elif isinstance(value, str):
            total += len(value.encode())
    return total


def _content_tokens(content: Any, where: str) -> tuple[int, int]:
    if isinstance(content, str):
        return len(content.encode()), 0
    if not isinstance(content, list | tuple):
        # An unusual payload: its JSON text bounds what a provider renders.
        return len(_encode(content).encode()), 0
    tokens = images = 0
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXT_PARTS:
            text = part.get("text")
            tokens += len(text.encode()) if isinstance(text, str) else len(_encode(text).encode())
        elif kind in _IMAGE_PARTS:
            images += 1
        else:
            raise _refuse(
                f"{where}.content[{j}] of type {kind!r}",
                "only 'text' and 'image_url' parts are priced (audio, file and video "
                "parts carry fees the reservation cannot bound)",
            )
    return tokens, images


def measure_messages(messages: Iterable[Mapping[str, Any]]) -> Billable:
    """The billable size of ``messages``, without a tokenizer.

    Byte-level BPE tokenizers (Kimi's included) emit at least one byte per token,
    so the UTF-8 length of the text bounds its token count; each message adds
    :data:`MESSAGE_OVERHEAD_TOKENS` of template. It overestimates ordinary text
    about fourfold, which only makes the prompt part of a reservation (small
    beside the completion cap) safely large.

    Raises:
        ConfigurationError: a content part that cannot be priced (audio, file...).
    """
    return Billable(*measure(messages))


def measure(messages: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    """:func:`measure_messages` as ``(prompt_tokens, images)``, without the object
    (the router measures every request)."""
    total = REQUEST_OVERHEAD_TOKENS
    images = 0
    for i, message in enumerate(messages):
        total += MESSAGE_OVERHEAD_TOKENS
        content = message.get("content")
        if isinstance(content, str):
            total += len(content.encode())
        elif content is not None:
            tokens, found = _content_tokens(content, f"messages[{i}]")
            total += tokens
            images += found
        for key in _MESSAGE_EXTRAS:
            extra = message.get(key)
            if extra:
                text = extra if isinstance(extra, str) else repr(extra)
                total += len(text.encode())
    return total, images
