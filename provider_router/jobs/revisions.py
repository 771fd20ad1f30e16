"""Prompts whose content changed under their id: old answers moved aside, prompts sent again.

Each output row carries the digest of the request it answers (``request_digest``). When a
dataset's input files are not the ones its outputs were last checked against (the
journal's ``checked`` entry), every prompt is read before anything is sent and each done
one's row checked against the request it would be sent as now: a row that answers
another is set aside (``DIR/set_aside/<why>/<dataset>.jsonl``, kept) and its prompt sent
as new; a
done id no longer in the inputs is counted and said (its row stays). A row from before
digests is checked by what it records: its model, messages and tools (a line's own
``tool_choice`` is not in it: such a row stands only if the journal shows it done under
the input files as they are now).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from provider_router._money import from_units
from provider_router._types import Message
from provider_router.jobs.datasets import input_fingerprint
from provider_router.jobs.store._layout import SET_ASIDE_DIR, JobLayout
from provider_router.jobs.store.aside import rows_of
from provider_router.jobs.store.digest import RequestDigest, request_fields
from provider_router.jobs.store.journal import FileJournal
from provider_router.planning.plan import Plan
from provider_router.planning.prompts import Prompt, PromptReader

__all__ = [
    "CHANGED",
    "OTHER_MODEL",
    "Revision",
    "RowCheck",
    "RowRequest",
    "read_row_requests",
    "revise_plan",
]

CHANGED: Final = "edited"
"""Why a row is set aside when its prompt changed under its id (its folder's name)."""
OTHER_MODEL: Final = "other_model"
"""Why a row from before digests is set aside when it answers another model."""
_SAID: Final = {
    CHANGED: "their prompt changed under its id",
    OTHER_MODEL: "they answer another model than the job's",
}
_IDS_NAMED: Final = 5
# The head of a record as `make_record` writes it: its id, dataset and digest come first.
_HEAD: Final = re.compile(
    rb'\{"id":("(?:[^"\\]|\\.)*"),"dataset":"(?:[^"\\]|\\.)*","request_digest":"([0-9a-f]+)"'
)
_canonical: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False
).encode


@dataclass(frozen=True, slots=True)
class RowRequest:
    """What an output row says it answers: its digest, or (a row from before digests) the
    model and a digest of the messages and tools it records."""

    digest: str | None
    model: str | None = None
    content: str | None = None


def _content(messages: Sequence[Message], tools: Any) -> str:
    text = _canonical({"messages": list(messages), "tools": tools or None})
    return hashlib.sha256(text.encode()).hexdigest()


def read_row_requests(path: Path, size: int | None = None) -> dict[str, RowRequest]:
    """What each record of the output ``path`` (its first ``size`` bytes) answers, by id.

    A record's head is read without parsing the record (its answer may be long); a
    record from before digests is parsed whole. Unreadable lines are skipped.
    """
    rows: dict[str, RowRequest] = {}
    if not path.exists():
        return rows
    left = path.stat().st_size if size is None else size
    with path.open("rb") as fh:
        for line in fh:
            if left <= 0:
                break
            line = line[:left]
            left -= len(line)
            head = _HEAD.match(line)
            if head is not None:
                try:
                    rows[str(json.loads(head.group(1)))] = RowRequest(head.group(2).decode())
                    continue
                except ValueError:
                    pass
            try:
                record = json.loads(line)
                messages = record["messages"][:-1]
                prompt_id = str(record["id"])
            except (ValueError, KeyError, TypeError):
                continue
            digest = record.get("request_digest")
            if isinstance(digest, str):
                rows[prompt_id] = RowRequest(digest)
            else:
                model = record.get("model")
                content = _content(messages, record.get("tools"))
                rows[prompt_id] = RowRequest(
                    None, model if isinstance(model, str) else None, content
                )
    return rows


class RowCheck:
    """Whether a done prompt's row answers the request the prompt is sent as now.

    Args:
        rows: what each row answers (:func:`read_row_requests`).
        digest: the dataset's request digests.
        done_under: for a row from before digests whose prompt line has its own
            ``tool_choice``: whether the journal shows it done under the current input
            files (None: it cannot say, so such a row is sent again).
    """

    def __init__(
        self,
        rows: Mapping[str, RowRequest],
        digest: RequestDigest,
        done_under: Callable[[str], bool] | None = None,
    ) -> None:
        self.rows = rows
        self.digest = digest
        self.done_under = done_under

    def why_not(self, prompt: Prompt) -> str | None:
        """Why the row of ``prompt`` (done) does not answer it now; None when it does."""
        row = self.rows.get(prompt.id)
        if row is None:
            return None  # the journal says done; its record is the journal's to repair
        if row.digest is not None:
            return None if row.digest == self.digest.of(prompt) else CHANGED
        if row.model != self.digest.model:
            return OTHER_MODEL
        fields = request_fields(self.digest.params, prompt.request_fields)
        if row.content != _content(prompt.messages, fields.get("tools")):
            return CHANGED
        if "tool_choice" in prompt.request_fields and not (
            self.done_under is not None and self.done_under(prompt.id)
        ):
            return CHANGED  # what it was asked with is not all recorded: sent again
        return None


