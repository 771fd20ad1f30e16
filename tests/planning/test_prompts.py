"""The prompt reader: good lines, every kind of bad line (with file:line), stable ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provider_router import DataFileError
from provider_router.planning.prompts import (
    PromptReader,
    content_id,
    count_lines,
    first_problem_error,
    parse_prompt_line,
)


def write(path: Path, *lines: str | bytes) -> Path:
    data = b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines)
    path.write_bytes(data)
    return path


def test_messages_prompt_id_and_metadata(tmp_path: Path) -> None:
    path = write(
        tmp_path / "p.jsonl",
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}], "src": "x"}),
        json.dumps({"prompt": "hello", "tags": [1, 2]}),
        json.dumps({"id": 7, "prompt": "seven"}),
    )
    prompts = list(PromptReader([path]))
    assert [p.id for p in prompts] == ["a", content_id([{"role": "user", "content": "hello"}]), "7"]
    assert prompts[0].metadata == {"src": "x"}
    assert prompts[1].messages == [{"role": "user", "content": "hello"}]
    assert prompts[1].metadata == {"tags": [1, 2]}
    assert [p.line for p in prompts] == [1, 2, 3]
    assert all(p.source == path for p in prompts)


def test_content_id_is_stable_and_ignores_key_order() -> None:
    a = content_id([{"role": "user", "content": "x"}])
    b = content_id([{"content": "x", "role": "user"}])
    assert a == b
    assert a.startswith("h")
    assert len(a) == 17
    assert content_id([{"role": "user", "content": "y"}]) != a
    # The same prompt given as `prompt` or as `messages` gets the same id.
    _, messages, _ = parse_prompt_line(b'{"prompt": "x"}')
    assert content_id(messages) == a


def test_repeated_content_without_ids_gets_numbered_ids(tmp_path: Path) -> None:
    line = json.dumps({"prompt": "same"})
    path = write(tmp_path / "p.jsonl", line, line, line)
    ids = [p.id for p in PromptReader([path])]
    base = content_id([{"role": "user", "content": "same"}])
    assert ids == [base, f"{base}-2", f"{base}-3"]
    # Reading again yields the same ids: this is what resume relies on.
    assert [p.id for p in PromptReader([path])] == ids


def test_blank_lines_are_skipped_silently_and_numbering_kept(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", "", '{"prompt": "a"}', "   ", '{"prompt": "b"}')
    reader = PromptReader([path])
    assert [p.line for p in reader] == [2, 4]
    assert reader.problems == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object, got list"),
        (b'"text"', "expected a JSON object, got str"),
        (b'{"id": "x"}', "neither `messages` nor `prompt` (keys: id)"),
        (b"{}", "neither `messages` nor `prompt` (keys: none)"),
        (b'{"prompt": "a", "messages": []}', "both `messages` and `prompt`"),
        (b'{"prompt": 3}', "`prompt` must be a string, got int"),
        (b'{"prompt": "  "}', "`prompt` is empty"),
        (b'{"messages": []}', "`messages` is empty"),
        (b'{"messages": "hi"}', "`messages` must be a list"),
        (b'{"messages": ["hi"]}', "messages[0] must be an object"),
        (b'{"messages": [{"content": "hi"}]}', "messages[0] has no `role`"),
        (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content must be"),
        (b'{"prompt": "a", "id": ""}', "`id` is empty"),
        (b'{"prompt": "a", "id": true}', "`id` must be a string or an integer, got bool"),
        (b'{"prompt": "a", "id": [1]}', "`id` must be a string or an integer, got list"),
        (b'{"prompt": "\xff\xfe"}', "not valid"),
        (b'{"prompt": "a \\ud800 b"}', "line holds a lone surrogate (\\ud800)"),
        (b'{"prompt": "a", "source": "\\udfff"}', "line holds a lone surrogate (\\udfff)"),
        (b'{"messages": [{"role": "user", "content": "\\uDBFF"}]}', "lone surrogate"),
    ],
)
def test_bad_lines_are_reported_with_file_and_line(
    tmp_path: Path, line: bytes, expected: str
) -> None:
    path = write(tmp_path / "bad.jsonl", '{"prompt": "good"}', line, '{"prompt": "after"}')
    reader = PromptReader([path])
    prompts = list(reader)
    assert [p.line for p in prompts] == [1, 3]  # the bad line is skipped, the rest kept
    assert len(reader.problems) == 1
    problem = reader.problems[0]
    assert problem.path == path
    assert problem.line == 2
    assert expected in str(problem)
    assert str(problem).startswith(f"{path}:2: ")


def test_a_surrogate_pair_is_one_character_not_a_bad_line() -> None:
    _, messages, _ = parse_prompt_line(b'{"prompt": "smile \\ud83d\\ude00"}')
    assert messages[0]["content"] == "smile \U0001f600"


def test_strict_names_a_lone_surrogate_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", '{"prompt": "a"}', '{"prompt": "\\ud800"}')
    with pytest.raises(DataFileError, match=r"p\.jsonl:2: line holds a lone surrogate"):
        list(PromptReader([path], strict=True))


def test_multimodal_content_and_tool_call_assistant_are_accepted() -> None:
    line = json.dumps(
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "t"}]},
                {"role": "tool", "content": "ok"},
            ]
        }
    )
    _, messages, _ = parse_prompt_line(line)
    assert len(messages) == 3


def test_duplicate_explicit_id_is_a_bad_line(tmp_path: Path) -> None:
    path = write(
        tmp_path / "p.jsonl",
        '{"id": "a", "prompt": "one"}',
        '{"id": "b", "prompt": "two"}',
        '{"id": "a", "prompt": "three"}',
    )
    reader = PromptReader([path])
    assert [p.messages[0]["content"] for p in reader] == ["one", "two"]
    assert reader.problems[0].line == 3
    assert "duplicate id 'a'" in str(reader.problems[0])


def test_duplicates_are_detected_across_the_files_of_a_dataset(tmp_path: Path) -> None:
    first = write(tmp_path / "a.jsonl", '{"id": "x", "prompt": "one"}')
    second = write(tmp_path / "b.jsonl", '{"id": "x", "prompt": "two"}')
    reader = PromptReader([first, second])
    assert len(list(reader)) == 1
    assert reader.problems[0].path == second
    assert reader.problems[0].line == 1


def test_unreadable_file_is_reported_and_skipped(tmp_path: Path) -> None:
    good = write(tmp_path / "good.jsonl", '{"prompt": "a"}')
    missing = tmp_path / "missing.jsonl"
    reader = PromptReader([missing, good])
    assert len(list(reader)) == 1
    assert reader.problems[0].path == missing
    assert reader.problems[0].line is None
    assert "cannot read prompt file" in str(reader.problems[0])


def test_strict_raises_the_first_bad_line(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", '{"prompt": "a"}', "oops", "again")
    with pytest.raises(DataFileError, match=r"p\.jsonl:2: line is not valid JSON"):
        list(PromptReader([path], strict=True))


def test_first_problem_error_counts_the_rest(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", "x", "y", "z")
    reader = PromptReader([path])
    list(reader)
    error = first_problem_error(reader.problems)
    assert error.line == 1
    assert "and 2 more bad lines" in str(error)
    assert "--strict" in str(error)


def test_reader_streams_without_holding_prompts(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", *(json.dumps({"prompt": f"p{i}"}) for i in range(1000)))
    reader = iter(PromptReader([path]))
    first = next(reader)
    assert first.line == 1  # a generator: nothing past the first line was needed


def test_count_lines_ignores_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", '{"prompt": "a"}', "", '{"prompt": "b"}', "  ")
    assert count_lines(path) == 2


def test_skip_passes_over_done_lines_unparsed_but_keeps_their_ids_taken(tmp_path: Path) -> None:
    path = write(
        tmp_path / "p.jsonl",
        '{"id": "a", "prompt": "one"}',
        "this line is done and never parsed",
        '{"prompt": "same"}',
        '{"id": "a", "prompt": "dup of a done id"}',
        '{"prompt": "same"}',
    )
    first = list(PromptReader([path]))
    assert [p.line for p in first] == [1, 3, 5]  # line 2 is bad, line 4 a duplicate
    base = content_id([{"role": "user", "content": "same"}])
    # A resumed run: lines 1 and 3 are done (their locations and ids are known).
    reader = PromptReader([path], skip={first[0].location, first[1].location}, taken={"a", base})
    rest = list(reader)
    assert [(p.id, p.line) for p in rest] == [(f"{base}-2", 5)]  # same numbering as before
    assert reader.skipped == 2
    assert [p.line for p in reader.problems] == [2, 4]


def test_locations_encode_file_and_offset(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", '{"prompt": "x"}', '{"prompt": "y"}')
    b = write(tmp_path / "b.jsonl", '{"prompt": "z"}')
    prompts = list(PromptReader([a, b]))
    assert [(p.file_index, p.offset) for p in prompts] == [(0, 0), (0, 16), (1, 0)]
