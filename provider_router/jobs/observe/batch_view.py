"""The batch route as an operator sees it: per dataset, its batches by state, its lines,
the money held and booked, the providers, and the 24 h window of its oldest live batch.

One record (:class:`BatchView`) and one set of words
(:mod:`~provider_router.jobs.observe.batch_words`), shown the same in ``summary.json``,
``report.html``, ``provider-router status``, ``run``'s live lines and Prometheus. Built
read-only, without a lock, from the route's journal (``batches.jsonl``: every batch
from its intent to its end) and ``batch_status.json`` (what the running route last saw
of each batch at OpenRouter), so it works while a run goes on and after it was killed.
The states, in order, are :data:`STATES` (docs/observability.md); *submitted* counts
every batch OpenRouter took.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, Final

from provider_router._format import decimal_str
from provider_router._money import from_units
from provider_router.jobs.batch_api.journal import BatchIntent
from provider_router.jobs.batch_api.journal import _apply as _apply_entry
from provider_router.jobs.batch_api.results import failed_batch_cost
from provider_router.jobs.store._layout import JobLayout
from provider_router.planning.compare import BATCH_WINDOW_SECONDS

__all__ = [
    "LIVE_STATES",
    "MAX_TEXT",
    "STATES",
    "BatchRow",
    "BatchView",
    "DatasetBatches",
    "JournalReader",
    "Sighting",
    "build_view",
    "read_batch_view",
    "read_sightings",
]

STATES: Final = (
    "submitting",
    "validating",
    "in_progress",
    "finalizing",
    "collecting",
    "completed",
    "failed",
    "expired",
    "cancelled",
    "not_created",
)
"""Every state a batch of the route is counted in, in the order views list them."""
LIVE_STATES: Final = frozenset(STATES[:5])
"""States whose prompts may still be in a batch OpenRouter runs (their worst case held)."""
_NOT_TAKEN: Final = frozenset({"submitting", "not_created"})
_ENDED: Final = {"failed": "failed", "expired": "expired", "cancelled": "cancelled"}
"""How the journal's ``ended`` reasons map to states (the rest: ``not_created``)."""
_OPENROUTER_LIVE: Final = {
    "validating": "validating",
    "in_progress": "in_progress",
    "finalizing": "finalizing",
    "cancelling": "in_progress",
}


@dataclass(frozen=True, slots=True)
class Sighting:
    """What one read of a batch at OpenRouter said (the fields the views use)."""

    status: str
    provider: str | None = None
    expires_at: int | None = None
    completed: int | None = None
    """``request_counts.completed``."""
    failed: int | None = None
    cost: str | None = None
    """``usage.cost`` as it came (a failed batch's booked cost depends on it)."""
    seen: float = 0.0
    """Unix seconds of the read."""

    @classmethod
    def of(cls, batch: Mapping[str, Any], seen: float) -> Sighting:
        """From a batch object (tolerant: a field of the wrong type is left out)."""
        counts = batch.get("request_counts")
        counts = counts if isinstance(counts, Mapping) else {}
        usage = batch.get("usage")
        cost = usage.get("cost") if isinstance(usage, Mapping) else None
        flat = {
            "status": batch.get("status"),
            "provider": batch.get("provider"),
            "expires_at": batch.get("expires_at"),
            "completed": counts.get("completed"),
            "failed": counts.get("failed"),
            "cost": None if cost is None or isinstance(cost, bool) else str(cost)[:MAX_TEXT],
            "seen": seen,
        }
        return cls.from_json(flat)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "provider": self.provider,
            "expires_at": self.expires_at,
            "completed": self.completed,
            "failed": self.failed,
            "cost": self.cost,
            "seen": round(self.seen, 3),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sighting:
        seen = data.get("seen")
        return cls(
            status=_text(data.get("status")) or "validating",
            provider=_text(data.get("provider")),
            expires_at=_int(data.get("expires_at")),
            completed=_int(data.get("completed")),
            failed=_int(data.get("failed")),
            cost=_text(data.get("cost")),
            seen=_seconds(seen),
        )

    def as_batch(self) -> dict[str, Any]:
        """Back to the batch object's shape (for :func:`failed_batch_cost`)."""
        return {
            "usage": {"cost": self.cost},
            "request_counts": {"completed": self.completed, "failed": self.failed},
        }