@dataclass(slots=True)
class Revision:
    """What checking one dataset's done prompts against its inputs found and did."""

    dataset: str
    moved: dict[str, list[str]] = field(default_factory=dict)
    """Ids whose rows were moved aside, by why."""
    moved_cost: Decimal = Decimal(0)
    gone: list[str] = field(default_factory=list)
    """Done ids no longer in the inputs (their rows stay)."""

    def sentences(self) -> list[str]:
        lines = []
        count = sum(len(ids) for ids in self.moved.values())
        if count:
            whys = "; ".join(
                f"{len(ids)} because {_SAID[why]} ({_named(ids)})"
                for why, ids in self.moved.items()
            )
            lines.append(
                f"{count} answers of dataset {self.dataset} no longer answer its inputs ({whys}): "
                f"they were set aside in {SET_ASIDE_DIR}/ (${self.moved_cost}, paid before, kept) "
                "and their prompts are sent again"
            )
        if self.gone:
            lines.append(
                f"{len(self.gone)} outputs of dataset {self.dataset} answer prompts no longer "
                f"in its inputs ({_named(self.gone)}); they stay in its output"
            )
        return lines


def _named(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_IDS_NAMED])
    more = len(ids) - _IDS_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def done_under_current(journal: FileJournal, dataset: str, fingerprint: list[Any]) -> set[str]:
    """The done ids of ``dataset`` the journal shows done while its recorded input files
    were ``fingerprint`` (read from the journal file: only rows from before digests ask)."""
    under: set[str] = set()
    current: Any = None
    with journal.path.open("rb") as fh:
        for line in fh:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict) or entry.get("ds") != dataset:
                continue
            op = entry.get("op")
            if op == "inputs":
                current = entry.get("files")
            elif op == "done" and current == fingerprint:
                under.update(entry.get("ids", ()))
            elif op in ("revoke", "aside"):
                under.difference_update(entry.get("ids", ()))
    return under


def revise_dataset(
    journal: FileJournal,
    out: Path,
    dataset: str,
    prompts: Iterable[Prompt],
    digest: RequestDigest,
    fingerprint: list[Any],
) -> Revision:
    """Check the done prompts of ``dataset`` against ``prompts`` (its inputs now), move the
    rows that no longer answer them aside, and record the check (module docstring)."""
    revision = Revision(dataset)
    done = journal.done_ids(dataset)
    if done:
        rows = read_row_requests(JobLayout(out).output(dataset), journal.output_size(dataset))
        under: set[str] | None = None

        def done_under(prompt_id: str) -> bool:
            nonlocal under
            if under is None:
                under = done_under_current(journal, dataset, fingerprint)
            return prompt_id in under

        check = RowCheck(rows, digest, done_under)
        seen: set[str] = set()
        for prompt in prompts:
            if prompt.id not in done:
                continue
            seen.add(prompt.id)
            why = check.why_not(prompt)
            if why is not None:
                revision.moved.setdefault(why, []).append(prompt.id)
        revision.gone = sorted(done - seen)
        for why, ids in revision.moved.items():
            moved = journal.set_aside(dataset, rows_of(ids), why=why)
            revision.moved_cost += from_units(sum(moved.cost))
    journal.record_checked(dataset, fingerprint)
    return revision


def dataset_digest(plan: Plan, name: str) -> RequestDigest:
    """The request digests of dataset ``name`` of ``plan`` (its model and fields)."""
    return RequestDigest(plan.model, plan.params_for(plan.dataset(name)).request_params())


def revise_plan(
    plan: Plan,
    journal: FileJournal,
    out: str | Path,
    *,
    prompts: Mapping[str, Iterable[Prompt]] | None = None,
) -> list[str]:
    """:func:`revise_dataset` for each dataset of ``plan`` whose input files changed since
    its outputs were last checked (``prompts``: a dataset's prompts already read, else
    its files are read); the sentences of what was done."""
    lines: list[str] = []
    for spec in plan.datasets:
        fingerprint = input_fingerprint(spec.inputs)
        if journal.checked(spec.name) == fingerprint:
            continue
        given = None if prompts is None else prompts.get(spec.name)
        items: Iterable[Prompt] = PromptReader(list(spec.inputs)) if given is None else given
        revision = revise_dataset(
            journal, Path(out), spec.name, items, dataset_digest(plan, spec.name), fingerprint
        )
        lines += revision.sentences()
    return lines
