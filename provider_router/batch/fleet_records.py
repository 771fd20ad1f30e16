"""What a fleet's Redis keys hold, as this package reads them.

* A **stream entry** is one prompt to do: its id, the prompt encoded by
  :func:`encode_prompt` (short keys: a fleet's streams hold every prompt of the
  plan) and how many times it was tried. A claimed entry is a :class:`WorkItem`.
* A dataset's **caps** travel to the claim script as a :class:`ClaimLimit`.
* A dataset's **tally** hash (what the Lua scripts in ``_fleet_lua.py`` count)
  and its stream's queue and pending entries make a :class:`FleetTally`
  (:func:`read_tally`); the whole plan's make a :class:`FleetProgress`.

Kept apart from :class:`~provider_router.batch.fleet.FleetQueue` (the Redis calls)
so the runner's state and views read fleet figures without the queue.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from provider_router._money import from_units
from provider_router.prompts import Prompt

__all__ = [
    "ClaimLimit",
    "FleetProgress",
    "FleetTally",
    "WorkItem",
    "decode_item",
    "encode_prompt",
    "read_tally",
]

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One claimed prompt.

    Attributes:
        dataset: the dataset it belongs to.
        prompt: the prompt, as the loader read it (source file and line included).
        entry_id: its stream entry (what is acknowledged).
        attempts: how many times it was given back or failed before.
    """

    dataset: str
    prompt: Prompt
    entry_id: str
    attempts: int = 0

    @property
    def payload(self) -> str:
        """The prompt as the stream stores it."""
        return encode_prompt(self.prompt)


@dataclass(frozen=True, slots=True)
class ClaimLimit:
    """A dataset's fleet-wide caps, checked by Redis as each prompt is claimed.

    ``N`` claimed, unfinished prompts are priced as the worker prices its own requests
    in flight (:class:`~provider_router.batch.targets.InFlightPricer`):
    ``min(N·cap, N·mean + spread·sqrt(N))``, or ``N·cap`` while ``mean`` is None.

    Attributes:
        max_requests: the plan's ``max_requests`` (completed plus claimed never exceeds it).
        target_output_tokens: the plan's target.
        cap: the dataset's ``max_tokens``.
        mean: the upper bound of the mean output length, once known.
        spread: the margin's coefficient of ``sqrt(N)``.
    """

    max_requests: int | None = None
    target_output_tokens: int | None = None
    cap: int = 1
    mean: float | None = None
    spread: float = 0.0


@dataclass(frozen=True, slots=True)
class FleetTally:
    """One dataset's progress over the whole fleet (every worker, every run).

    Attributes:
        total: prompts enqueued (valid lines of the inputs).
        completed: prompts completed (each counted once).
        output_tokens: their completion tokens.
        prompt_tokens: their prompt tokens.
        cost_units: their cost in integer picodollars.
        duplicates: completions of an already completed prompt (merge drops them).
        parked: prompts that failed for good this run (re-queued by the next run).
        in_flight: claimed by a worker and not completed.
        queued: not yet claimed.
        bad_lines: input lines the loader skipped.
    """

    total: int = 0
    completed: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    cost_units: int = 0
    duplicates: int = 0
    parked: int = 0
    in_flight: int = 0
    queued: int = 0
    bad_lines: int = 0

    @property
    def cost(self) -> Decimal:
        """The cost of the completed prompts in USD."""
        return from_units(self.cost_units)

    @property
    def remaining(self) -> int:
        """Prompts not completed (queued, in flight, or parked)."""
        return self.queued + self.in_flight + self.parked


@dataclass(frozen=True, slots=True)
class FleetProgress:
    """A snapshot of the whole fleet's work.

    Attributes:
        datasets: each dataset's tally, in plan order.
        loaded: every prompt of the plan has been enqueued.
        workers: workers that were heard from within the idle timeout.
    """

    datasets: Mapping[str, FleetTally] = field(default_factory=dict)
    loaded: bool = False
    workers: int = 0

    @property
    def drained(self) -> bool:
        """Nothing left to claim or in flight (parked failures aside)."""
        return self.loaded and all(t.queued + t.in_flight == 0 for t in self.datasets.values())


def encode_prompt(prompt: Prompt) -> str:
    """A prompt as a stream entry stores it (short keys: a fleet holds millions)."""
    fields = {
        "m": prompt.messages,
        "md": prompt.metadata,
        "src": str(prompt.source),
        "ln": prompt.line,
        "loc": prompt.location,
    }
    if prompt.request_fields:
        fields["rq"] = prompt.request_fields
    return _dumps(fields)


def decode_item(dataset: str, entry_id: str, fields: Mapping[str, str]) -> WorkItem:
    """The claimed prompt of stream entry ``entry_id`` (``fields``: the entry's)."""
    data = json.loads(fields["p"])
    prompt = Prompt(
        fields["id"],
        data["m"],
        data["md"],
        Path(data["src"]),
        data["ln"],
        data["loc"],
        data.get("rq", {}),
    )
    return WorkItem(dataset, prompt, entry_id, int(fields.get("n", 0)))


def read_tally(
    tally: Mapping[str, str], *, in_flight: int, length: int, bad_lines: int
) -> FleetTally:
    """A dataset's :class:`FleetTally` from its tally hash, pending count and stream length."""
    return FleetTally(
        total=int(tally.get("total", 0)),
        completed=int(tally.get("completed", 0)),
        output_tokens=int(tally.get("out", 0)),
        prompt_tokens=int(tally.get("in", 0)),
        cost_units=int(tally.get("cost", 0)),
        duplicates=int(tally.get("duplicates", 0)),
        parked=int(tally.get("parked", 0)),
        in_flight=in_flight,
        queued=max(length - in_flight, 0),
        bad_lines=bad_lines,
    )