_TAIL_BYTES: Final = 4096
"""How much of what was read is compared on the next read (a cut and regrown journal
differs there: its torn line is gone and new lines stand where it was)."""
MAX_TEXT: Final = 200
"""Characters kept of a text field of a batch object (a provider name, a status, a cost):
what a server sends is bounded before it is kept, shown or written."""


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) and value else None


MAX_INT: Final = 2**40
"""Above any count of lines and any Unix second a batch carries: a bigger (or negative)
integer from a server is left out, never an ``OverflowError`` in a view."""


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_INT:
        return value
    return None


def _seconds(value: Any) -> float:
    if isinstance(value, float) and 0 <= value < MAX_INT:  # NaN compares false
        return value
    return float(value) if _int(value) is not None else 0.0


@dataclass(frozen=True, slots=True)
class DatasetBatches:
    """One dataset's batches.

    Attributes:
        name: the dataset.
        states: batches per state (every name of :data:`STATES`, zeros included).
        lines_done: lines of collected batches that answered (over every run).
        lines_failed: lines of collected batches that failed (free; they may go again).
        lines_in_batches: prompts in live batches now.
        held: USD reserved for live batches (their worst case, until settled).
        booked: USD booked for batches that ended: collected ones at their cost,
            expired and cancelled ones at their worst case, failed ones as the route
            books them (nothing, unless OpenRouter said they ran lines).
        providers: batches per serving provider (the pinned one until OpenRouter names it).
        window_ends: Unix seconds when the oldest live batch's 24 h window ends: 24 h
            from just before its submit (never later than the truth), or its
            ``expires_at`` if that is sooner. None: no live batch.
    """

    name: str
    states: Mapping[str, int]
    lines_done: int = 0
    lines_failed: int = 0
    lines_in_batches: int = 0
    held: Decimal = Decimal(0)
    booked: Decimal = Decimal(0)
    providers: Mapping[str, int] = field(default_factory=dict)
    window_ends: int | None = None

    @property
    def submitted(self) -> int:
        """Batches OpenRouter took (every state but ``submitting`` and ``not_created``)."""
        return sum(n for state, n in self.states.items() if state not in _NOT_TAKEN)

    @property
    def live(self) -> int:
        return sum(self.states[s] for s in LIVE_STATES)

    def window_left(self, now: float) -> float | None:
        """Seconds until the oldest live batch's window ends (negative: past it)."""
        return None if self.window_ends is None else self.window_ends - now

    def to_json(self, now: float) -> dict[str, Any]:
        left = self.window_left(now)
        return {
            "submitted": self.submitted,
            "states": dict(self.states),
            "lines_done": self.lines_done,
            "lines_failed": self.lines_failed,
            "lines_in_batches": self.lines_in_batches,
            "held_usd": decimal_str(self.held),
            "booked_usd": decimal_str(self.booked),
            "providers": dict(sorted(self.providers.items())),
            "window_ends_at": self.window_ends,
            "window_left_s": None if left is None else round(left, 3),
        }


@dataclass(frozen=True, slots=True)
class BatchView:
    """Every dataset of the batch route, and what could not be read."""

    datasets: tuple[DatasetBatches, ...]
    problems: tuple[str, ...] = ()
    """Why some figures may be short (an unreadable journal line), one sentence each."""
    batches: tuple[BatchRow, ...] = ()
    """Every batch, in the order the journal holds them."""

    def dataset(self, name: str) -> DatasetBatches | None:
        return next((d for d in self.datasets if d.name == name), None)

    def to_json(self, now: float) -> dict[str, Any]:
        """``summary.json``'s ``batches``: per dataset, and each batch (money as exact
        strings)."""
        return {
            "datasets": {d.name: d.to_json(now) for d in self.datasets},
            "batches": [b.to_json() for b in self.batches],
            "problems": list(self.problems),
        }


