"""SSEParser: real captures, keep-alives, line endings, and any byte split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provider_router._http.sse import DONE, MAX_EVENT_BYTES, SSEParser, SSETooLong

FIXTURES = sorted((Path(__file__).parents[1] / "data" / "fixtures").glob("*.sse"))
CAPTURES = {path.name: path.read_bytes() for path in FIXTURES}


def parse_all(pieces: list[bytes]) -> list[str]:
    parser = SSEParser()
    events: list[str] = []
    for piece in pieces:
        events.extend(parser.feed(piece))
    return events


def test_there_are_captures_to_test() -> None:
    assert len(CAPTURES) >= 4


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_capture_parses_into_json_chunks_then_done(name: str) -> None:
    raw = CAPTURES[name]
    events = parse_all([raw])
    data_lines = [line for line in raw.decode().splitlines() if line.startswith("data:")]
    assert len(events) == len(data_lines)
    assert events[-1] == DONE
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(c["provider"] for c in chunks)
    assert any("usage" in c for c in chunks)


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(sorted(CAPTURES)),
    cuts=st.lists(st.integers(min_value=0, max_value=1_000_000), max_size=40),
)
def test_any_byte_split_parses_the_same(name: str, cuts: list[int]) -> None:
    raw = CAPTURES[name]
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert b"".join(pieces) == raw
    assert parse_all(pieces) == parse_all([raw])


@settings(max_examples=100, deadline=None)
@given(
    payloads=st.lists(
        st.text(min_size=0, max_size=30).filter(lambda t: "\n" not in t and "\r" not in t),
        max_size=8,
    ),
    crlf=st.booleans(),
    data=st.data(),
)
def test_roundtrip_of_generated_streams_under_one_byte_pieces(
    payloads: list[str], crlf: bool, data: st.DataObject
) -> None:
    eol = "\r\n" if crlf else "\n"
    text = "".join(f": keep-alive{eol}data: {p}{eol}{eol}" for p in payloads)
    raw = text.encode()
    size = data.draw(st.integers(min_value=1, max_value=7))
    pieces = [raw[i : i + size] for i in range(0, len(raw), size)]
    assert parse_all(pieces) == payloads


def test_multibyte_character_split_across_pieces() -> None:
    raw = 'data: {"content":"Olá ✓"}\n\n'.encode()
    cut = raw.index("✓".encode()) + 1  # inside the three-byte character
    assert parse_all([raw[:cut], raw[cut:]]) == ['{"content":"Olá ✓"}']


def test_keep_alive_comments_between_events_are_ignored() -> None:
    raw = b": OPENROUTER PROCESSING\n\ndata: 1\n\n: OPENROUTER PROCESSING\n\ndata: 2\n\n"
    assert parse_all([raw]) == ["1", "2"]


def test_multiline_data_is_joined_with_newlines() -> None:
    assert parse_all([b"data: a\ndata: b\ndata:c\n\n"]) == ["a\nb\nc"]


def test_only_one_space_after_the_colon_is_dropped() -> None:
    assert parse_all([b"data:  two\n\n"]) == [" two"]
    assert parse_all([b"data:none\n\n"]) == ["none"]


def test_data_line_without_colon_is_an_empty_data_line() -> None:
    assert parse_all([b"data\n\n"]) == [""]


def test_other_fields_are_ignored() -> None:
    assert parse_all([b"event: message\nid: 7\nretry: 10\ndata: x\n\n"]) == ["x"]
    # an event with no data line dispatches nothing
    assert parse_all([b"event: ping\n\n"]) == []


def test_blank_lines_alone_dispatch_nothing() -> None:
    assert parse_all([b"\n\n\r\n\n"]) == []


def test_unterminated_event_is_not_yielded_and_is_pending() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"half":') == []
    assert parser.pending
    assert parser.feed(b" true}\n") == []  # line done, event not dispatched yet
    assert parser.pending
    parser.close()
    assert not parser.pending
    assert parser.feed(b"\n") == []  # the closed event is gone


def test_done_sentinel() -> None:
    assert parse_all([b"data: [DONE]\n\n"]) == [DONE]


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert parse_all([b"data: \xff\n\n"]) == ["\ufffd"]


def test_a_line_past_the_limit_ends_the_stream_naming_it() -> None:
    parser = SSEParser()
    piece = b"x" * (1 << 20)
    for _ in range(MAX_EVENT_BYTES >> 20):
        assert parser.feed(piece) == []  # at the limit: still a line
    with pytest.raises(SSETooLong, match="MAX_EVENT_BYTES"):
        parser.feed(b"x")


def test_an_event_past_the_limit_ends_the_stream() -> None:
    parser = SSEParser()
    line = b"data: " + b"x" * (1 << 20) + b"\n"
    for _ in range(MAX_EVENT_BYTES >> 20):
        assert parser.feed(line) == []  # at the limit: still an event
    with pytest.raises(SSETooLong, match="an event"):
        parser.feed(line)


def test_an_event_just_under_the_limit_is_whole() -> None:
    data = b"y" * (MAX_EVENT_BYTES - 100)
    pieces = [b"data: ", *(data[i : i + 4096] for i in range(0, len(data), 4096)), b"\n\n"]
    assert parse_all(pieces) == [data.decode()]
