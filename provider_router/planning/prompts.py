"""Streaming reader for prompt files (JSONL).

Each line is one JSON object with ``messages`` (OpenAI chat format) or ``prompt`` (a
string, sent as one user message), optionally an ``id``, ``tools`` and
``tool_choice``; every other key is carried through as metadata. A line without an
``id`` gets a stable one derived from its content, so re-reading the same file yields
the same ids (what makes resuming possible). Files are read one line at a time: memory
grows only with the set of ids seen. A bad line becomes a
:class:`~provider_router.DataFileError` naming file and line, collected in
:attr:`PromptReader.problems`; with ``strict=True`` the first one raises.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from provider_router._exceptions import DataFileError
from provider_router._types import JSONObject, Message

__all__ = [
    "REQUEST_KEYS",
    "Prompt",
    "PromptReader",
    "content_id",
    "count_lines",
    "first_problem_error",
    "location",
    "parse_prompt_line",
    "validate_files",
]

REQUEST_KEYS = ("tools", "tool_choice")
"""Keys of a prompt line sent with its request rather than kept as metadata."""
_RESERVED_KEYS = frozenset({"id", "messages", "prompt", *REQUEST_KEYS})
_TOOL_CHOICES = ("none", "auto", "required")
_ID_PREFIX = "h"
_ID_HEX_CHARS = 16
_MAX_ID_CHARS = 512
_MAX_ERROR_SNIPPET = 60
_OFFSET_BITS = 48
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
_decode = json.JSONDecoder().decode
# A ``\ud800``-``\udfff`` escape: JSON allows it, UTF-8 cannot encode it unpaired.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def location(file_index: int, offset: int) -> int:
    """One integer for "byte ``offset`` of the dataset's file number ``file_index``"."""
    return (file_index << _OFFSET_BITS) | offset


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt to send.

    Attributes:
        id: the line's ``id``, or a stable id derived from ``messages``.
        messages: the chat messages to send (``prompt`` lines become one user message).
        metadata: every other key of the line, carried through to the output.
        request_fields: the line's own request fields (``tools``, ``tool_choice``).
        source: the file it came from.
        line: its 1-based line number in that file.
        location: file index and byte offset in one integer (see :func:`location`):
            what the journal records so a resumed run can skip done lines unparsed.
    """

    id: str
    messages: list[Message]
    metadata: JSONObject
    source: Path
    line: int
    location: int = 0
    request_fields: JSONObject = field(default_factory=dict)

    @property
    def file_index(self) -> int:
        """Which of the dataset's files it came from (0 = the first)."""
        return self.location >> _OFFSET_BITS

    @property
    def offset(self) -> int:
        """Byte offset of its line in that file."""
        return self.location & _OFFSET_MASK


def content_id(messages: Sequence[Message]) -> str:
    """A stable id for a prompt without one: a hash of its canonical JSON messages.

    Key order and whitespace do not matter; ``{"prompt": "hi"}`` and
    ``{"messages": [{"role": "user", "content": "hi"}]}`` get the same id.
    """
    canonical = json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return _ID_PREFIX + digest[:_ID_HEX_CHARS]


def count_lines(path: Path) -> int:
    """Count the non-blank lines of a file quickly (for progress totals), without parsing."""
    lines = 0
    with path.open("rb") as fh:
        for raw in fh:
            if raw.strip():
                lines += 1
    return lines


def _snippet(text: str) -> str:
    text = text.strip()
    if len(text) > _MAX_ERROR_SNIPPET:
        return text[:_MAX_ERROR_SNIPPET] + "…"
    return text


def _check_messages(value: object) -> str | None:
    """Why ``value`` is not a usable list of chat messages, or None when it is."""
    if not isinstance(value, list):
        return f"`messages` must be a list of chat messages, got {type(value).__name__}"
    if not value:
        return "`messages` is empty"
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            return f"messages[{index}] must be an object, got {type(message).__name__}"
        role = message.get("role")
        if not isinstance(role, str) or not role:
            return f"messages[{index}] has no `role` (a string such as 'user')"
        content = message.get("content")
        if content is None and role == "assistant" and message.get("tool_calls"):
            continue
        if not isinstance(content, str | list):
            return (
                f"messages[{index}].content must be a string or a list of parts, "
                f"got {type(content).__name__}"
            )
    return None


