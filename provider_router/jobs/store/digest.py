"""The request digest: which request an output row answers, as one short string.

Every output row carries the digest of the request it answers (``request_digest``,
docs/output.md): the first 32 hex digits of the SHA-256 of the canonical JSON (keys
sorted, no whitespace, UTF-8 as is) of what is sent that decides the answer: the
``model``, the ``messages``, and every generation field sent with them (``temperature``,
``top_p``, ``reasoning``, ``tools``, ``tool_choice``, ``response_format``...; a prompt
line's own ``tools`` / ``tool_choice`` over its dataset's). Left out: ``stream`` and the
``provider`` routing object (how and by whom the answer comes), and ``max_tokens``
(where it is cut: each row records its own; ``run --redo-truncated`` sends the cut ones
again with a larger cap). A prompt whose content changed under its id has another
digest: a resume tells an answer to the old text from one to the new.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from provider_router._types import Message
from provider_router.planning.prompts import Prompt

__all__ = ["DIGEST_HEX", "NOT_DIGESTED", "RequestDigest", "request_digest", "request_fields"]

DIGEST_HEX: Final = 32
"""Hex digits of the SHA-256 kept (128 bits: no two requests of a job share one)."""
NOT_DIGESTED: Final = frozenset({"stream", "stream_options", "provider", "usage", "max_tokens"})
"""Request fields that decide how or by whom an answer comes, or where it is cut, not
what it answers."""

_canonical: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False
).encode
_MARK: Final = "\x00messages\x00"
"""Stands for the messages while a dataset's fields are encoded once (JSON escapes it)."""


def request_fields(params: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """The generation fields one prompt is sent with: its dataset's ``params``, and the
    prompt line's ``own`` (``tools``, ``tool_choice``) over them."""
    return {**params, **own} if own else dict(params)


def _hexdigest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_HEX]


def request_digest(model: str, messages: Sequence[Message], params: Mapping[str, Any]) -> str:
    """The digest of a request for ``model`` of ``messages`` with the generation fields
    ``params`` (see the module docstring)."""
    body = {k: v for k, v in params.items() if k not in NOT_DIGESTED}
    body["model"] = model
    body["messages"] = messages
    return _hexdigest(_canonical(body))


class RequestDigest:
    """The digests of one dataset's requests, its model and fields encoded once.

    ``RequestDigest(model, params)(messages, own)`` equals
    ``request_digest(model, messages, request_fields(params, own))``; a prompt without
    fields of its own costs one encoding of its messages.
    """

    __slots__ = ("_head", "_tail", "model", "params")

    def __init__(self, model: str, params: Mapping[str, Any]) -> None:
        self.model = model
        self.params = {k: v for k, v in params.items() if k not in NOT_DIGESTED}
        text = _canonical({**self.params, "model": model, "messages": _MARK})
        self._head, _, self._tail = text.partition(_canonical(_MARK))

    def __call__(self, messages: Sequence[Message], own: Mapping[str, Any] | None = None) -> str:
        if own:
            return request_digest(self.model, messages, request_fields(self.params, own))
        return _hexdigest(self._head + _canonical(messages) + self._tail)

    def of(self, prompt: Prompt) -> str:
        """The digest of ``prompt`` as this dataset sends it."""
        return self(prompt.messages, prompt.request_fields)