class JournalReader:
    """Reads ``batches.jsonl`` without a lock or a write, again and again, each time only
    what was appended since (a run appends while this reads).

    A torn last line is left for the next read (the run may be writing it); a line that
    cannot be read stops the reading there and becomes a problem sentence. A journal cut
    since (a resume drops a torn last line), even one grown past where this read up to
    before, is read again from its start: the bytes before that point are checked.
    """

    def __init__(self, directory: str | Path) -> None:
        self.path = JobLayout(Path(directory)).batch_journal
        self.intents: dict[str, BatchIntent] = {}
        self.problem: str | None = None
        self._offset = 0
        self._line = 0
        self._tail = b""
        """The last bytes read (up to :data:`_TAIL_BYTES`, ending at ``_offset``)."""

    @property
    def exists(self) -> bool:
        return self.path.is_file()

    def read(self) -> dict[str, BatchIntent]:
        try:
            with self.path.open("rb") as fh:
                size = fh.seek(0, 2)
                if not self._same_start(fh, size):  # cut since (a torn last line): again
                    self.intents, self._offset, self._line, self.problem = {}, 0, 0, None
                    self._tail = b""
                if self.problem is not None:
                    return self.intents
                fh.seek(self._offset)
                data = fh.read(size - self._offset)
        except OSError:
            return self.intents
        start = self._offset
        end = data.rfind(b"\n") + 1
        for raw in data[:end].split(b"\n")[:-1]:
            self._line += 1
            try:
                if raw.strip():
                    _apply_entry(self.intents, json.loads(raw))
            except (ValueError, KeyError, TypeError) as exc:
                self.problem = (
                    f"{self.path} line {self._line} is unreadable ({exc}): the batch "
                    "figures stop before it"
                )
                break
            self._offset += len(raw) + 1
        self._tail = (self._tail + data[: self._offset - start])[-_TAIL_BYTES:]
        return self.intents

    def _same_start(self, fh: IO[bytes], size: int) -> bool:
        """Whether the file still holds what was read, up to ``_offset`` (its last bytes)."""
        if size < self._offset:
            return False
        fh.seek(self._offset - len(self._tail))
        return fh.read(len(self._tail)) == self._tail


def _state(intent: BatchIntent, seen: Sighting | None) -> str:
    if intent.collected:
        return "completed"
    if intent.ended is not None:
        return _ENDED.get(intent.ended, "not_created")
    if intent.batch_id is None:
        return "submitting"
    status = "validating" if seen is None else seen.status
    if status == "completed":
        return "collecting"
    if status in _ENDED:  # the route journals its end next: what OpenRouter said stands
        return _ENDED[status]
    return _OPENROUTER_LIVE.get(status, "in_progress")