def _check_encodable(obj: JSONObject) -> None:
    """Refuse a line whose strings hold a lone surrogate: it could never be sent."""
    try:
        json.dumps(obj, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("unicode_escape").decode()
        raise ValueError(
            f"line holds a lone surrogate ({bad}): not valid Unicode, so it cannot be sent as UTF-8"
        ) from None


def _check_tools(obj: JSONObject) -> str | None:
    """Why the line's ``tools``/``tool_choice`` cannot be sent, or None when they can."""
    tools = obj.get("tools")
    if "tools" in obj and tools is not None:
        if not isinstance(tools, list) or not tools:
            return "`tools` must be a non-empty list of tool objects"
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
                return f"tools[{index}] must be an object with a `type` (e.g. 'function')"
    choice = obj.get("tool_choice")
    if choice is None or choice in _TOOL_CHOICES:
        return None
    if isinstance(choice, dict) and isinstance(choice.get("type"), str):
        return None
    return (
        "`tool_choice` must be 'none', 'auto', 'required' or "
        f'{{"type": "function", "function": {{"name": ...}}}}, got {choice!r}'
    )


def parse_prompt_line(raw: bytes | str) -> tuple[str | None, list[Message], JSONObject]:
    """Parse one JSONL line into ``(explicit id or None, messages, metadata)``.

    The line's request fields (:data:`REQUEST_KEYS`) are checked here and left in
    the returned metadata under their own keys; :class:`PromptReader` moves them to
    :attr:`Prompt.request_fields`.

    Raises:
        ValueError: with a message saying what is wrong with the line.
    """
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
        obj = _decode(text)
    except UnicodeDecodeError as exc:
        raise ValueError(f"line is not valid UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"line is not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None:
        _check_encodable(obj)
    has_messages = "messages" in obj
    has_prompt = "prompt" in obj
    if has_messages and has_prompt:
        raise ValueError("line has both `messages` and `prompt`; give exactly one")
    if has_messages:
        problem = _check_messages(obj["messages"])
        if problem:
            raise ValueError(problem)
        messages: list[Message] = obj["messages"]
    elif has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str):
            raise ValueError(f"`prompt` must be a string, got {type(prompt).__name__}")
        if not prompt.strip():
            raise ValueError("`prompt` is empty")
        messages = [{"role": "user", "content": prompt}]
    else:
        keys = ", ".join(sorted(obj)) or "none"
        raise ValueError(f"line has neither `messages` nor `prompt` (keys: {keys})")
    explicit_id: str | None = None
    if "id" in obj:
        value = obj["id"]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"`id` must be a string or an integer, got {type(value).__name__}")
        explicit_id = str(value)
        if not explicit_id.strip():
            raise ValueError("`id` is empty")
        if len(explicit_id) > _MAX_ID_CHARS:
            raise ValueError(f"`id` is longer than {_MAX_ID_CHARS} characters")
    problem = _check_tools(obj)
    if problem:
        raise ValueError(problem)
    metadata = {key: value for key, value in obj.items() if key not in _RESERVED_KEYS}
    for key in REQUEST_KEYS:
        if obj.get(key) is not None:
            metadata[key] = obj[key]
    return explicit_id, messages, metadata


