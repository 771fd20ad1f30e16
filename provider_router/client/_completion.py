"""Reading one chat-completion attempt: a JSON body or a stream of chunks.

Both paths produce a :class:`Completion`, the raw material of a
:class:`~provider_router.client.results.ChatResult`. An error carried inside a 200
(``error`` at the top level, ``choices[0].error`` or ``finish_reason: "error"``)
is kept on :attr:`Completion.error` rather than raised here, because the caller
must still settle whatever usage came with it before it retries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from provider_router._exceptions import InvalidResponseError, ResponseCarriedError
from provider_router._secrets import scrub
from provider_router.catalog.records import describe_json
from provider_router.client.results import (
    StreamDelta,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    Usage,
    parse_logprobs,
)
from provider_router.client.router_metadata import RouterMetadata, parse_router_metadata

__all__ = ["Completion", "StreamAccumulator", "parse_completion"]


@dataclass(slots=True)
class Completion:
    """What one attempt produced."""

    text: str = ""
    reasoning: str | None = None
    provider: str | None = None
    model: str | None = None
    generation_id: str | None = None
    finish_reason: str | None = None
    native_finish_reason: str | None = None
    usage: Usage | None = None
    message: Mapping[str, Any] = field(default_factory=dict)
    error: ResponseCarriedError | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None
    cache_status: str | None = None
    """``X-OpenRouter-Cache-Status`` (``HIT``, ``MISS``) when response caching is on."""
    router_metadata: RouterMetadata | None = None


def _carried_error(
    error: object, body: Mapping[str, Any], provider: str | None
) -> ResponseCarriedError:
    code: int | None = None
    message = "the response carries an error"
    if isinstance(error, Mapping):
        raw_code = error.get("code")
        code = raw_code if isinstance(raw_code, int) else None
        raw_message = error.get("message")
        if isinstance(raw_message, str) and raw_message:
            message = raw_message
        metadata = error.get("metadata")
        if isinstance(metadata, Mapping) and isinstance(metadata.get("provider_name"), str):
            provider = metadata["provider_name"]
    what = f"error {code}" if code is not None else "an error"
    where = f" from {provider}" if provider else ""
    return ResponseCarriedError(
        f"HTTP 200 carrying {what}{where}: {message}",
        code=code,
        provider_name=provider,
        body=body,
    )


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _clean(value: object) -> str | None:
    """A string we log, journal and count by, scrubbed of any key a server echoed."""
    return scrub(value) if isinstance(value, str) else None


def parse_completion(body: object) -> Completion:
    """Read a non-streaming ``/chat/completions`` body.

    Raises:
        InvalidResponseError: the body is not a chat completion (no ``choices``
            and no ``error``).
    """
    # Once per answer: values go to locals and the Completion is built once, with
    # the helpers (_str, _clean) inlined (docs/performance.md).
    # type() first: a decoded body is a dict, and an ABC check costs far more.
    if type(body) is not dict and not isinstance(body, Mapping):
        raise InvalidResponseError(f"expected a chat completion object, got {describe_json(body)}")
    get = body.get
    provider = get("provider")
    provider = scrub(provider) if isinstance(provider, str) else None
    model = get("model")
    model = model if isinstance(model, str) else None
    generation_id = get("id")
    generation_id = scrub(generation_id) if isinstance(generation_id, str) else None
    usage = Usage.from_json(get("usage"))
    top_error = get("error")
    error = _carried_error(top_error, body, provider) if top_error is not None else None
    choices = get("choices")
    if not isinstance(choices, list) or not choices:
        if error is None:
            raise InvalidResponseError(
                "expected a chat completion with a non-empty 'choices' list, got "
                + describe_json(body)
            )
        return Completion("", None, provider, model, generation_id, None, None, usage, {}, error)
    choice = choices[0]
    if type(choice) is not dict and not isinstance(choice, Mapping):
        raise InvalidResponseError(
            f"expected choices[0] to be an object, got {describe_json(choice)}"
        )
    text = ""
    reasoning = None
    kept: Mapping[str, Any] = {}
    tool_calls: tuple[ToolCall, ...] = ()
    message = choice.get("message")
    if type(message) is dict or isinstance(message, Mapping):
        kept = message
        content = message.get("content")
        if isinstance(content, str):
            text = content
        reasoning = message.get("reasoning")
        if not isinstance(reasoning, str):
            reasoning = None
        raw_calls = message.get("tool_calls")
        if isinstance(raw_calls, list):
            parsed = (ToolCall.from_json(raw, i) for i, raw in enumerate(raw_calls))
            tool_calls = tuple(call for call in parsed if call is not None)
    finish_reason = choice.get("finish_reason")
    if not isinstance(finish_reason, str):
        finish_reason = None
    native_finish_reason = choice.get("native_finish_reason")
    if not isinstance(native_finish_reason, str):
        native_finish_reason = None
    if error is None and (choice.get("error") is not None or finish_reason == "error"):
        error = _carried_error(choice.get("error"), body, provider)
    raw_logprobs = choice.get("logprobs")
    raw_metadata = get("openrouter_metadata")
    return Completion(
        text,
        reasoning,
        provider,
        model,
        generation_id,
        finish_reason,
        native_finish_reason,
        usage,
        kept,
        error,
        tool_calls,
        None if raw_logprobs is None else parse_logprobs(raw_logprobs),
        router_metadata=None if raw_metadata is None else parse_router_metadata(raw_metadata),
    )


class _CallParts:
    """One tool call being put together from stream deltas."""

    __slots__ = ("arguments", "id", "index", "name")

    def __init__(self, index: int) -> None:
        self.index = index
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class StreamAccumulator:
    """Builds a :class:`Completion` from decoded stream chunks, one at a time."""

    __slots__ = ("_calls", "_logprobs", "_reasoning", "_slots", "_text", "result")

    def __init__(self) -> None:
        self.result = Completion()
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _CallParts] = {}
        self._slots: dict[int, int] = {}  # the index a chunk says -> the call it feeds
        self._logprobs: list[TokenLogprob] | None = None  # None: no chunk carried any

    def _feed_calls(self, entries: list[Any]) -> tuple[ToolCallDelta, ...]:
        """Add ``delta.tool_calls`` entries to the calls, keyed by ``index``. An entry
        whose new ``id`` differs from the call at its index starts another call: some
        providers send every parallel call at index 0."""
        deltas: list[ToolCallDelta] = []
        calls = self._calls
        for entry in entries:
            if not isinstance(entry, Mapping):
                continue
            call_id = _str(entry.get("id")) or None
            wire = entry.get("index")
            if not isinstance(wire, int) or isinstance(wire, bool):
                # No index: a new id starts the next call, a piece continues the last.
                wire = max(calls, default=-1) + (1 if call_id else 0)
                wire = max(wire, 0)
            index = self._slots.get(wire, wire)
            current = calls.get(index)
            if current is not None and call_id and current.id and call_id != current.id:
                index = max(calls) + 1
                current = None
            self._slots[wire] = index
            if current is None:
                current = calls[index] = _CallParts(index)
            function = entry.get("function")
            function = function if isinstance(function, Mapping) else {}
            name = _str(function.get("name")) or None
            arguments = function.get("arguments")
            arguments = arguments if isinstance(arguments, str) else ""
            if call_id and not current.id:
                current.id = call_id
            if name and not current.name:
                current.name = name
            if arguments:
                current.arguments.append(arguments)
            deltas.append(ToolCallDelta(index, arguments, call_id, name))
        return tuple(deltas)

    def feed(self, chunk: object, attempt: int = 1) -> StreamDelta | None:
        """Take one chunk; return the text it adds (``None`` when it adds none).

        Raises:
            InvalidResponseError: the chunk is not a JSON object.
        """
        if not isinstance(chunk, Mapping):
            raise InvalidResponseError(
                f"expected a stream chunk object, got {describe_json(chunk)}"
            )
        result = self.result
        if result.generation_id is None:
            result.generation_id = _clean(chunk.get("id"))
            result.provider = _clean(chunk.get("provider"))
            result.model = _str(chunk.get("model"))
        usage = chunk.get("usage")
        if usage is not None:
            result.usage = Usage.from_json(usage)
            # On the final chunk before [DONE], with the usage (the router-metadata guide).
            raw_metadata = chunk.get("openrouter_metadata")
            if raw_metadata is not None:
                result.router_metadata = parse_router_metadata(raw_metadata)
        error = chunk.get("error")
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        delta: StreamDelta | None = None
        if isinstance(choice, Mapping):
            part = choice.get("delta")
            if isinstance(part, Mapping):
                text = part.get("content")
                reasoning = part.get("reasoning")
                if text and isinstance(text, str):
                    self._text.append(text)
                else:
                    text = ""
                if reasoning and isinstance(reasoning, str):
                    self._reasoning.append(reasoning)
                else:
                    reasoning = ""
                entries = part.get("tool_calls")
                calls = self._feed_calls(entries) if isinstance(entries, list) else ()
                if text or reasoning or calls:
                    delta = StreamDelta(
                        text=text, reasoning=reasoning, attempt=attempt, tool_calls=calls
                    )
            raw_logprobs = choice.get("logprobs")
            if raw_logprobs is not None:
                tokens = parse_logprobs(raw_logprobs)
                if tokens is not None:
                    if self._logprobs is None:
                        self._logprobs = []
                    self._logprobs.extend(tokens)
            finish = choice.get("finish_reason")
            # The usage chunk may repeat the finish reason: the first one stands.
            if finish is not None and result.finish_reason is None:
                result.finish_reason = _str(finish)
                result.native_finish_reason = _str(choice.get("native_finish_reason"))
            if error is None and choice.get("error") is not None:
                error = choice.get("error")
        if (error is not None or result.finish_reason == "error") and result.error is None:
            result.error = _carried_error(error, chunk, result.provider)
        return delta

    @property
    def delivered(self) -> bool:
        """Whether any text or reasoning has arrived."""
        return bool(self._text or self._reasoning)

    def finish(self) -> Completion:
        """The accumulated completion."""
        result = self.result
        result.text = "".join(self._text)
        result.reasoning = "".join(self._reasoning) if self._reasoning else None
        message: dict[str, Any] = {"role": "assistant", "content": result.text}
        if result.reasoning is not None:
            message["reasoning"] = result.reasoning
        if self._calls:
            result.tool_calls = tuple(
                ToolCall(parts.id, parts.name, "".join(parts.arguments), index)
                for index, parts in sorted(self._calls.items())
            )
            message["tool_calls"] = [
                {"index": call.index, **call.message()} for call in result.tool_calls
            ]
            if not result.text:
                message["content"] = None
        result.message = message
        if self._logprobs is not None:
            result.logprobs = tuple(self._logprobs)
        return result
