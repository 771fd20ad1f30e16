"""Context compression: OpenRouter's ``context-compression`` plugin, as its docs describe it.

Endpoints with at most 8,192 tokens of context compress by default; ``plugins: [{"id":
"context-compression", "enabled": false}]`` turns it off, and the plugin named without
``enabled: false`` turns it on anywhere (docs ``guides/features/message-transforms``).
The ``middle-out`` engine drops the middle of a prompt that does not fit: here whole
messages, the middlemost first, keeping the first and the last. Routing counts an
endpoint it can make room on as one the request fits; the answer reports a
``context_compression`` pipeline stage, and the prompt billed is the messages kept
(docs/simulator.md, "Context compression").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from provider_router.testing.chat.synth import count_request_prompt
from provider_router.testing.market.listing import EndpointSpec

__all__ = ["COMPRESSION_CONTEXT", "Compressed", "compress", "compression_setting", "compresses"]

COMPRESSION_CONTEXT: Final = 8_192
"""Endpoints with at most this context compress by default (the docs' "8k")."""
PLUGIN_ID: Final = "context-compression"


def compression_setting(body: Mapping[str, Any]) -> bool | None:
    """The request's word on compression: True (asked for), False (turned off), None
    (not said: the default applies). Malformed ``plugins`` say nothing here."""
    plugins = body.get("plugins")
    if not isinstance(plugins, list):
        return None
    for plugin in plugins:
        if isinstance(plugin, Mapping) and plugin.get("id") == PLUGIN_ID:
            return plugin.get("enabled") is not False
    return None


def compresses(endpoint: EndpointSpec, setting: bool | None) -> bool:
    """Whether the plugin runs for a request served by ``endpoint``."""
    if setting is None:
        return endpoint.context_length <= COMPRESSION_CONTEXT
    return setting


def _fits(endpoint: EndpointSpec, prompt_tokens: int, completion: int) -> bool:
    if prompt_tokens + completion > endpoint.context_length:
        return False
    limit = endpoint.max_prompt_tokens
    return limit is None or prompt_tokens <= limit


@dataclass(frozen=True, slots=True)
class Compressed:
    """A request after middle-out: its body with the messages kept, their prompt tokens,
    and the pipeline stage that says so."""

    body: dict[str, Any]
    prompt_tokens: int
    stage: dict[str, Any]


def compress(
    body: Mapping[str, Any], endpoint: EndpointSpec, max_tokens: int | None
) -> Compressed | None:
    """The request made to fit ``endpoint`` by dropping middle messages, or None when
    even its first and last message with the completion cap do not fit."""
    messages = list(body["messages"])
    original = len(messages)
    completion = max_tokens or 0
    trimmed = dict(body)
    while len(messages) > 2:
        del messages[len(messages) // 2]
        trimmed["messages"] = messages
        prompt_tokens, _ = count_request_prompt(trimmed)
        if _fits(endpoint, prompt_tokens, completion):
            dropped = original - len(messages)
            stage = {
                "type": "context_compression",
                "name": PLUGIN_ID,
                "summary": f"middle-out dropped {dropped} of {original} messages",
                "data": {
                    "engine": "middle-out",
                    "input_type": "messages",
                    "original_count": original,
                    "compressed_count": len(messages),
                },
            }
            return Compressed(trimmed, prompt_tokens, stage)
    return None