def _booked(intent: BatchIntent, state: str, seen: Sighting | None) -> Decimal:
    worst = from_units(intent.worst_units)
    if state == "completed":
        return from_units(intent.cost_units)
    if state in ("expired", "cancelled"):
        return worst
    if state == "failed" and seen is not None:
        cost = failed_batch_cost(seen.as_batch(), worst)[0]
        return worst if cost > 2 * worst else cost  # a disputed bill: as the route books it
    return Decimal(0)


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One batch of the route: where it stands, where it ran, what it holds or cost.

    Attributes:
        dataset / intent: its dataset, and the journal's id of it (its ``custom_id``s'
            prefix).
        batch_id: OpenRouter's id (None: not taken yet, or never).
        state: one of :data:`STATES`.
        provider: where it runs (the pinned one until OpenRouter names it; None for a
            batch OpenRouter never took).
        lines: its prompts; failed: its lines that failed (once collected).
        held / booked: USD reserved for it until settled; booked when it ended.
        window_ends: Unix seconds its 24 h window ends (see :class:`DatasetBatches`).
    """

    dataset: str
    intent: str
    batch_id: str | None
    state: str
    provider: str | None
    lines: int
    failed: int
    held: Decimal
    booked: Decimal
    window_ends: int

    @classmethod
    def of(cls, intent: BatchIntent, seen: Sighting | None, pinned: str | None) -> BatchRow:
        state = _state(intent, seen)
        # 24 h from just before the submit, on our clock (``now`` is ours too); an earlier
        # ``expires_at`` wins, a later one (some upstreams take longer) is leeway.
        ends = intent.created_after + int(BATCH_WINDOW_SECONDS)
        if seen is not None and seen.expires_at is not None:
            ends = min(ends, seen.expires_at)
        provider = None
        if state not in _NOT_TAKEN:
            provider = (seen.provider if seen is not None else None) or pinned or "unknown"
        held = not intent.settled and state != "not_created"
        return cls(
            dataset=intent.dataset,
            intent=intent.intent,
            batch_id=intent.batch_id,
            state=state,
            provider=provider,
            lines=len(intent.prompt_ids),
            failed=len(intent.failed_ids) if state == "completed" else 0,
            held=from_units(intent.worst_units) if held else Decimal(0),
            booked=_booked(intent, state, seen),
            window_ends=ends,
        )

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "intent": self.intent,
            "batch_id": self.batch_id,
            "state": self.state,
            "provider": self.provider,
            "lines": self.lines,
            "failed": self.failed,
            "held_usd": decimal_str(self.held),
            "booked_usd": decimal_str(self.booked),
            "window_ends_at": self.window_ends if self.live else None,
        }


def _dataset(name: str, rows: Sequence[BatchRow]) -> DatasetBatches:
    states = dict.fromkeys(STATES, 0)
    providers: dict[str, int] = {}
    for row in rows:
        states[row.state] += 1
        if row.provider is not None:
            providers[row.provider] = providers.get(row.provider, 0) + 1
    live = [r for r in rows if r.live]
    done = [r for r in rows if r.state == "completed"]
    return DatasetBatches(
        name=name,
        states=states,
        lines_done=sum(r.lines - r.failed for r in done),
        lines_failed=sum(r.failed for r in done),
        lines_in_batches=sum(r.lines for r in live),
        held=sum((r.held for r in rows), Decimal(0)),
        booked=sum((r.booked for r in rows), Decimal(0)),
        providers=providers,
        window_ends=min((r.window_ends for r in live), default=None),
    )


def build_view(
    intents: Iterable[BatchIntent],
    sightings: Mapping[str, Sighting],
    *,
    pinned: str | None = None,
    problems: Iterable[str] = (),
) -> BatchView:
    """The view of ``intents`` given what was seen of their batches (by batch id).

    ``pinned``: the provider the route pins, named for batches OpenRouter has not named.
    """
    rows = []
    for intent in intents:
        seen = sightings.get(intent.batch_id) if intent.batch_id is not None else None
        rows.append(BatchRow.of(intent, seen, pinned))
    names = list(dict.fromkeys(r.dataset for r in rows))  # in the journal's order
    datasets = tuple(_dataset(n, [r for r in rows if r.dataset == n]) for n in names)
    return BatchView(datasets, tuple(problems), tuple(rows))


def read_sightings(directory: str | Path) -> tuple[dict[str, Sighting], str | None]:
    """``batch_status.json``: what was seen of each batch (by id), and the pinned provider.

    A missing or unreadable file is nothing seen (the views fall back to the journal).
    """
    try:
        loaded = json.loads(JobLayout(Path(directory)).batch_status.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, None
    if not isinstance(loaded, dict):
        return {}, None
    batches = loaded.get("batches")
    seen = {
        str(k): Sighting.from_json(v)
        for k, v in (batches.items() if isinstance(batches, dict) else ())
        if isinstance(v, dict)
    }
    return seen, _text(loaded.get("pinned"))


def read_batch_view(directory: str | Path) -> BatchView | None:
    """The batch route's view of the job in ``directory`` (None: it has no batch journal)."""
    reader = JournalReader(directory)
    if not reader.exists:
        return None
    intents = reader.read()
    seen, pinned = read_sightings(directory)
    problems = () if reader.problem is None else (reader.problem,)
    return build_view(intents.values(), seen, pinned=pinned, problems=problems)