@dataclass
class PromptReader:
    """Stream the prompts of one dataset from one or more JSONL files.

    Iterating yields :class:`Prompt` in file order. Bad lines (malformed JSON, no
    ``messages`` or ``prompt``, a duplicate ``id``, undecodable bytes) are skipped
    and recorded in :attr:`problems`; an unreadable file is recorded and skipped
    whole. With ``strict=True`` the first problem is raised instead.

    Ids are unique within the reader (one dataset). A line without an ``id``
    whose content repeats an earlier line's gets ``<content id>-2``, ``-3``…, so
    deliberate repeats (several samples of one prompt) are kept and stay stable.

    A resumed run passes ``skip`` (the locations of lines already done, see
    :attr:`Prompt.location`) and ``taken`` (their ids): those lines are passed over
    without being parsed, which is what makes resuming a million-line job fast,
    and their ids still count as used for duplicate detection and numbering.
    Only valid while the files are unchanged since those locations were recorded.

    Args:
        paths: the JSONL files, read in this order.
        strict: raise the first problem instead of skipping the line.
        skip: locations of lines to pass over unparsed.
        taken: ids of the skipped lines.
    """

    paths: Sequence[Path]
    strict: bool = False
    skip: Container[int] = frozenset()
    taken: Container[str] = frozenset()
    problems: list[DataFileError] = field(default_factory=list, init=False)
    skipped: int = field(default=0, init=False)
    read: int = field(default=0, init=False)
    """Good prompts yielded so far (with :attr:`skipped`, every good prompt once the
    files are read to their end)."""
    _seen: set[str] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self.paths = [Path(p) for p in self.paths]

    @property
    def bad_lines(self) -> int:
        """How many lines (or files) were skipped so far."""
        return len(self.problems)

    def _problem(self, path: Path, message: str, line: int | None) -> None:
        error = DataFileError(path, message, line=line)
        if self.strict:
            raise error
        self.problems.append(error)

    def __iter__(self) -> Iterator[Prompt]:
        for index, path in enumerate(self.paths):
            yield from self._read(index, path)

    def _read(self, index: int, path: Path) -> Iterator[Prompt]:
        try:
            fh = path.open("rb")
        except OSError as exc:
            self._problem(path, f"cannot read prompt file: {exc.strerror or exc}", None)
            return
        skip = self.skip
        with fh:
            lineno = 0
            offset = 0
            base = location(index, 0)
            try:
                for raw in fh:
                    lineno += 1
                    here = base | offset
                    offset += len(raw)
                    if here in skip:
                        self.skipped += 1
                        continue
                    if not raw.strip():
                        continue
                    prompt = self._parse(path, lineno, raw, here)
                    if prompt is not None:
                        self.read += 1
                        yield prompt
            except OSError as exc:
                self._problem(path, f"reading failed: {exc.strerror or exc}", lineno + 1)

    def _taken(self, prompt_id: str) -> bool:
        return prompt_id in self._seen or prompt_id in self.taken

    def _parse(self, path: Path, lineno: int, raw: bytes, here: int) -> Prompt | None:
        try:
            explicit_id, messages, metadata = parse_prompt_line(raw)
        except ValueError as exc:
            self._problem(path, str(exc), lineno)
            return None
        if explicit_id is not None:
            if self._taken(explicit_id):
                self._problem(
                    path,
                    f"duplicate id {_snippet(explicit_id)!r}: an earlier line of this "
                    "dataset already has it",
                    lineno,
                )
                return None
            prompt_id = explicit_id
        else:
            base = content_id(messages)
            prompt_id = base
            repeat = 1
            while self._taken(prompt_id):
                repeat += 1
                prompt_id = f"{base}-{repeat}"
        self._seen.add(prompt_id)
        request = {key: metadata.pop(key) for key in REQUEST_KEYS if key in metadata}
        return Prompt(prompt_id, messages, metadata, path, lineno, here, request)


def validate_files(paths: Iterable[Path]) -> tuple[int, list[DataFileError]]:
    """Read every line of ``paths`` without keeping prompts: ``(good lines, problems)``."""
    reader = PromptReader(list(paths))
    good = sum(1 for _ in reader)
    return good, reader.problems


def first_problem_error(problems: Sequence[DataFileError]) -> DataFileError:
    """The first problem, its message extended with how many more there are (for --strict)."""
    first = problems[0]
    more = len(problems) - 1
    detail = first.detail
    if more:
        detail += f" (and {more} more bad line{'s' if more != 1 else ''})"
    detail += "; nothing was sent (--strict); fix the file or run without --strict to skip"
    return DataFileError(first.path, detail, line=first.line)
